"""Training four models: polyjit against hand-written masks, hand buckets and jax.jit (issue 32).

Four models written for ONE unpadded example (`training_models.py`: an
embedding + bidirectional LSTM text classifier like Flax's sst2 example, a
small attention encoder, a message-passing graph network, Deep Sets), trained
with SGD with momentum (optax) on batches of 16 examples. Four contenders, in
the same run, on the same batches, from the same initial parameters:

  masks       the model rewritten by hand for a padded batch with explicit
              masks, each batch padded to the SAME sizes as polyjit's batch
              (`pj.Ragged.from_list`'s buckets): one compile per padded size.
              The baseline of every ratio.
  pow2        hand buckets: the same hand-masked step, each ragged part padded
              to the next power of two of the batch's longest.
  flax        Flax's sst2 example's hand buckets: the same hand-masked step,
              each ragged part padded to the bucket boundary of its longest
              as `bucket_by_sequence_length(pad_to_bucket_boundary=True)`
              does with the example's boundaries: multiples of
              `--bucket-size` (8) up to `--max-input-length` (60, so 64),
              the longest past it (`sst2_batches.py`). Not run by default.
  longest     `jax.jit` of the hand-masked step, padded to each batch's
              longest: one compile per distinct longest.
  polyjit     the one-example model under `pj.vmap` over `pj.Ragged` parts,
              inside `jax.jit(jax.value_and_grad(loss))` and the optax step.

Reported per model and contender:
  * forward, gradient (value_and_grad) and full optimizer step, each one
    compiled call, steady state: the median of `--reps` calls on the first
    batch (each contender at its own padded sizes for that batch), after an
    untimed first call, with `block_until_ready`. The calls of all programs
    and contenders run in rounds, in a new random order each round, so load
    from other processes lands on all alike. Wall clock; the step's ratio
    also by process CPU time (in parentheses), steadier on a shared machine:
    `masks` and `pow2` usually run the same padded sizes, so their ratio
    shows the noise;
  * training from scratch with fresh programs: the total of `--steps` steps
    (host padding, compiles and steps; wall clock, and process CPU time in
    the JSON), the compiles and their seconds, counted with
    `jax.monitoring`'s backend-compile event. `longest` compiles for nearly
    every batch, so it trains `--longest-steps` steps only, and its ratio is
    taken against `masks` after as many steps (each step waits for its loss,
    so the time after every step is known). With `--rounds N` every
    contender trains N times, in an order rotated each round, and the run of
    median total is reported (each round's totals in the JSON).
Ratios are against `masks`. Polyjit's total is also given against `flax`'s and
`pow2`'s (and, with rounds, round by round), and each contender's steps are
split into those that compiled and the others (their mean wall and CPU ms).

Sentence lengths (`--lengths`, text and attention): `uniform` (default) draws
each sentence's length uniform in 3..`--max-tokens` and each batch is
`--batch` random sentences; `sst2` draws them from SST-2's train split and
forms the batches as Flax's sst2 example does, each from one length bucket,
the buckets' batches shuffled together (`sst2_batches.py`). Graphs and sets
keep their own draws. On this 2-core machine, shared with other work,
the default run takes about 5 minutes unloaded (more under load: the output
gives the load average), `--quick` about 1.5.

After the untimed first calls and before any timed one, every contender's
loss and gradients on the first batch, at the initial parameters, are
compared with `masks`'s (and with a loop over the unpadded examples with
`--reference`, the default in `--smoke`): `agreement` in the JSON; the
script exits with status 1 when one differs by more than `--tolerance`.

    python benchmarks/training.py [--quick | --smoke] [--issue-sizes] [--json out.json]
    python benchmarks/training.py --models text --lengths sst2 \
        --contenders masks pow2 flax polyjit --rounds 3 [--batch 64]

Only polyjit's public API is used (`pj.vmap`, `pj.Ragged`), so the script runs
unchanged on any branch.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

# Cold runs: no programs from an earlier run on disk.
os.environ.setdefault("POLYJIT_NO_CACHE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import polyjit as pj  # noqa: E402

try:
  from benchmarks import sst2_batches
  from benchmarks import training_models as tm
except ImportError:  # run as a script from benchmarks/
  import sst2_batches  # type: ignore[no-redef]
  import training_models as tm  # type: ignore[no-redef]

CONTENDERS = ("masks", "pow2", "flax", "longest", "polyjit")
DEFAULT_CONTENDERS = ("masks", "pow2", "longest", "polyjit")
SENTENCE_MODELS = ("text", "attention")  # the models `--lengths` applies to
MODELS = ("text", "attention", "graph", "sets")
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
RESULTS = Path(__file__).resolve().parent / "results"


# --- counting compiles (jax.monitoring; one listener, scoped by a list) ----------

_compile_logs: list[list[float]] = []
_lock = threading.Lock()


def _on_duration(event: str, duration_secs: float, **_kwargs) -> None:
  if event == BACKEND_COMPILE:
    with _lock:
      for log in _compile_logs:
        log.append(float(duration_secs))


jax.monitoring.register_event_duration_secs_listener(_on_duration)


@contextlib.contextmanager
def compiles():
  log: list[float] = []
  with _lock:
    _compile_logs.append(log)
  try:
    yield log
  finally:
    with _lock:
      _compile_logs.remove(log)


# --- the contenders: host preparation of a batch, and the loss on it --------------

def next_pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def pad_part(arrays, size: int) -> tuple[np.ndarray, np.ndarray]:
  """Stacks arrays of different leading sizes, zero-padded to `size`, and the mask."""
  out = np.zeros((len(arrays), size, *arrays[0].shape[1:]), arrays[0].dtype)
  for i, a in enumerate(arrays):
    out[i, :len(a)] = a
  lengths = np.array([len(a) for a in arrays])
  return out, np.arange(size)[None, :] < lengths[:, None]


def polyjit_sizes(examples) -> tuple[int, ...]:
  """The padded size of each ragged part in polyjit's batch (its default buckets)."""
  parts = list(zip(*examples, strict=True))
  return tuple(pj.Ragged.from_list(list(p)).padded_lengths[0] for p in parts)


