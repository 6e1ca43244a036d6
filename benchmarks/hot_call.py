"""The hot call: `pj.jit` on device-resident inputs against `jax.jit` calling
its exact-shape programs, on both call paths, each in its own process.

The seed likelihood `jnp.sum(-0.5*(x-mu)**2) - 0.5*x.shape[0]*jnp.log(2*jnp.pi)`
on `jax.device_put` inputs, four sizes cycling in one bucket, two ways:

* "in its bucket": hot shapes never buy their own program
  (`polyjit/_jit/hot_shapes.py`, `RENT` infinite), so `pj.jit` runs one
  program for the four sizes, `jax.jit` four: what a call costs for shapes
  that come back too rarely to pay for a compile (after warm-up: on the
  accelerator path, until each size's pad program is bought,
  `polyjit/_jit/resident.py`);
* "hot shapes bought": the defaults, after warm-up until each size's calls
  have paid for its own program (thousands of calls each): what a call
  costs in a loop over a few shapes.

Best of five rounds of 2,000 calls each, the functions interleaved round by
round in one process. Each round ends by waiting for its last result. The
figure is the ratio (`pj.jit`'s time a call over `jax.jit`'s), which a shared
machine's load moves less than the times themselves. On a loaded machine the
wall-clock ratio still swings (a run waits for the CPU in either function), so
the calling thread's CPU time a call (`time.thread_time`: what dispatch
costs, without the waits) is printed too, with its ratio.

    python benchmarks/hot_call.py            # both paths, one process each
    python benchmarks/hot_call.py --path     # this process's path only

Paths: "defaults" (polyjit's inline CPU client on a CPU) and "accelerator"
(`POLYJIT_INLINE_CPU=0`: the path a GPU or TPU takes, run on the CPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

SIZES = (900, 1000, 950, 1020)   # one bucket (1024) under every policy
ROUNDS, CALLS = 5, 2000
WARM_UP = 200_000                # calls at most, until the hot shapes are bought


def measure() -> list[str]:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import polyjit as pj
  from polyjit._jit import hot_shapes, resident

  def loglik(x, mu):
    return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)

  rng = np.random.default_rng(0)
  xs = [jax.device_put(rng.standard_normal(n).astype(np.float32)) for n in SIZES]
  mu = jax.device_put(np.float32(0.1))
  ref = jax.jit(loglik)
  rent = hot_shapes.RENT
  hot_shapes.RENT = float("inf")   # (read when a plan is first kept: this one never buys)
  in_bucket = pj.jit(loglik, buckets=pj.buckets.PowersOfTwo())
  for i in range(5000):  # warm-up: compiles, plans, sizes on the device
    for x in xs:
      jax.block_until_ready((in_bucket(x, mu), ref(x, mu)))
    # (the accelerator path: until each size's pad program is bought, `resident.py`)
    if i >= 10 and (not resident.accelerator_path() or len(resident._pads) >= len(xs)):
      break
  hot_shapes.RENT = rent
  bought = pj.jit(loglik, buckets=pj.buckets.PowersOfTwo())
  t0, calls = time.perf_counter(), 0
  while calls < WARM_UP:
    for x in xs:
      jax.block_until_ready(bought(x, mu))
    calls += len(xs)
    if sum(p.exact_call is not None for p in bought._hot.values()) >= len(xs):
      break
  warm = (f"{calls} calls ({time.perf_counter() - t0:.1f} s) until the {len(xs)} shapes "
          f"bought their programs")
  for f in (in_bucket, bought):
    for x in xs:
      np.testing.assert_allclose(np.asarray(f(x, mu)), np.asarray(ref(x, mu)), rtol=1e-5)

  def timed(fn) -> tuple[float, float]:
    out = None
    t, c = time.perf_counter(), time.thread_time()
    for i in range(CALLS // len(xs)):
      for x in xs:
        out = fn(x, mu)
    jax.block_until_ready(out)
    return ((time.perf_counter() - t) / CALLS * 1e6, (time.thread_time() - c) / CALLS * 1e6)

  best = {"bucket": float("inf"), "bought": float("inf"), "jax": float("inf")}
  cpu = dict(best)
  for _ in range(ROUNDS):
    for name, fn in (("bucket", in_bucket), ("bought", bought), ("jax", ref)):
      wall, thread = timed(fn)
      best[name] = min(best[name], wall)
      cpu[name] = min(cpu[name], thread)
  path = "accelerator (POLYJIT_INLINE_CPU=0)" if os.environ.get("POLYJIT_INLINE_CPU") == "0" \
      else "defaults"
  lines = []
  for name, label in (("bucket", "in its bucket"), ("bought", "hot shapes bought")):
    lines.append(
        f"{path}, {label}: pj.jit {best[name]:.1f} us, jax.jit {best['jax']:.1f} us a call: "
        f"{best[name] / best['jax']:.2f}x (calling thread's CPU: {cpu[name]:.1f} us, "
        f"{cpu['jax']:.1f} us: {cpu[name] / cpu['jax']:.2f}x)")
  return lines + [f"{path}: warm-up {warm}"]


def main() -> None:
  if "--path" in sys.argv:
    print("\n".join(measure()))
    return
  for inline in ("1", "0"):
    env = dict(os.environ, POLYJIT_INLINE_CPU=inline, POLYJIT_NO_CACHE="1")
    out = subprocess.run([sys.executable, __file__, "--path"], capture_output=True, text=True,
                         env=env)
    print(out.stdout.strip() or out.stderr.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
  main()
