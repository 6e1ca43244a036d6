"""Data-parallel ragged training on 8 host devices, three ways, one run.

The scan RNN of `ragged_training.py`, trained with SGD on batches of `--batch` sequences whose
lengths are log-uniform in 10..512, the batch split over a 1-D mesh of 8
devices (`NamedSharding(mesh, P("data"))`, mesh axes Auto), parameters replicated:

  jax_jit        `jax.jit` of a hand-masked step (the RNN for one padded
                 sequence, its state frozen past the sequence's length,
                 `jax.vmap`ped over the batch), each batch padded to its own
                 longest sequence and put on the mesh: a compile per distinct
                 maximum.
  hand_buckets   the same, padded to the next power of two (at least 16):
                 what careful users write today.
  polyjit        the model written for one unpadded sequence, `pj.vmap` over
                 `pj.Ragged.from_list(xs, sharding=...)` inside `jax.jit`.

Reported: total time (host padding, compiles and steps), compiles (via
`jax.monitoring`), the largest gradient difference from jax_jit at the initial
parameters, and, after every bucket is compiled, a second pass whose per-step
times compare polyjit with hand_buckets on the same batches (the worst and
median ratio of a step). Sets XLA_FLAGS itself (8 host devices) unless
XLA_FLAGS is already set.

    python benchmarks/data_parallel.py [--steps 200] [--batch 64] [--compare-steps 50]
                                       [--json out.json]
"""

from __future__ import annotations

import os

# 8 host devices; on a loaded machine a device thread can wait past XLA's 40 s
# limit for a collective inside a loop, and XLA then aborts the process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_cpu_collective_call_terminate_timeout_seconds=900 "
                      "--xla_cpu_collective_timeout_seconds=900")

import argparse  # noqa: E402  (after XLA_FLAGS: JAX reads it when it starts)
import functools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

# Cold runs: no programs from an earlier run on disk (horizons.py measures warm ones;
# POLYJIT_NO_CACHE=0 turns polyjit's default on-disk cache back on).
os.environ.setdefault("POLYJIT_NO_CACHE", "1")
import polyjit as pj  # noqa: E402
from jax import lax  # noqa: E402
from ragged_training import (MODELS, _train_step, example_loss, init_params,  # noqa: E402
                             make_batches, pad_batch)

APPROACHES = ("jax_jit", "hand_buckets", "polyjit")


def hand_masked_example(params, x, length, y):
  """The RNN's loss on one padded sequence x: (padded, features), masked by hand.

  `jax.vmap`ped over the batch, as a data-parallel user writes it (a scan over a
  batch-major carry would make XLA gather the batch inside the loop)."""
  h = jnp.tanh(x @ params["embed"])

  def step(c, inputs):
    ht, t = inputs
    new = jnp.tanh(c @ params["rec"] + ht @ params["inp"])
    return jnp.where(t < length, new, c), None  # frozen past the sequence's end

  c, _ = lax.scan(step, jnp.zeros(h.shape[-1], h.dtype), (h, jnp.arange(x.shape[0])))
  return (c @ params["head"] - y) ** 2


def hand_masked_loss(params, x, lengths, ys):
  return jnp.mean(jax.vmap(hand_masked_example, in_axes=(None, 0, 0, 0))(params, x, lengths, ys))


class HandMaskedSharded:
  """The hand-masked step on the mesh; `bucket` picks the padded length."""

  def __init__(self, stages, bucket, sharding):
    self.bucket, self.sharding = bucket, sharding
    self.step = _train_step(hand_masked_loss)

  def __call__(self, params, xs, ys):
    x, lengths = pad_batch(xs, self.bucket(max(len(x) for x in xs)))
    put = functools.partial(jax.device_put, device=self.sharding)
    return self.step(params, put(x), put(lengths), put(ys))


class PolyjitSharded:
  def __init__(self, stages, sharding):
    self.sharding = sharding
    per_example = pj.vmap(functools.partial(example_loss, stages), in_axes=(None, 0, 0))
    self.step = _train_step(lambda params, batch, ys: per_example(params, batch, ys).mean())

  def __call__(self, params, xs, ys):
    batch = pj.Ragged.from_list(xs, sharding=self.sharding)
    return self.step(params, batch, jax.device_put(ys, self.sharding))


