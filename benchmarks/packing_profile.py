"""Where a packed training step's time goes, kernel by kernel, against the hand-packed one.

    python benchmarks/packing_profile.py [--model attention|mlp|text] [--steps 16] [--reps 3]
                                         [--top 25] [--json FILE]

The packed step and the hand-packed step of `benchmarks/packing.py` (same
batches, same parameters) run `--reps` passes over `--steps` batches each,
interleaved, each pass under `jax.profiler.trace`; the trace's XLA:CPU kernels (thunks: fusions,
dots, conditionals, copies) are summed per family (the kernel's name without
its number: `ynn_fusion`, `dot`, `multiply_select_fusion`, ...), per step.
Printed: the kernels and microseconds per step of each, and the families
whose time differs most. The profiler slows every kernel and the machine's
load moves them all, so read the differences, not the totals; the step times
to compare are `benchmarks/packing.py`'s.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import warnings

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polyjit as pj  # noqa: E402
import packing as bench  # noqa: E402

#: Trace events that are not kernels (the runtime's own spans, Python frames).
NOT_KERNELS = ("ThunkExecutor", "$", "PjitFunction", "CommonPjRt", "SlinkyThreadPool",
               "end:", "Threadpool", "ParseArguments", "AllocateOutputBuffers",
               "PythonRefManager", "Handle ")


def steps(model: str, n_steps: int):
  """{'packed': (step, inputs), 'hand': (step, inputs)} and the parameters."""
  init, one, hand = bench.model(model)
  params = init(jax.random.PRNGKey(0))
  data, labels = bench.example_data(bench.sst2_batches(n_steps, 64))
  packed = [pj.Ragged.from_list(d, packing=pj.Packing(row_length=bench.ROW)) for d in data]
  return {"packed": (bench.training_step(bench.vmapped_loss(one)),
                     list(zip(packed, labels, strict=True))),
          "hand": (bench.training_step(hand), bench.hand_inputs(packed, labels))}, params


def warm(step, inputs, params):
  for x in inputs:   # compiled and warm before any trace
    params, _ = step(params, *x)
  jax.block_until_ready(params)


def kernel_times(step, inputs, params) -> tuple[collections.Counter, collections.Counter]:
  """Microseconds and calls of each kernel family over one pass of the batches."""
  with tempfile.TemporaryDirectory() as where:
    with jax.profiler.trace(where, create_perfetto_trace=True):
      for x in inputs:
        params, _ = step(params, *x)
      jax.block_until_ready(params)
    trace = json.load(gzip.open(glob.glob(f"{where}/**/*.trace.json.gz", recursive=True)[0]))
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  time: collections.Counter = collections.Counter()
  calls: collections.Counter = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name.startswith(NOT_KERNELS) or " " in name:
      continue
    family = re.sub(r"[.\d]+(\.clone)?$", "", name)
    time[family] += e.get("dur", 0)
    calls[family] += 1
  return time, calls


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="attention", choices=("attention", "mlp", "text"))
  ap.add_argument("--steps", type=int, default=16)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--top", type=int, default=25)
  ap.add_argument("--json")
  args = ap.parse_args(argv)
  warnings.simplefilter("ignore", pj.PerformanceWarning)
  contenders, params = steps(args.model, args.steps)
  totals = {key: (collections.Counter(), collections.Counter()) for key in contenders}
  for step, inputs in contenders.values():
    warm(step, inputs, params)
  for r in range(args.reps):   # interleaved: a change of load reaches both
    for key in (("packed", "hand") if r % 2 == 0 else ("hand", "packed")):
      time, calls = kernel_times(*contenders[key], params)
      totals[key][0].update(time)
      totals[key][1].update(calls)
  n = args.reps * args.steps
  (pt, pc), (ht, hc) = [({k: v / n for k, v in t.items()}, {k: v / n for k, v in c.items()})
                        for t, c in (totals["packed"], totals["hand"])]
  print(f"{args.model}: kernels per step packed {sum(pc.values()):.0f}, hand "
        f"{sum(hc.values()):.0f}; kernel us per step packed {sum(pt.values()):.0f}, "
        f"hand {sum(ht.values()):.0f} (under the profiler)")
  families = sorted(set(pt) | set(ht), key=lambda k: -abs(pt.get(k, 0) - ht.get(k, 0)))
  print(f"{'family':34s} {'packed us':>10s} {'calls':>6s} {'hand us':>10s} {'calls':>6s} "
        f"{'packed-hand':>12s}")
  for k in families[:args.top]:
    print(f"{k:34s} {pt.get(k, 0):10.1f} {pc.get(k, 0):6.1f} {ht.get(k, 0):10.1f} "
          f"{hc.get(k, 0):6.1f} {pt.get(k, 0) - ht.get(k, 0):12.1f}")
  out = {"model": args.model, "steps": args.steps, "reps": args.reps,
         "packed": {"us": pt, "calls": pc}, "hand": {"us": ht, "calls": hc}}
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
