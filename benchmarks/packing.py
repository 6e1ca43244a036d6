"""Packing against padding: training steps on SST-2's sentence lengths.

    python benchmarks/packing.py [--steps 20] [--repeats 3] [--models mlp,attention,text]
                                 [--out FILE] [--smoke]

Batches of 64 random SST-2 sentences (`sst2_batches.SST2_TRAIN_LENGTHS`, token
ids random). Per model, in one run and on the same batches and parameters:

  unpacked   `pj.vmap(loss)` over `pj.Ragged.from_list(batch)`: each example
             padded to the bucket of the batch's longest (powers of two)
  packed     `pj.vmap(loss)` over `pj.Ragged.from_list(batch, packing=
             pj.Packing(row_length=64))`: the same per-example function
  groups     `pj.vmap(loss)` over `pj.Ragged.from_list(batch, groups=
             pj.LengthGroups())`: polyjit's length grouping (a few padded
             blocks by length, one `LengthGroups` object for every batch)
  hand       the same model written by hand on the packed rows with segment
             ids, the Grain/MaxText way (`training_models.py`'s `packed`:
             block-diagonal attention masks from the segment ids, positions
             per segment, LSTM carries reset at segment starts, pooling with
             `jax.ops.segment_sum`), fed the planner's layout
  hand_again the hand-packed step compiled a second time: a control, its
             ratio to `hand` is what the machine's noise alone makes of two
             identical programs (`hand_again_over_hand_*`)

A step is `jax.jit(value_and_grad(mean loss))` plus an SGD update. Each
approach first runs every batch once (compiling its programs), then
`--repeats` timed passes over all batches run, the contenders' passes
interleaved, each pass in a rotated order (so a change of load on a shared
machine reaches all of them); the per-step time is the fastest pass's mean
(wall and CPU apart). Paired figures (`*_paired_median`): the ratio of two
contenders within each pass, its median over the passes.
The losses and gradients of packed and unpacked are compared on the first
batch (they must agree). Also reported: efficiency (real tokens over stored
tokens) and the host time to build a batch (the packing planner included),
and the planner alone on 1,000 examples.

Models: `mlp` (embedding, a per-token MLP, mean pooling, a dense head: defined
here), `attention` (`training_models.attention_model`: a transformer
encoder), `text` (`training_models.text_model`: a bidirectional LSTM, a
`lax.scan` over the tokens, both directions, with attention pooling).

Ratios reported per model: `packed_over_unpacked`, `packed_over_hand`,
`packed_over_groups` (wall and process CPU time), and XLA's cost analysis of
the packed and the hand-packed step on the first batch (`flops_*`, `bytes_*`,
`packed_over_hand_flops`/`_bytes`: what the compiled programs do, a figure
the machine's load cannot move). `--smoke` runs 2 steps of
batches of 8 (a check that the script runs, no figures).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polyjit as pj  # noqa: E402
from polyjit._ragged.packing import plan_rows  # noqa: E402
from sst2_batches import SST2_TRAIN_LENGTHS  # noqa: E402
import training_models as tm  # noqa: E402

VOCAB, WIDTH, HIDDEN, ROW = 1000, 64, 256, 64


def sst2_batches(steps: int, batch: int, seed: int = 0) -> list[list[int]]:
  lengths = np.repeat(np.array(list(SST2_TRAIN_LENGTHS)),
                      np.array(list(SST2_TRAIN_LENGTHS.values())))
  rng = np.random.default_rng(seed)
  return [rng.choice(lengths, batch).tolist() for _ in range(steps)]


def mlp_model():
  def init(key):
    k = jax.random.split(key, 4)
    s = lambda key, shape: jax.random.normal(key, shape) / np.sqrt(shape[0])
    return {"embed": jax.random.normal(k[0], (VOCAB, WIDTH)) * 0.1,
            "up": s(k[1], (WIDTH, HIDDEN)), "down": s(k[2], (HIDDEN, WIDTH)),
            "out": s(k[3], (WIDTH, 1)), "b": jnp.zeros(HIDDEN)}

  def one(params, tokens, label):
    h = params["embed"][tokens]
    h = h + jax.nn.gelu(h @ params["up"] + params["b"]) @ params["down"]
    pooled = jnp.mean(h, axis=0)
    return tm.bce((jnp.tanh(pooled) @ params["out"])[0], label)

  def hand(params, tokens, segments, positions, labels):
    """The packed rows by hand: `segments` (rows, ROW) holds each token's
    example, `len(labels)` on the tail."""
    h = params["embed"][tokens.reshape(-1)]
    h = h + jax.nn.gelu(h @ params["up"] + params["b"]) @ params["down"]
    pooled = tm.segment_mean(h, segments.reshape(-1), labels.shape[0])
    logits = (jnp.tanh(pooled) @ params["out"])[:, 0]
    return jnp.mean(tm.bce(logits, labels))

  return init, one, hand


def model(name: str):
  if name == "mlp":
    return mlp_model()
  if name == "attention":
    m = tm.attention_model(VOCAB, WIDTH, 4, 2, 3, 54)
  else:
    m = tm.text_model(VOCAB, WIDTH, WIDTH, 3, 54)
  return m.init, m.one, m.packed


def sgd(params, grads):
  return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def warm(step, params, inputs):
  """Runs every batch once (compiling every program); whether every loss and
  the parameters after it are finite (a NaN would make the timings moot)."""
  finite = True
  for x in inputs:
    params, loss = step(params, *x)
    finite = finite and bool(jnp.isfinite(loss))
  return finite and all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(params))


def timed(step, params, inputs):
  """Per step: (wall seconds, process CPU seconds) of one pass over the
  batches. CPU time, XLA's threads included, is the steadier figure on a
  machine that others share."""
  start, cpu = time.perf_counter(), time.process_time()
  for x in inputs:
    params, loss = step(params, *x)
  jax.block_until_ready(params)
  return ((time.perf_counter() - start) / len(inputs),
          (time.process_time() - cpu) / len(inputs))


def _build(data, **kwargs):
  t = time.perf_counter()
  batches = [pj.Ragged.from_list(d, **kwargs) for d in data]
  return batches, (time.perf_counter() - t) / len(data) * 1e3


def example_data(batches: list[list[int]]) -> tuple[list, list]:
  """Per batch: its examples (random token ids of the batch's lengths), its labels."""
  rng = np.random.default_rng(1)
  data = [[(rng.integers(0, VOCAB, n).astype(np.int32),) for n in b] for b in batches]
  labels = [jnp.asarray(rng.integers(0, 2, len(b)).astype(np.float32)) for b in batches]
  return data, labels


def vmapped_loss(one):
  """The mean over a batch of `one(params, tokens, label)` under `pj.vmap`."""
  return lambda p, batch, y: pj.vmap(lambda p, ex, l: one(p, ex[0], l),
                                     in_axes=(None, 0, 0))(p, batch, y).mean()


def training_step(loss):
  """`jax.jit` of one SGD step on `loss(params, *inputs)`: (new params, loss)."""
  return jax.jit(lambda p, *x: (lambda lg: (sgd(p, lg[1]), lg[0]))(
      jax.value_and_grad(loss)(p, *x)))


def hand_inputs(packed, labels) -> list:
  """The hand-packed step's inputs from the planner's layout: tokens, segment
  ids and positions as (rows, row_length), labels."""
  rows = lambda b, a: jnp.reshape(a, (b.rows, b.row_length))  # noqa: E731
  return [(b.data[0], rows(b, b.segments), rows(b, b.positions), y)
          for b, y in zip(packed, labels, strict=True)]


def run_model(name: str, batches: list[list[int]], repeats: int = 3) -> dict:
  init, one, hand = model(name)
  params = init(jax.random.PRNGKey(0))
  data, labels = example_data(batches)
  loss_of = vmapped_loss(one)
  grad_step = jax.jit(jax.value_and_grad(loss_of))
  step = training_step(loss_of)

  unpacked, build_unpacked = _build(data)
  packed, build_packed = _build(data, packing=pj.Packing(row_length=ROW))
  grouped, build_grouped = _build(data, groups=pj.LengthGroups())
  result = {
      "efficiency_unpacked": float(np.mean([b.efficiency for b in unpacked])),
      "efficiency_packed": float(np.mean([b.efficiency for b in packed])),
      "efficiency_groups": float(np.mean([   # real over stored, over the blocks
          sum(int(np.sum(k.lengths)) for k in b.blocks)
          / sum(k.batch_size * k.padded_lengths[0] for k in b.blocks) for b in grouped])),
      "build_ms_unpacked": build_unpacked, "build_ms_packed": build_packed,
      "build_ms_groups": build_grouped,
  }
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    (lu, gu), (lp, gp) = grad_step(params, unpacked[0], labels[0]), \
        grad_step(params, packed[0], labels[0])
  result["packed_runs_unpacked"] = any(issubclass(c.category, pj.PerformanceWarning)
                                       for c in caught)
  result["loss_difference"] = float(abs(lu - lp))
  result["grad_max_difference"] = float(max(
      jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(gu), jax.tree.leaves(gp),
                                               strict=True)))
  contenders = {"unpacked": (step, list(zip(unpacked, labels, strict=True))),
                "packed": (step, list(zip(packed, labels, strict=True))),
                "groups": (step, list(zip(grouped, labels, strict=True)))}
  if hand is not None:
    inputs = hand_inputs(packed, labels)
    contenders["hand"] = (training_step(hand), inputs)
    # the same hand-packed step compiled a second time: its ratio to `hand`
    # is what the machine's noise alone makes of two identical programs
    contenders["hand_again"] = (training_step(hand), inputs)
    lh, gh = jax.jit(jax.value_and_grad(hand))(params, *inputs[0])
    result["hand_loss_difference"] = float(abs(lh - lp))
    result["hand_grad_max_difference"] = float(max(
        jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(gh), jax.tree.leaves(gp),
                                                 strict=True)))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.PerformanceWarning)
    for key, (fun, inputs) in contenders.items():
      result[f"finite_{key}"] = warm(fun, params, inputs)
    for key in ("packed", "hand"):   # XLA's own count of the first batch's step: no load
      if key in contenders:
        fun, inputs = contenders[key]
        cost = fun.lower(params, *inputs[0]).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        result[f"flops_{key}"] = float(cost.get("flops", np.nan))
        result[f"bytes_{key}"] = float(cost.get("bytes accessed", np.nan))
    passes: dict[str, list[tuple[float, float]]] = {key: [] for key in contenders}
    order = list(contenders)
    for r in range(repeats):   # passes interleaved, each pass in a rotated order:
      for key in order[r % len(order):] + order[:r % len(order)]:   # load reaches all
        fun, inputs = contenders[key]
        passes[key].append(timed(fun, params, inputs))
    for key, times in passes.items():
      wall, cpu = np.min(np.array(times), axis=0)
      result[f"step_ms_{key}"], result[f"step_cpu_ms_{key}"] = wall * 1e3, cpu * 1e3
    # paired: the ratio within each pass (the contenders ran in the same
    # minute), then its median over the passes: steadier than min over min
    for num, den in (("packed", "hand"), ("hand_again", "hand")):
      if den in passes:
        ratios = np.array(passes[num]) / np.array(passes[den])
        result[f"{num}_over_{den}_paired_median"] = float(np.median(ratios[:, 0]))
        result[f"{num}_over_{den}_paired_median_cpu"] = float(np.median(ratios[:, 1]))
  if "bytes_hand" in result:
    for c in ("flops", "bytes"):
      result[f"packed_over_hand_{c}"] = result[f"{c}_packed"] / result[f"{c}_hand"]
  for t in ("ms", "cpu_ms"):
    if f"step_{t}_hand_again" in result:
      result[f"hand_again_over_hand_{t}"] = (result[f"step_{t}_hand_again"]
                                             / result[f"step_{t}_hand"])
    for other in ("unpacked", "hand", "groups"):
      if f"step_{t}_{other}" in result:
        result[f"packed_over_{other}_{t}"] = (result[f"step_{t}_packed"]
                                              / result[f"step_{t}_{other}"])
  return result