def make(name, stages, sharding):
  if name == "jax_jit":
    return HandMaskedSharded(stages, lambda n: n, sharding)
  if name == "hand_buckets":
    return HandMaskedSharded(stages, pj.buckets.PowersOfTwo(minimum=16), sharding)
  return PolyjitSharded(stages, sharding)


def train(approach, params, batches) -> dict:
  with pj.diagnostics.count_compiles() as compiles:
    t0 = time.perf_counter()
    for xs, ys in batches:
      # One step at a time: with several programs in flight, XLA's in-process
      # CPU collectives (8 device threads on few cores) can deadlock.
      params, loss, _ = jax.block_until_ready(approach(params, xs, ys))
    total = time.perf_counter() - t0
  return {"total_s": total, "compiles": len(compiles),
          "compile_s": sum(c.seconds for c in compiles), "final_loss": float(loss)}


def step_times(approach, params, batches) -> list[float]:
  """Each step's time once its program exists (host padding included)."""
  times = []
  for xs, ys in batches:
    t0 = time.perf_counter()
    jax.block_until_ready(approach(params, xs, ys))
    times.append(time.perf_counter() - t0)
  return times


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--model", default="rnn", choices=["rnn"])
  parser.add_argument("--features", type=int, default=8)
  parser.add_argument("--width", type=int, default=32)
  parser.add_argument("--check", type=int, default=3, help="batches whose gradients are compared")
  parser.add_argument("--compare-steps", type=int, default=50,
                      help="batches of the second (compiled) pass that time each step")
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args(argv)

  # Auto axes: on an Explicit mesh, JAX 0.10.2 itself fails to trace the hand-
  # masked step (a vmapped scan: "Resource axis: data ... is not found in mesh").
  mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
  sharding = NamedSharding(mesh, P("data"))
  stages = MODELS[opts.model]
  params0 = jax.device_put(init_params(opts.features, opts.width), NamedSharding(mesh, P()))
  batches = make_batches(opts.steps, opts.batch, 10, 512, opts.features, "log-uniform")
  print(f"{jax.device_count()} devices, model {opts.model}, {opts.steps} steps of "
        f"{opts.batch} sequences (log-uniform 10..512)", flush=True)

  rows, grads, approaches = {}, {}, {}
  for name in APPROACHES:
    approaches[name] = approach = make(name, stages, sharding)
    rows[name] = train(approach, params0, batches)
    grads[name] = [approach(params0, xs, ys)[2] for xs, ys in batches[:opts.check]]
    print(f"  {name:<13} total {rows[name]['total_s']:8.2f} s  compiles "
          f"{rows[name]['compiles']:4d} ({rows[name]['compile_s']:6.2f} s)", flush=True)
  for name, row in rows.items():
    diffs = [float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
             for gs, ws in zip(grads[name], grads["jax_jit"])
             for g, w in zip(jax.tree.leaves(gs), jax.tree.leaves(ws))]
    row["max_grad_abs_diff_vs_jax_jit"] = max(diffs)
  hand = step_times(approaches["hand_buckets"], params0, batches[:opts.compare_steps])
  ours = step_times(approaches["polyjit"], params0, batches[:opts.compare_steps])
  per_step = np.asarray(ours) / np.asarray(hand)
  result = {
      "jax_jit_over_polyjit": rows["jax_jit"]["total_s"] / rows["polyjit"]["total_s"],
      "hand_buckets_over_polyjit": rows["hand_buckets"]["total_s"] / rows["polyjit"]["total_s"],
      "compiled_step_polyjit_over_hand_max": float(per_step.max()),
      "compiled_step_polyjit_over_hand_median": float(np.median(per_step)),
      "compiled_pass_polyjit_over_hand": float(sum(ours) / sum(hand)),
  }
  for name, row in rows.items():
    print(f"  {name:<13} grad diff vs jax_jit {row['max_grad_abs_diff_vs_jax_jit']:.2e}")
  for key, value in result.items():
    print(f"  {key}: {value:.2f}x")
  if opts.json:
    meta = {"argv": argv, "devices": jax.device_count(), "platform": platform.platform(),
            "jax": jax.__version__, "opts": vars(opts)}
    with open(opts.json, "w") as fh:
      json.dump({"meta": meta, "approaches": rows, "ratios": result}, fh, indent=1)


if __name__ == "__main__":
  main()