class Hand:
  """A hand-masked contender: `sizes(examples) -> padded size per part`."""

  def __init__(self, model: tm.Model, sizes):
    self.model, self.sizes = model, sizes

  def prepare(self, examples, labels):
    sizes = self.sizes(examples)
    padded = [pad_part(list(p), s)
              for p, s in zip(zip(*examples, strict=True), sizes, strict=True)]
    return (tuple(d for d, _ in padded), tuple(m for _, m in padded), labels)

  def loss(self, params, parts, valid, labels):
    return self.model.padded(params, parts, valid, labels)


class Polyjit:
  """The one-example model under `pj.vmap`, one `pj.Ragged` per ragged part."""

  def __init__(self, model: tm.Model, sizes):
    self.sizes = sizes
    # a fresh function object per contender: no trace of another contender is reused
    self.per_example = pj.vmap(functools.partial(model.one),
                               in_axes=(None, *[0] * model.parts, 0))

  def prepare(self, examples, labels):
    parts = tuple(pj.Ragged.from_list(list(p)) for p in zip(*examples, strict=True))
    return parts, labels

  def loss(self, params, parts, labels):
    return self.per_example(params, *parts, labels).mean()


def longest(examples) -> tuple[int, ...]:
  return tuple(max(len(e[j]) for e in examples) for j in range(len(examples[0])))


def make_contender(name: str, model: tm.Model, sizes_table: dict, opts):
  """`sizes_table`: polyjit's padded sizes of each batch, by `id` of its example list."""
  flax = functools.partial(sst2_batches.flax_padded_size, bucket_size=opts.bucket_size,
                           max_length=opts.max_input_length)
  sizes = {"masks": lambda ex: sizes_table[id(ex)], "polyjit": lambda ex: sizes_table[id(ex)],
           "pow2": lambda ex: tuple(next_pow2(n) for n in longest(ex)),
           "flax": lambda ex: tuple(flax(n) for n in longest(ex)),
           "longest": longest}[name]
  return Polyjit(model, sizes) if name == "polyjit" else Hand(model, sizes)


