"""A run-time-dominated workload: the cost-aware policy against fixed bucket policies.

An MLP (three `width x width` layers, tanh) over a batch of rows whose count
changes on every call, uniform in [1, max_rows]: each call's work grows with
its padded row count, so padding costs real time and tight buckets pay for
their compile quickly. In one run, on the same calls:

* `pj.jit` with its default, `pj.buckets.CostAware()` (compiles a bucket
  with headroom, then tighter ones once their estimated waste pays for them),
  and `CostAware(estimates="measured")` (timed costs, background compiles);
* `pj.jit` with each fixed policy: powers of two, geometric 1.5 and 1.25,
  multiples of max_rows/8;
* `jax.jit` (one compile per distinct row count) for scale.

Reported: total seconds (wall and process CPU, steadier on a shared
machine), compiles, and each policy's ratio to the best fixed policy.
Target (issue 12): the cost-aware policy within 1.1x of the best fixed one.
The issue's workload is width 4096 over up to 4096 rows; the defaults here
are smaller (width 1024, up to 1024 rows) so that it runs in minutes on 2 CPU
cores; pass `--width 4096 --max-rows 4096` on a larger machine.

    python benchmarks/runtime_dominated.py [--width 1024] [--max-rows 1024]
        [--calls 150] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import os  # noqa: E402
# Cold runs: no programs from an earlier run on disk (horizons.py measures warm ones;
# POLYJIT_NO_CACHE=0 turns polyjit's default on-disk cache back on).
os.environ.setdefault("POLYJIT_NO_CACHE", "1")
import polyjit as pj


def mlp(x, layers):
  for w in layers:
    x = jnp.tanh(x @ w)
  return jnp.sum(x, axis=0)


def policies(max_rows: int) -> dict:
  return {
      "CostAware()": pj.buckets.CostAware(),
      "CostAware(measured)": pj.buckets.CostAware(estimates="measured"),
      "PowersOfTwo()": pj.buckets.PowersOfTwo(),
      "Geometric(1.5)": pj.buckets.Geometric(1.5),
      "Geometric(1.25)": pj.buckets.Geometric(1.25),
      f"Multiples({max(max_rows // 8, 1)})": pj.buckets.Multiples(max(max_rows // 8, 1)),
  }


def run(fn, data, layers) -> dict:
  with pj.diagnostics.count_compiles() as compiles:
    wall, cpu = time.perf_counter(), time.process_time()
    outs = [np.asarray(fn(x, layers)) for x in data]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  return {"total_s": wall, "cpu_s": cpu, "compiles": len(compiles),
          "compile_s": sum(c.seconds for c in compiles), "outs": outs}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=1024)
  parser.add_argument("--max-rows", type=int, default=1024)
  parser.add_argument("--calls", type=int, default=150)
  parser.add_argument("--jax-jit", action="store_true", help="also run jax.jit (slow)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args(argv)

  rng = np.random.default_rng(opts.seed)
  w = opts.width
  layers = [jnp.asarray(rng.standard_normal((w, w)).astype(np.float32) / np.sqrt(w))
            for _ in range(3)]
  rows = rng.integers(1, opts.max_rows + 1, opts.calls)
  data = [rng.standard_normal((n, w)).astype(np.float32) for n in rows]

  results = {}
  for name, policy in policies(opts.max_rows).items():
    f = pj.jit(mlp, polymorphic_shapes=["(n, _)", None], buckets=policy)
    results[name] = run(f, data, layers)
    results[name]["padding_waste"] = pj.stats(f).padding_waste
    if name.startswith("CostAware"):
      results[name]["explain"] = pj.explain(f)
  if opts.jax_jit:
    results["jax.jit"] = run(jax.jit(mlp), data, layers)
  reference = results["PowersOfTwo()"]["outs"]
  for r in results.values():
    outs = r.pop("outs")
    r["max_abs_diff"] = float(max(np.max(np.abs(o - e)) for o, e in zip(outs, reference)))
  fixed = [n for n in results if not n.startswith(("CostAware", "jax.jit"))]
  best = min(fixed, key=lambda n: results[n]["cpu_s"])
  for r in results.values():
    r["vs_best_fixed_cpu"] = r["cpu_s"] / results[best]["cpu_s"]
    r["vs_best_fixed_wall"] = r["total_s"] / min(results[n]["total_s"] for n in fixed)

  print(f"MLP width {w}, {opts.calls} calls, rows uniform in [1, {opts.max_rows}] "
        f"({len(set(rows.tolist()))} distinct)")
  print(f"{'policy':<21}{'wall s':>8}{'cpu s':>8}{'compiles':>10}{'compile s':>11}"
        f"{'vs best fixed (cpu)':>21}{'(wall)':>8}")
  for name, r in results.items():
    print(f"{name:<21}{r['total_s']:>8.2f}{r['cpu_s']:>8.2f}{r['compiles']:>10}"
          f"{r['compile_s']:>11.2f}{r['vs_best_fixed_cpu']:>20.2f}x{r['vs_best_fixed_wall']:>7.2f}x")
  print(results["CostAware()"]["explain"])
  if opts.json:
    meta = {"jax": jax.__version__, "machine": platform.machine(), "width": w,
            "max_rows": opts.max_rows, "calls": opts.calls, "best_fixed": best,
            "distinct_rows": len(set(rows.tolist()))}
    with open(opts.json, "w") as fh:
      json.dump({"meta": meta, "rows": results}, fh, indent=1)
  return results


if __name__ == "__main__":
  main()
