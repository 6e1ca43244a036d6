"""The seed's JIT-tutorial cases, timed, with what polyjit's diagnostics say.

* `selu` on a million values: eager op-by-op against `jax.jit`;
* a loop that calls a jitted function 20 times: the jitted function re-created
  in the loop (`functools.partial`, `lambda`) against one created once. Each
  variant runs under `pj.watch()`, whose report names the re-created function
  and the fix (create it once), and counts the compiles.

    python benchmarks/jit_tutorial.py [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import os  # noqa: E402
# Cold runs: no programs from an earlier run on disk (horizons.py measures warm ones;
# POLYJIT_NO_CACHE=0 turns polyjit's default on-disk cache back on).
os.environ.setdefault("POLYJIT_NO_CACHE", "1")
import polyjit as pj


def selu(x, alpha=1.67, lambda_=1.05):
  return lambda_ * jnp.where(x > 0, x, alpha * jnp.exp(x) - alpha)


def unjitted_loop_body(prev_i):
  return prev_i + 1


def loop_partial(x, n):
  i = 0
  while i < n:
    i = jax.jit(functools.partial(unjitted_loop_body))(i)
  return x + i


def loop_lambda(x, n):
  i = 0
  while i < n:
    i = jax.jit(lambda x: unjitted_loop_body(x))(i)
  return x + i


def loop_cached(x, n):
  i = 0
  while i < n:
    i = jax.jit(unjitted_loop_body)(i)
  return x + i


def best(fn, repeats=7) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return min(times)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args(argv)

  x = jnp.arange(1_000_000, dtype=jnp.float32)
  jitted = jax.jit(selu)
  jax.block_until_ready(selu(x))
  jax.block_until_ready(jitted(x))
  selu_rows = {"eager": best(lambda: selu(x)), "jax.jit": best(lambda: jitted(x))}

  loop_rows = {}
  for name, fn in (("jit(partial) in the loop", loop_partial),
                   ("jit(lambda) in the loop", loop_lambda),
                   ("jit created once (cached)", loop_cached)):
    fn(10, 20)  # warm what can be warmed
    with pj.watch() as report:
      seconds = best(lambda: fn(10, 20), repeats=3)
    compiles = sum(f.compiles for f in report.functions.values())
    advice = [f.suggestion() for f in report.functions.values() if f.new_objects > 1]
    loop_rows[name] = {"seconds": seconds, "compiles_in_3_runs": compiles, "watch_advice": advice}

  print(f"selu on 1e6 values: eager {selu_rows['eager'] * 1e3:.2f} ms, jax.jit "
        f"{selu_rows['jax.jit'] * 1e3:.2f} ms ({selu_rows['eager'] / selu_rows['jax.jit']:.1f}x)")
  cached = loop_rows["jit created once (cached)"]["seconds"]
  for name, r in loop_rows.items():
    print(f"{name:<28} {r['seconds'] * 1e3:9.2f} ms  {r['seconds'] / cached:7.1f}x  "
          f"{r['compiles_in_3_runs']:3d} compiles in 3 runs")
    for a in r["watch_advice"]:
      print(f"    pj.watch: {a}")
  result = {"selu_s": selu_rows, "loop": loop_rows}
  if opts.json:
    with open(opts.json, "w") as fh:
      json.dump(result, fh, indent=1)
  return result


if __name__ == "__main__":
  main()