class Compiled:
  """One contender's three compiled programs: forward, gradient, optimizer step."""

  def __init__(self, contender, optimizer):
    loss = contender.loss
    self.sizes, self.prepare = contender.sizes, contender.prepare
    self.forward = jax.jit(loss)
    self.grad = jax.jit(jax.value_and_grad(loss))

    def step(params, state, *batch):
      value, grads = jax.value_and_grad(loss)(params, *batch)
      updates, state = optimizer.update(grads, state, params)
      return optax.apply_updates(params, updates), state, value
    self.step = jax.jit(step)


# --- the run ----------------------------------------------------------------------

def build_model(name: str, opts) -> tm.Model:
  if name == "text":
    return tm.text_model(opts.vocab, opts.embed, opts.hidden, 3, opts.max_tokens, opts.flax_rnn)
  if name == "attention":
    return tm.attention_model(opts.vocab, opts.width, opts.heads, opts.layers, 3, opts.max_tokens)
  if name == "graph":
    return tm.graph_model(16, opts.width, 4, opts.max_nodes)
  return tm.sets_model(16, opts.width, 1, opts.max_set)


def make_batches(model: tm.Model, opts, seed: int = 1):
  """`opts.steps` batches of `opts.batch` examples; with `--lengths sst2` (text,
  attention) SST-2's lengths in Flax's length-bucketed batches."""
  rng = np.random.default_rng(seed)
  if opts.lengths == "sst2" and model.name in SENTENCE_MODELS:
    lengths = sst2_batches.flax_batches(opts.steps, opts.batch, opts.bucket_size,
                                        opts.max_input_length, rng)
  else:
    lengths = [[None] * opts.batch for _ in range(opts.steps)]  # the model's own draw
  out = []
  for ns in lengths:
    examples, labels = zip(*(model.make_example(rng, *([] if n is None else [n]))
                             for n in ns), strict=True)
    out.append((list(examples), np.array(labels, np.float32)))
  return out


def max_rel_diff(got, want) -> float:
  """The largest difference, relative to the largest magnitude of each leaf, or
  to 1% of the largest magnitude of any leaf where that is more: a leaf whose
  true gradient is 0 (the key bias of attention: softmax ignores a constant
  shift) holds rounding noise only, which must not count as a disagreement."""
  pairs = [(np.asarray(g, np.float64), np.asarray(w, np.float64))
           for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)]
  floor = 0.01 * max(float(np.max(np.abs(w))) for _, w in pairs)
  return max(float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), floor, 1e-30)
             for g, w in pairs)


def reference(model: tm.Model, params, examples, labels):
  """The loss and gradients of the batch, one unpadded example at a time."""
  vg = jax.jit(jax.value_and_grad(model.one))
  results = [vg(params, *ex, y) for ex, y in zip(examples, labels, strict=True)]
  n = len(results)
  return (sum(float(v) for v, _ in results) / n,
          jax.tree.map(lambda *gs: sum(gs) / n, *[g for _, g in results]))


def agreement(values: dict) -> dict:
  """Each contender's loss and gradients (`values[name] = (loss, grads)`) against `masks`'s."""
  base_value, base_grads = values["masks"]
  return {name: {"loss": float(value),
                 "loss_rel_diff": abs(float(value) - float(base_value)) / abs(float(base_value)),
                 "grad_rel_diff": max_rel_diff(grads, base_grads)}
          for name, (value, grads) in values.items()}