def planner_ms(examples: int = 1000, repeats: int = 200) -> tuple[float, float]:
  """The planner's wall and CPU time (ms) per plan of `examples` SST-2 lengths
  (CPU time: what it costs on a machine that others share)."""
  lengths = sst2_batches(1, examples, seed=3)[0]
  for _ in range(10):
    plan_rows(lengths, ROW)
  start, cpu = time.perf_counter(), time.process_time()
  for _ in range(repeats):
    plan_rows(lengths, ROW)
  return ((time.perf_counter() - start) / repeats * 1e3,
          (time.process_time() - cpu) / repeats * 1e3)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--models", default="mlp,attention,text")
  parser.add_argument("--out", default=None)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--smoke", action="store_true")
  args = parser.parse_args(argv)
  if args.smoke:
    args.steps, args.batch, args.repeats = 2, 8, 1
  batches = sst2_batches(args.steps, args.batch)
  results = {"device": str(jax.devices()[0]), "steps": args.steps, "batch": args.batch,
             "repeats": args.repeats,
             "row_length": ROW, "planner_ms_1000_examples": planner_ms(),
             "load_average": os.getloadavg()}
  for name in args.models.split(","):
    results[name] = run_model(name, batches, args.repeats)
    print(name, json.dumps(results[name], indent=1), flush=True)
  results["load_average_end"] = os.getloadavg()
  wall, cpu = results["planner_ms_1000_examples"]
  print(f"planner: {wall:.3f} ms wall, {cpu:.3f} ms CPU for 1,000 examples")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(results, f, indent=1)
  return results


if __name__ == "__main__":
  main()
