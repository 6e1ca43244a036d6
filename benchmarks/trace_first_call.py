"""What polyjit does before a first call: the trace + mask of a fresh masked function.

For the workloads of `mask_overhead.py` (seed log-likelihood at 8192, attention
and a scan RNN at 512) and a Flax transformer block (`trace_scope.py`), the
median over `--repeats` of

  masked     `jax.make_jaxpr` of a fresh `pj.mask(f)` called with traced sizes
             (symbolic trace in a fresh scope, masked evaluation, size guard);
  jax        `jax.make_jaxpr(f)` at the same shapes (JAX's caches warm);
  jax new    `jax.make_jaxpr(f)` at shapes JAX has not traced (its jnp helpers
             retrace, as in every masked trace: what jax.jit pays per new size),

in process CPU time (`time.process_time`: a shared machine's other processes
do not count) and wall time, interleaved. Compare two trees by running it with
each on PYTHONPATH, in turn:

    PYTHONPATH=. python benchmarks/trace_first_call.py [--repeats 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("POLYJIT_NO_CACHE", "1")
import jax  # noqa: E402
import numpy as np  # noqa: E402

import polyjit as pj  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mask_overhead import workloads  # noqa: E402
from trace_scope import flax_block  # noqa: E402


def timed(fn):
  c, w = time.process_time(), time.perf_counter()
  fn()
  return time.process_time() - c, time.perf_counter() - w


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=30)
  p.add_argument("--json")
  a = p.parse_args()
  rows = [(name, f, specs, args) for name, f, specs, args in workloads(False)]
  try:
    fun, args, specs = flax_block()
    rows.append(("flax block", fun, specs, list(args)))
  except ImportError:
    print("(flax not installed: the block is skipped)")
  out = {}
  for name, f, specs, args in rows:
    lead = args[0]
    env = {"n": np.int32(max(1, lead.shape[0] * 3 // 4))}
    grow = iter(range(lead.shape[0] + 1, lead.shape[0] + 10 * a.repeats + 10))

    def masked():
      jax.make_jaxpr(lambda xs, e: pj.mask(f, specs)(xs, e))(list(args), env)

    def plain():
      jax.make_jaxpr(lambda *xs: f(*xs))(*args)

    def new_size():
      m = next(grow)
      grown = [np.resize(lead, (m, *lead.shape[1:])), *args[1:]]
      jax.make_jaxpr(lambda *xs: f(*xs))(*grown)

    kinds = {"masked": masked, "jax": plain, "jax new": new_size}
    for fn in kinds.values():  # JAX's and polyjit's one-time work, untimed
      fn()
    times: dict[str, list] = {k: [] for k in kinds}
    for _ in range(a.repeats):
      for k, fn in kinds.items():
        times[k].append(timed(fn))
    med = {k: (statistics.median(c for c, _ in v) * 1e3, statistics.median(w for _, w in v) * 1e3)
           for k, v in times.items()}
    out[name] = med
    print(f"{name:14s} CPU ms: masked {med['masked'][0]:6.2f}  jax {med['jax'][0]:5.2f} "
          f"({med['masked'][0] / med['jax'][0]:4.1f}x)  jax new size {med['jax new'][0]:5.2f} "
          f"({med['masked'][0] / med['jax new'][0]:4.1f}x) | wall ms: masked {med['masked'][1]:6.2f}"
          f"  jax {med['jax'][1]:5.2f}  jax new size {med['jax new'][1]:5.2f}", flush=True)
  if a.json:
    with open(a.json, "w") as fh:
      json.dump({"jax": jax.__version__, "repeats": a.repeats, "cpu_wall_ms": out}, fh, indent=1)


if __name__ == "__main__":
  main()