def train(compiled: Compiled, params, state, batches) -> dict:
  """Trains from scratch (cold: fresh programs); the wall clock after each step,
  and the wall and CPU seconds of the steps that compiled and of the others."""
  with compiles() as log:
    t0, cpu0 = time.perf_counter(), time.process_time()
    losses, elapsed = [], []
    split = {True: [0, 0.0, 0.0], False: [0, 0.0, 0.0]}  # compiled? -> steps, wall, cpu
    for examples, labels in batches:
      before, w0, c0 = len(log), time.perf_counter(), time.process_time()
      params, state, loss = compiled.step(params, state, *compiled.prepare(examples, labels))
      losses.append(loss)
      jax.block_until_ready(loss)  # so that `elapsed` is the time of the steps so far
      elapsed.append(time.perf_counter() - t0)
      row = split[len(log) > before]
      row[0] += 1
      row[1] += time.perf_counter() - w0
      row[2] += time.process_time() - c0
    jax.block_until_ready(params)
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
  (n_c, wall_c, cpu_c), (n_r, wall_r, cpu_r) = split[True], split[False]
  return {"steps": len(batches), "total_s": total, "cpu_s": cpu, "compiles": len(log),
          "compile_s": sum(log), "elapsed_s": elapsed,
          "compiling_steps": n_c, "compiling_steps_s": wall_c, "compiling_steps_cpu_s": cpu_c,
          "run_steps": n_r, "run_step_ms": 1e3 * wall_r / max(n_r, 1),
          "run_step_cpu_ms": 1e3 * cpu_r / max(n_r, 1),
          "first_loss": float(losses[0]), "final_loss": float(losses[-1])}


def per_call(compiled_by_name: dict, params, state, batch, reps: int, programs, tolerance: float,
             model: tm.Model, with_reference: bool) -> tuple[dict, dict]:
  """Median seconds of one compiled forward, gradient and step call, interleaved;
  and, after the untimed first calls and before any timed one, the agreement of
  the contenders' losses and gradients on this batch."""
  examples, labels = batch
  args = {name: jax.device_put(c.prepare(examples, labels)) for name, c in compiled_by_name.items()}
  calls = {name: {"forward": lambda c=c, a=a: c.forward(params, *a),
                  "grad": lambda c=c, a=a: c.grad(params, *a),
                  "step": lambda c=c, a=a: c.step(params, state, *a)}
           for (name, c), a in zip(compiled_by_name.items(), args.values(), strict=True)}
  values, failed = {}, {}
  for name, fns in list(calls.items()):  # compile and warm up, untimed
    try:
      values[name] = jax.block_until_ready(fns["grad"]())
    except Exception as e:  # e.g. --flax-rnn under pj.vmap (issue 33): reported, not fatal
      if name == "masks":
        raise
      failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
      print(f"  {name} FAILED: {failed[name]}", flush=True)
      del calls[name]
      continue
    for kind in programs:
      jax.block_until_ready(fns[kind]())
  if with_reference:
    values["reference"] = reference(model, params, examples, labels)
  agree = agreement(values) | {name: {"failed": why, "ok": False} for name, why in failed.items()}
  for name, row in agree.items():
    if "failed" in row:
      continue
    row["ok"] = row["loss_rel_diff"] <= tolerance and row["grad_rel_diff"] <= tolerance
    print(f"  agree {name:<9} loss {row['loss']:.6f} (rel {row['loss_rel_diff']:.1e}) "
          f"grads rel {row['grad_rel_diff']:.1e} {'ok' if row['ok'] else 'DISAGREE'}",
          flush=True)
  # Rounds of one call of each program of each contender, in a new random order
  # each round: load from other processes lands on all of them alike.
  times: dict = {name: {kind: ([], []) for kind in programs} for name in calls}
  order = [(name, kind) for name in calls for kind in programs]
  shuffle = np.random.default_rng(0).permutation
  for _ in range(reps):
    for i in shuffle(len(order)):
      name, kind = order[i]
      t0, cpu0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(calls[name][kind]())
      wall, cpu = times[name][kind]
      wall.append(time.perf_counter() - t0)
      cpu.append(time.process_time() - cpu0)
  timing = {}
  for name in calls:
    timing[name] = {}
    for kind in ("forward", "grad", "step"):
      wall, cpu = times[name].get(kind, ([], []))
      timing[name] |= {f"{kind}_ms": statistics.median(wall) * 1e3 if wall else None,
                       f"{kind}_min_ms": min(wall) * 1e3 if wall else None,
                       f"{kind}_cpu_ms": statistics.median(cpu) * 1e3 if cpu else None}
  return timing, agree


