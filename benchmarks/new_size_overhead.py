"""polyjit's own work per call for never-seen sizes in a compiled bucket: the
bucket's compiled program is replaced by a stub returning a ready array, so
what is timed is everything pj.jit does around the program (signature,
plan, host padding, size scalars, cost-aware bookkeeping). Under the default
policy the accounts keep being paid but never buy a bucket (no compile is
timed). Target (issue 25): at most 15 us.

    python benchmarks/new_size_overhead.py [auto|explicit]
"""
import os, sys, time, gc
os.environ["POLYJIT_NO_CACHE"] = "1"
import numpy as np, jax, jax.numpy as jnp
import polyjit as pj
def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)
mode = sys.argv[1] if len(sys.argv) > 1 else "auto"
f = (pj.jit(loglik) if mode == "auto" else
     pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[16384]))
mu, ls = np.float32(0.1), np.float32(0.2)
rng = np.random.default_rng(0)
xs = {n: rng.standard_normal(n).astype(np.float32) for n in range(100, 10100)}
f(xs[9000], mu, ls); f(xs[100], mu, ls); f(xs[101], mu, ls)
out = jnp.float32(0.0)
for struct in f._structures.values():
  for t in struct.templates.values():
    t.plan.program = lambda *a: out
  if struct.rental is not None:  # accounts keep paying, but never buy (no compile timed)
    struct.rental.compile_estimate = float("inf")
gc.disable()
ns = list(range(200, 8200))
t, c = time.perf_counter(), time.process_time()
for n in ns:
  f(xs[n], mu, ls)
wall, cpu = (time.perf_counter() - t) / len(ns), (time.process_time() - c) / len(ns)
t = time.perf_counter()
for n in ns:
  buf = np.zeros(16384 if mode != "auto" else 32768, np.float32); buf[:n] = xs[n]
pad = (time.perf_counter() - t) / len(ns)
assert not any(e.cause.kind == "bucket" and e.cause.reason and "waste" in e.cause.reason
               for e in f.stats.compile_events), "a compile was timed"
print(f"{mode}: polyjit's own work per never-seen size: {wall * 1e6:.1f} us wall, "
      f"{cpu * 1e6:.1f} us CPU; of which a host pad alone would be {pad * 1e6:.1f} us")
