"""`python -m polyjit demo`: the problem and the fix, side by side, in a minute.

Two workloads, each run with `jax.jit` and with polyjit in the same process:

* the seed: a Gaussian log-likelihood over vectors whose length changes on
  every call (`jax.jit` compiles every length; `pj.jit` one program per
  bucket);
* a ragged batch: gradients of an RNN's mean loss over batches of sequences
  of different lengths (`jax.jit` on batches padded to their own longest
  sequence, with hand-written masks, compiles per distinct longest length;
  `pj.vmap` over `pj.Ragged` reuses a bucket's program).

It prints a table (calls, distinct shapes, compiles, programs loaded from
disk, seconds compiling, total seconds, speedup, largest relative difference
between the two results) and writes a plot of cumulative time against calls.

The baselines run without any persistent cache: JAX's is off unless the user
configured it, and where they did, the demo (a program of its own, not the
library) turns it off for its process, so `jax.jit` compiles every program.
polyjit's own on-disk cache stays on: on a second run `pj.jit` loads its
programs, and the table and the plot say "loaded", not "compiled"
(`POLYJIT_NO_CACHE=1` for a cold run).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import polyjit as pj

try:  # optional (the `demo` extra): progress bars and the figure
  from tqdm.auto import tqdm as _tqdm
except ImportError:
  _tqdm = None
try:  # this module serves the command line only: figures go to files (Agg)
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as _plt
except ImportError:
  _plt = None  # type: ignore[assignment, unused-ignore]  # typed only where matplotlib is installed


def pyplot() -> Any:
  """matplotlib's pyplot on the Agg backend (files only), or None without matplotlib."""
  return _plt


def _progress(iterable: Any, desc: str, total: int) -> Any:
  if _tqdm is None:  # the bar is a nicety: run without it
    return iterable
  return _tqdm(iterable, desc=desc, total=total, unit="call", leave=False)


def _timed(fn: Callable[..., Any], inputs: list[Any], desc: str) -> tuple[list[Any], list[float], Any]:
  """Runs fn on every input; returns outputs, cumulative seconds, compiles."""
  outs: list[Any] = []
  times: list[float] = []
  start = time.perf_counter()
  with pj.diagnostics.count_compiles() as compiles:
    for x in _progress(inputs, desc, len(inputs)):
      # jax.block_until_ready is unannotated in JAX (a stub gap).
      outs.append(jax.block_until_ready(fn(*x)))  # type: ignore[no-untyped-call, unused-ignore]
      times.append(time.perf_counter() - start)
  return outs, times, compiles


# --- the seed: a likelihood over a vector of changing length ------------------------

def loglik(x: Any, mu: Any, log_sigma: Any) -> Any:
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def seed_inputs(calls: int, rng: np.random.Generator) -> list[tuple[Any, Any, Any]]:
  lengths = rng.choice(np.arange(100, 10_001), calls, replace=False)
  return [(rng.standard_normal(n).astype(np.float32), np.float32(0.3), np.float32(0.1))
          for n in lengths]


# --- a ragged batch: RNN loss gradients ----------------------------------------------

HIDDEN = 16


def rnn_loss(params: Any, seq: Any) -> Any:
  """Mean squared prediction error of a tanh RNN over one unpadded sequence."""
  w, u, v = params

  def step(h: Any, x: Any) -> tuple[Any, Any]:
    h = jnp.tanh(h @ w + x * u)
    return h, h @ v

  _, preds = lax.scan(step, jnp.zeros(HIDDEN), seq[:-1])
  return jnp.mean((preds - seq[1:]) ** 2)


def handmasked_batch_loss(params: Any, padded: Any, lengths: Any) -> Any:
  """What people write by hand: pad to the batch's longest, mask every step."""
  w, u, v = params

  def one(seq: Any, n: Any) -> Any:
    def step(h: Any, inp: Any) -> tuple[Any, Any]:
      x, t = inp
      h_new = jnp.tanh(h @ w + x * u)
      return jnp.where(t < n - 1, h_new, h), jnp.where(t < n - 1, h_new @ v, 0.0)
    steps = jnp.arange(seq.shape[0] - 1)
    _, preds = lax.scan(step, jnp.zeros(HIDDEN), (seq[:-1], steps))
    err = jnp.where(steps < n - 1, (preds - seq[1:]) ** 2, 0.0)
    return err.sum() / (n - 1)

  return jnp.mean(jax.vmap(one)(padded, lengths))


def ragged_inputs(steps: int, batch: int, rng: np.random.Generator) -> list[list[Any]]:
  return [[np.sin(np.linspace(0, rng.uniform(1, 20), n)).astype(np.float32)
           for n in rng.integers(10, 257, batch)] for _ in range(steps)]


def params_for(rng: np.random.Generator) -> tuple[Any, Any, Any]:
  return (rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.3,
          rng.standard_normal(HIDDEN).astype(np.float32) * 0.3,
          rng.standard_normal(HIDDEN).astype(np.float32) * 0.3)


# --- running it ---------------------------------------------------------------------

def _max_rel_diff(a_outs: Any, b_outs: Any) -> float:
  """Largest |a - b| / max(|b|) over every output leaf: float32 sums of different
  lengths round differently, so the relative difference is the honest measure."""
  diffs: list[float] = []
  for a, b in zip(a_outs, b_outs, strict=True):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
      diffs.append(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(y))), 1e-30)))
  return max(diffs) if diffs else 0.0