def run_model(name: str, opts) -> dict:
  model = build_model(name, opts)
  batches = make_batches(model, opts)
  params = model.init(jax.random.key(0))
  optimizer = optax.sgd(opts.lr, momentum=0.9)
  state = optimizer.init(params)
  sizes_table = {id(ex): polyjit_sizes(ex) for ex, _ in batches}
  print(f"model {name}: {sum(x.size for x in jax.tree.leaves(params)):,} parameters", flush=True)
  contenders = ["masks", *[c for c in opts.contenders if c != "masks"]]  # masks: the baseline

  # Per-call timing (and the agreement check) on the first batch, with their own programs.
  t0 = time.perf_counter()
  timed = {c: Compiled(make_contender(c, model, sizes_table, opts), optimizer) for c in contenders}
  timings, agree = per_call(timed, params, state, batches[0], opts.reps, opts.programs,
                            opts.tolerance, model, opts.reference)
  phases = {"per_call_s": time.perf_counter() - t0}

  # Training from scratch, with fresh programs: every compile counts.
  # `--rounds` > 1: every contender trains once a round, the order rotated each
  # round (load from other processes lands on all alike); the run of median
  # total is reported, and each round's totals are kept.
  trained = [c for c in contenders if c in timings]  # not those that failed
  runs: dict = {c: [] for c in trained}
  for r in range(opts.rounds):
    for c in trained[r % len(trained):] + trained[:r % len(trained)]:
      steps = opts.longest_steps if c == "longest" and opts.longest_steps else opts.steps
      compiled = Compiled(make_contender(c, model, sizes_table, opts), optimizer)
      run = train(compiled, params, state, batches[:steps])
      run["padded_sizes"] = list(compiled.sizes(batches[0][0]))
      run["distinct_padded_sizes"] = len({compiled.sizes(ex) for ex, _ in batches[:steps]})
      runs[c].append(run)
      print(f"  trained {c}: {steps} steps {run['total_s']:.1f} s, {run['compiles']} "
            f"compiles ({run['compile_s']:.1f} s)", flush=True)
  rows: dict = {}
  for c in trained:
    median = sorted(runs[c], key=lambda run: run["total_s"])[(len(runs[c]) - 1) // 2]
    rows[c] = median | timings[c] | {"totals_s": [run["total_s"] for run in runs[c]],
                                     "cpu_totals_s": [run["cpu_s"] for run in runs[c]]}
  phases["total_s"] = time.perf_counter() - t0
  base = rows["masks"]
  for row in rows.values():
    for key in ("forward_ms", "grad_ms", "step_ms", "step_cpu_ms"):
      if row[key] is not None:
        row[key.rsplit("_", 1)[0] + "_ratio"] = row[key] / base[key]
    row["total_ratio"] = row["total_s"] / base["elapsed_s"][row["steps"] - 1]  # at equal steps
  versus = {}
  if "polyjit" in rows:  # polyjit's total against the hand buckets' (issue 32)
    for c in ("flax", "pow2"):
      if c in rows and rows[c]["steps"] == rows["polyjit"]["steps"]:
        versus[c] = {"total_ratio": rows["polyjit"]["total_s"] / rows[c]["total_s"],
                     "cpu_ratio": rows["polyjit"]["cpu_s"] / rows[c]["cpu_s"],
                     "round_ratios": [p["total_s"] / h["total_s"] for p, h in
                                      zip(runs["polyjit"], runs[c], strict=True)]}
  print(f"  {phases['total_s']:.0f} s (per-call timing and check {phases['per_call_s']:.0f} s)",
        flush=True)
  lengths = opts.lengths if name in SENTENCE_MODELS else "uniform"
  return {"contenders": rows, "agreement": agree, "phases": phases, "lengths": lengths,
          "polyjit_versus": versus}


def print_table(results: dict) -> list[str]:
  lines = ["| model | contender | padded | forward ms | gradient ms | step ms | step vs masks "
           "(cpu) | steps | total s | compiles (s) | total vs masks |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for model, r in results.items():
    for c, row in r["contenders"].items():
      ratio = lambda k: f"{row[k]:.2f}x" if k in row else "-"
      ms = lambda k: "-" if row[k] is None else f"{row[k]:.2f}"
      lines.append(
          f"| {model} | {c} | {'/'.join(map(str, row['padded_sizes']))} "
          f"| {ms('forward_ms')} | {ms('grad_ms')} | {ms('step_ms')} "
          f"| {ratio('step_ratio')} ({ratio('step_cpu_ratio')}) "
          f"| {row['steps']} | {row['total_s']:.1f} | {row['compiles']} ({row['compile_s']:.1f}) "
          f"| {ratio('total_ratio')} |")
  steps = ["", "| model | contender | compiles | compiling steps s (cpu) | other steps "
           "| ms per other step (cpu) | total s (cpu) |", "|---|---|---|---|---|---|---|"]
  versus = []
  for model, r in results.items():
    for c, row in r["contenders"].items():
      per_step = (f"{row['run_step_ms']:.2f} ({row['run_step_cpu_ms']:.2f})"
                  if row["run_steps"] else "-")
      steps.append(
          f"| {model} | {c} | {row['compiles']} | {row['compiling_steps_s']:.2f} "
          f"({row['compiling_steps_cpu_s']:.2f}) | {row['run_steps']} | {per_step} "
          f"| {row['total_s']:.2f} ({row['cpu_s']:.2f}) |")
    versus += [f"{model} ({r['lengths']} lengths): polyjit's total / {c}'s: "
               f"{v['total_ratio']:.2f}x (cpu {v['cpu_ratio']:.2f}x)"
               + (f"; each round: {', '.join(f'{x:.2f}x' for x in v['round_ratios'])}"
                  if len(v["round_ratios"]) > 1 else "")
               for c, v in r["polyjit_versus"].items()]
  lines += steps + ([""] + versus if versus else [])
  print("\n".join(lines))
  return lines


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true",
                 help="a quick look: 30 steps, 5 for longest, 8 reps")
  p.add_argument("--smoke", action="store_true",
                 help="tiny sizes, 2 steps, the gradient timed once, reference check (the test)")
  p.add_argument("--issue-sizes", action="store_true",
                 help="the issue's text classifier: embedding 300, LSTM 256")
  p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
  p.add_argument("--contenders", nargs="+", choices=CONTENDERS,
                 default=list(DEFAULT_CONTENDERS), help="default: all but flax")
  p.add_argument("--lengths", choices=("uniform", "sst2"), default="uniform",
                 help="text, attention: sentences uniform in 3..--max-tokens in random "
                      "batches (default), or SST-2's lengths in Flax's length-bucketed "
                      "batches (sst2_batches.py)")
  p.add_argument("--bucket-size", type=int, default=8,
                 help="flax: bucket width (Flax's sst2 config: 8)")
  p.add_argument("--max-input-length", type=int, default=60,
                 help="flax: the last bucket boundary covers this (Flax's sst2 config: 60)")
  p.add_argument("--steps", type=int, help="training steps (default 200; quick 30; smoke 2)")
  p.add_argument("--longest-steps", type=int,
                 help="steps of the `longest` contender, which compiles for nearly every "
                      "batch (default 30; quick 5; 0: all); its total is compared with "
                      "`masks` after as many steps")
  p.add_argument("--reps", type=int,
                 help="timed calls per program (default 30; quick 8; smoke 1)")
  p.add_argument("--programs", nargs="+", choices=("forward", "grad", "step"),
                 help="the programs timed per call (default all three; smoke: grad)")
  p.add_argument("--rounds", type=int, default=1,
                 help="train every contender this many times from scratch, in rotated "
                      "order; the run of median total is reported")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--vocab", type=int, default=5000)
  p.add_argument("--embed", type=int, default=64, help="text: embedding size")
  p.add_argument("--hidden", type=int, default=64, help="text: LSTM size")
  p.add_argument("--width", type=int, default=64, help="attention, graph, sets: width")
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--layers", type=int, default=1, help="attention: encoder layers")
  p.add_argument("--max-tokens", type=int, default=120, help="sentences of 3..N tokens")
  p.add_argument("--max-nodes", type=int, default=64, help="graphs of 4..N nodes, N..3N edges")
  p.add_argument("--max-set", type=int, default=256, help="sets of 1..N elements")
  p.add_argument("--lr", type=float, default=0.05)
  p.add_argument("--flax-rnn", action="store_true",
                 help="text: the one-example model with nn.RNN (issue 33)")
  p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=None,
                 help="also check against a loop over unpadded examples (default: smoke only)")
  p.add_argument("--tolerance", type=float, default=1e-4,
                 help="largest relative difference of loss and gradients in the check")
  p.add_argument("--json", help="write the results here (default benchmarks/results/"
                                "training[-quick|-smoke][-sst2][-CHECKOUT].json, CHECKOUT: the "
                                "folder polyjit was imported from, when it is not this one)")
  opts = p.parse_args(argv)
  if opts.issue_sizes:
    opts.embed, opts.hidden = 300, 256
  if opts.smoke:
    opts.vocab, opts.embed, opts.hidden, opts.width, opts.heads = 50, 8, 8, 8, 2
    opts.max_tokens, opts.max_nodes, opts.max_set, opts.batch = 12, 8, 12, 4
  opts.steps = opts.steps or (2 if opts.smoke else 30 if opts.quick else 200)
  if opts.longest_steps is None:
    opts.longest_steps = 0 if opts.smoke else 5 if opts.quick else 30
  if opts.reps is None:
    opts.reps = 1 if opts.smoke else 8 if opts.quick else 30
  if opts.programs is None:
    opts.programs = ["grad"] if opts.smoke else ["forward", "grad", "step"]
  if opts.reference is None:
    opts.reference = opts.smoke
  return opts


