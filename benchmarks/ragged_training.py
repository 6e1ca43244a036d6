"""Ragged training: variable-length sequences, forward and backward, four ways.

Small sequence models (an RNN run with `lax.scan`; a one-layer attention
encoder; `--models rnn_attention` chains both) with a scalar regression head
are trained with SGD on batches of sequences whose lengths are drawn from
10..512 (log-uniform by default, like text; `--lengths uniform` for the other
common case). For each model, in one run, on the same batches from the same
initial parameters:

  jax_jit         `jax.jit` of a batched step with hand-written masks, each
                  batch padded to its own longest sequence: one compile per
                  distinct maximum.
  per_example     a loop over examples, `jax.jit` at each exact length (one
                  compile per distinct length), gradients averaged. This is
                  the unpadded reference.
  hand_buckets    the hand-masked step, batches padded to the next power of
                  two (at least 16): what careful users write today.
  polyjit         the model written for one unpadded sequence, `pj.vmap` over
                  a `pj.Ragged` batch (default buckets), inside `jax.jit`: the
                  README's training step. With attention, the batch is built
                  with `groups=pj.LengthGroups(batch_size=1)`: examples in
                  blocks by length, each block run one example at a time
                  (`--groups` chooses another layout for every model).

Reported per approach: total time (host padding, compiles and steps; wall
clock, and the process's CPU time, steadier on a shared machine), compiles
(`polyjit.diagnostics.count_compiles`), and the largest difference between
its gradients and the per-example reference (the per-example loop's), at the
initial parameters on the first `--check` batches.

    python benchmarks/ragged_training.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import os  # noqa: E402
# Cold runs: no programs from an earlier run on disk (horizons.py measures warm ones;
# POLYJIT_NO_CACHE=0 turns polyjit's default on-disk cache back on).
os.environ.setdefault("POLYJIT_NO_CACHE", "1")
import polyjit as pj

LEARNING_RATE = 0.01
APPROACHES = ("jax_jit", "per_example", "hand_buckets", "polyjit")


# --- the models: stages over a sequence of hidden states ------------------------
#
# Each model embeds the sequence, runs its stages and ends with a linear head on
# a (width,) vector: "rnn" scans an RNN over the sequence (lax.scan), "attention"
# is a one-layer self-attention encoder with mean pooling, "rnn_attention" runs
# the attention layer, then the RNN. Every stage exists twice: for one unpadded
# sequence h: (n, width), and batched with hand-written masks for a padded batch
# h: (batch, padded, width) whose `valid` entries are (batch, padded) booleans.

MODELS = {"rnn": ("recur",), "attention": ("attend", "pool"),
          "rnn_attention": ("attend", "recur")}


def init_params(features: int, width: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  dense = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
  return {"embed": dense(features, width), "q": dense(width, width), "k": dense(width, width),
          "v": dense(width, width), "o": dense(width, width), "rec": dense(width, width) * 0.5,
          "inp": dense(width, width), "head": dense(width)}


def attend(params, h):
  q, k, v = h @ params["q"], h @ params["k"], h @ params["v"]
  attn = jax.nn.softmax(q @ k.T / np.sqrt(q.shape[-1]), axis=-1)
  return h + (attn @ v) @ params["o"]


def recur(params, h):
  def step(c, ht):
    return jnp.tanh(c @ params["rec"] + ht @ params["inp"]), None
  c, _ = lax.scan(step, jnp.zeros(h.shape[-1], h.dtype), h)
  return c


def pool(params, h):
  return jnp.mean(h, axis=0)


def attend_masked(params, h, valid):
  q, k, v = h @ params["q"], h @ params["k"], h @ params["v"]
  scores = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(q.shape[-1])
  attn = jax.nn.softmax(jnp.where(valid[:, None, :], scores, -jnp.inf), axis=-1)
  return h + jnp.einsum("bqk,bkd->bqd", attn, v) @ params["o"]


def recur_masked(params, h, valid):
  def step(c, inputs):
    ht, live = inputs
    new = jnp.tanh(c @ params["rec"] + ht @ params["inp"])
    return jnp.where(live[:, None], new, c), None  # freeze after each sequence ends

  c0 = jnp.zeros((h.shape[0], h.shape[-1]), h.dtype)
  c, _ = lax.scan(step, c0, (jnp.swapaxes(h, 0, 1), valid.T))
  return c


def pool_masked(params, h, valid):
  return jnp.sum(jnp.where(valid[..., None], h, 0), axis=1) / jnp.sum(valid, 1)[:, None]


STAGES = {"attend": (attend, attend_masked), "recur": (recur, recur_masked),
          "pool": (pool, pool_masked)}


def example_loss(stages, params, x, y):
  """The loss of one unpadded sequence x: (n, features)."""
  h = jnp.tanh(x @ params["embed"])
  for stage in stages:
    h = STAGES[stage][0](params, h)
  return (h @ params["head"] - y) ** 2


def hand_masked_loss(stages, params, x, lengths, y):
  """The mean loss of a padded batch x: (batch, padded, features), by hand."""
  valid = jnp.arange(x.shape[1])[None, :] < lengths[:, None]
  h = jnp.tanh(x @ params["embed"])
  for stage in stages:
    h = STAGES[stage][1](params, h, valid)
  return jnp.mean((h @ params["head"] - y) ** 2)


def sgd(params, grads):
  return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def _train_step(loss_fn):
  def step(params, *batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    return sgd(params, grads), loss, grads
  return jax.jit(step)


# --- the four approaches: prepare a batch on the host, then one step -----------

def pad_batch(xs, padded: int):
  out = np.zeros((len(xs), padded, xs[0].shape[1]), np.float32)
  for i, x in enumerate(xs):
    out[i, :len(x)] = x
  return out, np.array([len(x) for x in xs], np.int32)


class HandMasked:
  """jax_jit (pad to the batch maximum) and hand_buckets (pad to a power of two)."""

  def __init__(self, stages, bucket):
    self.bucket = bucket
    self.step = _train_step(functools.partial(hand_masked_loss, stages))

  def __call__(self, params, xs, ys):
    x, lengths = pad_batch(xs, self.bucket(max(len(x) for x in xs)))
    return self.step(params, x, lengths, ys)


class PerExample:
  def __init__(self, stages):
    self.value_and_grad = jax.jit(jax.value_and_grad(functools.partial(example_loss, stages)))
    self.add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
    self.update = jax.jit(lambda p, g, n: sgd(p, jax.tree.map(lambda t: t / n, g)))

  def __call__(self, params, xs, ys):
    total_loss, total_grads = 0.0, None
    for x, y in zip(xs, ys):
      loss, grads = self.value_and_grad(params, x, y)
      total_loss += loss
      total_grads = grads if total_grads is None else self.add(total_grads, grads)
    n = np.float32(len(xs))
    grads = jax.tree.map(lambda g: g / n, total_grads)
    return self.update(params, total_grads, n), total_loss / n, grads


# `--groups`: how the polyjit approach lays out a batch. "auto": models with
# attention (cost grows with the square of the length) keep their examples in
# length groups run one example at a time (`pj.LengthGroups(batch_size=1)`);
# scans (run time = number of sequential steps, which groups would add up)
# use one plain `pj.Ragged`. The others force one layout for every model.
# (A LengthGroups remembers the layouts it used: one fresh object per approach.)
GROUPINGS = {
    "none": lambda: None,
    "lengths": lambda: pj.LengthGroups(),                     # blocks by length, vectorized
    "one_at_a_time": lambda: pj.LengthGroups(groups=1, batch_size=1),  # one block, lax.map
    "both": lambda: pj.LengthGroups(batch_size=1),
}


def grouping_for(stages, choice: str):
  if choice == "auto":
    choice = "both" if "attend" in stages and "recur" not in stages else "none"
  return GROUPINGS[choice]()


class Polyjit:
  def __init__(self, stages, groups=None):
    per_example = pj.vmap(functools.partial(example_loss, stages), in_axes=(None, 0, 0))
    self.step = _train_step(lambda params, batch, ys: per_example(params, batch, ys).mean())
    self.groups = groups

  def __call__(self, params, xs, ys):
    return self.step(params, pj.Ragged.from_list(xs, groups=self.groups), ys)


def make(name: str, stages, groups: str = "auto"):
  return {"jax_jit": lambda: HandMasked(stages, lambda n: n),
          "per_example": lambda: PerExample(stages),
          "hand_buckets": lambda: HandMasked(stages, pj.buckets.PowersOfTwo(minimum=16)),
          "polyjit": lambda: Polyjit(stages, grouping_for(stages, groups))}[name]()


# --- the run ------------------------------------------------------------------

def make_batches(steps, batch, low, high, features, distribution, seed=1):
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(steps):
    if distribution == "uniform":
      lengths = rng.integers(low, high + 1, batch)
    else:
      lengths = np.exp(rng.uniform(np.log(low), np.log(high + 1), batch)).astype(int)
    xs = [rng.standard_normal((n, features)).astype(np.float32) for n in lengths]
    ys = np.array([x[:, 0].mean() * 3 for x in xs], np.float32)  # a learnable target
    batches.append((xs, ys))
  return batches


def train(approach, params, batches):
  with pj.diagnostics.count_compiles() as compiles:
    t0, cpu0 = time.perf_counter(), time.process_time()
    losses = []
    for xs, ys in batches:
      params, loss, _ = approach(params, xs, ys)
      losses.append(loss)
    jax.block_until_ready(params)
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
  return {"total_s": total, "cpu_s": cpu, "compiles": len(compiles),
          "compile_s": sum(c.seconds for c in compiles),
          "first_loss": float(losses[0]), "final_loss": float(losses[-1])}


def gradients(approach, params, batches):
  return [approach(params, xs, ys)[2] for xs, ys in batches]


def grad_difference(got, want) -> tuple[float, float]:
  diffs = [np.max(np.abs(np.asarray(g) - np.asarray(w)))
           for gs, ws in zip(got, want) for g, w in zip(jax.tree.leaves(gs), jax.tree.leaves(ws))]
  scale = max(np.max(np.abs(np.asarray(w))) for ws in want for w in jax.tree.leaves(ws))
  return float(max(diffs)), float(max(diffs) / scale)


def run_model(stages, approaches, params0, batches, check, groups="auto") -> dict:
  """Trains with each approach; checks gradients against the per-example loop."""
  print(f"model {' -> '.join(stages)}", flush=True)
  rows, grads = {}, {}
  for name in approaches:
    approach = make(name, stages, groups)
    rows[name] = train(approach, params0, batches)
    print(f"  trained {name}: {rows[name]['total_s']:.1f} s", flush=True)
    # At the initial parameters, on batches seen in training: no new compiles.
    grads[name] = gradients(approach, params0, check)
  reference = grads.get("per_example") or gradients(PerExample(stages), params0, check)
  for name, row in rows.items():
    row["max_grad_abs_diff"], row["max_grad_rel_diff"] = grad_difference(grads[name], reference)
    print(f"  {name:<13} total {row['total_s']:8.2f} s (cpu {row['cpu_s']:8.2f} s)  "
          f"compiles {row['compiles']:4d} "
          f"({row['compile_s']:7.2f} s)  loss {row['first_loss']:.4f} -> "
          f"{row['final_loss']:.4f}  grad diff {row['max_grad_abs_diff']:.2e} "
          f"(rel {row['max_grad_rel_diff']:.2e})")
  ratios = {f"{name}_over_polyjit_{clock}":
            rows[name][f"{clock}_s"] / rows["polyjit"][f"{clock}_s"]
            for name in rows if name != "polyjit" and "polyjit" in rows
            for clock in ("total", "cpu")}
  for key, value in ratios.items():
    print(f"  {key}: {value:.1f}x", flush=True)
  return {"approaches": rows, "ratios": ratios}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a CI-size run")
  parser.add_argument("--steps", type=int, help="training steps (default 200; quick 8)")
  parser.add_argument("--batch", type=int, help="sequences per batch (default 32; quick 4)")
  parser.add_argument("--max-length", type=int, help="longest sequence (default 512; quick 64)")
  parser.add_argument("--lengths", choices=("loguniform", "uniform"), default="loguniform")
  parser.add_argument("--width", type=int, default=16, help="model width")
  parser.add_argument("--check", type=int, default=3, help="batches in the gradient check")
  parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=["rnn", "attention"])
  parser.add_argument("--approaches", nargs="+", choices=APPROACHES, default=list(APPROACHES))
  parser.add_argument("--groups", choices=("auto", *GROUPINGS), default="auto",
                      help="the polyjit approach's batch layout (see GROUPINGS)")
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args(argv)
  steps = opts.steps or (8 if opts.quick else 200)
  batch = opts.batch or (4 if opts.quick else 32)
  high = opts.max_length or (64 if opts.quick else 512)
  features = 8

  batches = make_batches(steps, batch, 10, high, features, opts.lengths)
  params0 = init_params(features, opts.width)
  results = {model: run_model(MODELS[model], opts.approaches, params0, batches,
                              batches[:opts.check], opts.groups)
             for model in opts.models}
  if opts.json:
    lengths = [len(x) for xs, _ in batches for x in xs]
    maxima = [max(len(x) for x in xs) for xs, _ in batches]
    meta = {"jax": jax.__version__, "polyjit": pj.__version__, "machine": platform.machine(),
            "processor": platform.processor(), "device": str(jax.devices()[0]),
            "steps": steps, "batch": batch, "lengths": f"{opts.lengths} 10..{high}",
            "width": opts.width, "features": features, "groups": opts.groups,
            "distinct_lengths": len(set(lengths)), "distinct_maxima": len(set(maxima))}
    with open(opts.json, "w") as fh:
      json.dump({"meta": meta, "models": results}, fh, indent=1)
  return results


if __name__ == "__main__":
  main()