def run(calls: int = 240, steps: int = 30, batch: int = 16, seed: int = 0) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  results: dict[str, Any] = {}

  data = seed_inputs(calls, rng)
  jit_outs, jit_t, jit_c = _timed(jax.jit(loglik), data, "seed: jax.jit")
  pj_outs, pj_t, pj_c = _timed(pj.jit(loglik), data, "seed: pj.jit")
  results["seed log-likelihood"] = {
      "calls": calls, "shapes": len({x[0].shape for x in data}),
      "jax.jit": (jit_t, jit_c), "polyjit": (pj_t, pj_c),
      "max_diff": _max_rel_diff(jit_outs, pj_outs), "polyjit_name": "pj.jit"}

  params = params_for(rng)
  batches = ragged_inputs(steps, batch, rng)
  hand = jax.jit(jax.value_and_grad(handmasked_batch_loss))

  def jit_step(seqs: Any) -> Any:
    n_max = max(len(s) for s in seqs)
    padded = np.zeros((len(seqs), n_max), np.float32)
    for i, s in enumerate(seqs):
      padded[i, :len(s)] = s
    return hand(params, padded, np.array([len(s) for s in seqs], np.int32))

  ragged_step = jax.jit(jax.value_and_grad(
      lambda p, r: pj.vmap(rnn_loss, in_axes=(None, 0))(p, r).mean()))
  jit_outs, jit_t, jit_c = _timed(jit_step, [(b,) for b in batches], "ragged: jax.jit")
  pj_outs, pj_t, pj_c = _timed(lambda b: ragged_step(params, pj.Ragged.from_list(b)),
                               [(b,) for b in batches], "ragged: pj.vmap")
  results["ragged RNN gradients"] = {
      "calls": steps, "shapes": len({max(len(s) for s in b) for b in batches}),
      "jax.jit": (jit_t, jit_c), "polyjit": (pj_t, pj_c),
      "max_diff": _max_rel_diff(jit_outs, pj_outs), "polyjit_name": "pj.vmap + Ragged"}
  return results


def loads(compiles: Any) -> int:
  """Programs loaded from a persistent cache instead of compiled."""
  return len(getattr(compiles, "cache_loads", ()))


def table(results: dict[str, Any]) -> str:
  head = (f"{'workload':<22}{'contender':<18}{'calls':>6}{'shapes':>8}{'compiles':>10}"
          f"{'loaded':>8}{'compile s':>11}{'total s':>9}{'speedup':>9}{'rel diff':>10}")
  lines = [head, "-" * len(head)]
  loaded = 0
  for name, r in results.items():
    base = r["jax.jit"][0][-1]
    for label, key in (("jax.jit", "jax.jit"), (r["polyjit_name"], "polyjit")):
      times, compiles = r[key]
      loaded += loads(compiles)
      lines.append(
          f"{name if key == 'jax.jit' else '':<22}{label:<18}{r['calls']:>6}{r['shapes']:>8}"
          f"{len(compiles):>10}{loads(compiles):>8}{sum(c.seconds for c in compiles):>11.2f}"
          f"{times[-1]:>9.2f}{base / times[-1]:>8.1f}x"
          + (f"{r['max_diff']:>10.1e}" if key == "polyjit" else f"{'(ref)':>10}"))
  if loaded:
    lines.append(f"({loaded} program(s) loaded from disk, compiled by an earlier run: a warm "
                 "start. POLYJIT_NO_CACHE=1 runs cold.)")
  return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> str | None:
  """Writes the figure to `path` and returns it; None without matplotlib."""
  plt = pyplot()
  if plt is None:
    return None
  fig = figure(results, plt)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def figure(results: dict[str, Any], plt: Any) -> Any:
  """Cumulative seconds against calls, one panel per workload: both axes from
  0 (the gap is the cost), and the speedup written on each panel."""
  fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4))
  for ax, (name, r) in zip(np.atleast_1d(axes), results.items(), strict=True):
    for label, key in (("jax.jit", "jax.jit"), (r["polyjit_name"], "polyjit")):
      times = r[key][0]
      n, m = len(r[key][1]), loads(r[key][1])
      ax.plot(np.arange(1, len(times) + 1), times,
              label=f"{label} ({n} compile{'' if n == 1 else 's'}"
                    + (f", {m} loaded from disk)" if m else ")"))
    speedup = r["jax.jit"][0][-1] / r["polyjit"][0][-1]
    ax.text(0.97, 0.14, f"{r['polyjit_name']}: {speedup:.1f}x faster than jax.jit",
            transform=ax.transAxes, ha="right", fontsize=11, fontweight="bold")
    ax.set_title(name)
    ax.set_xlabel("calls")
    ax.set_ylabel("cumulative seconds")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
  fig.tight_layout()
  return fig


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(prog="python -m polyjit demo", description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=240, help="seed workload calls")
  parser.add_argument("--steps", type=int, default=30, help="ragged training steps")
  parser.add_argument("--plot", default="polyjit-demo.png", help="where to write the plot")
  opts = parser.parse_args(argv)
  print(f"polyjit {pj.__version__} on JAX {jax.__version__}, {jax.devices()[0].platform}")
  if jax.config.jax_compilation_cache_dir:  # type: ignore[attr-defined, unused-ignore]  # (absent from the stubs)
    # the user's JAX cache would load the baselines' programs: this process
    # (the demo's own, not a library call) measures compiles without it
    jax.config.update("jax_enable_compilation_cache", False)  # type: ignore[no-untyped-call, unused-ignore]
    print("JAX's persistent compilation cache is off for this demo: jax.jit compiles "
          "every program it runs.")
  results = run(opts.calls, opts.steps)
  print(table(results))
  path = plot(results, opts.plot)
  print(f"plot: {path}" if path else "plot skipped (pip install matplotlib)")
  return results