def main(argv=None) -> dict:
  opts = parse(argv)
  t0, load0 = time.perf_counter(), os.getloadavg()[0]
  results = {m: run_model(m, opts) for m in opts.models}
  mode = "smoke" if opts.smoke else "quick" if opts.quick else "full"
  load = (load0, os.getloadavg()[0])
  longest_steps = opts.longest_steps or opts.steps
  print(f"\n{mode} run, {opts.steps} steps of {opts.batch} examples ({longest_steps} for "
        f"longest), {opts.lengths} lengths, {opts.reps} timed calls; "
        f"{jax.devices()[0].platform}, "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} at the start, {load[1]:.1f} at "
        f"the end (a machine shared with other work: compare ratios within one run); "
        f"JAX {jax.__version__}, polyjit from {Path(pj.__file__).parent.parent}; "
        f"{time.perf_counter() - t0:.0f} s in all")
  table = print_table(results)
  meta = {"jax": jax.__version__, "polyjit": pj.__version__, "polyjit_path": pj.__file__,
          "machine": platform.machine(), "cores": os.cpu_count(), "load_average": load,
          "device": str(jax.devices()[0]), "mode": mode,
          "argv": vars(opts) | {"json": None}, "seconds": time.perf_counter() - t0}
  suffix = ("" if mode == "full" else f"-{mode}") + ("-sst2" if opts.lengths == "sst2" else "")
  checkout = Path(pj.__file__).resolve().parent.parent
  if checkout != RESULTS.parent.parent:  # polyjit from another checkout: named after it
    suffix += f"-{checkout.name}"
  out = Path(opts.json) if opts.json else RESULTS / f"training{suffix}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({"meta": meta, "models": results, "table": table}, indent=1))
  print(f"results: {out}")
  return {"meta": meta, "models": results}


def all_agree(results: dict) -> bool:
  return all(row["ok"] for r in results["models"].values() for row in r["agreement"].values())


if __name__ == "__main__":
  if not all_agree(main()):
    print("the contenders DISAGREE (see `agree` above): the timings compare different programs")
    raise SystemExit(1)
