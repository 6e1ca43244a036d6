"""Gradients of shared parameters under `pj.vmap` against hand-masked batches (issue 32).

A function written for one example, batched with `pj.vmap` over a `pj.Ragged`
and differentiated with respect to the parameters every example shares, against
the same padded batch under `jax.vmap` (no mask: the floor) and a hand-written
mask (what users write today). Each contender is one compiled call, timed on the
same inputs, interleaved over rounds; the table gives medians and ratios.

* embedding: `sum(tanh(table[toks]))` per sentence, 16 sentences of 3..120
  tokens (padded to 128), dimension 64, vocabulary 1,000 / 5,000 / 20,000;
  gradient with respect to the table.
* lstm: a bare LSTM over 16 sequences of 3..120 steps (padded to 128), input
  64, hidden 64 / 256; forward (sum of final states) and gradient with respect
  to the weights.

    python benchmarks/shared_param_gradients.py [--rounds 7] [--calls 20]

Timings on a shared machine are noisy: rounds interleave the contenders and
the table keeps medians.
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

BATCH, PADDED, DIM = 16, 128, 64


def _batch(rng: np.random.Generator, make: Callable[[int], np.ndarray]) -> pj.Ragged:
  lengths = rng.integers(3, 121, BATCH)
  examples = [make(int(n)) for n in lengths]
  data = np.zeros((BATCH, PADDED) + examples[0].shape[1:], examples[0].dtype)
  for i, x in enumerate(examples):
    data[i, :len(x)] = x
  return pj.Ragged(jnp.asarray(data), jnp.asarray(lengths, jnp.int32))


def _mask(r: pj.Ragged) -> Any:
  return jnp.arange(PADDED)[None, :] < r.lengths[:, None]


# --- embedding ---------------------------------------------------------------

def embedding_one(table: Any, toks: Any) -> Any:
  return jnp.sum(jnp.tanh(table[toks]))


def embedding_contenders(vocab: int, rng: np.random.Generator
                         ) -> tuple[dict[str, Callable[[], Any]], Any]:
  table = jnp.asarray(rng.standard_normal((vocab, DIM)), jnp.float32)
  r = _batch(rng, lambda n: rng.integers(0, vocab, n).astype(np.int32))

  polyjit = jax.jit(jax.grad(lambda t, r: pj.vmap(embedding_one, in_axes=(None, 0))(t, r).sum()))
  plain = jax.jit(jax.grad(lambda t, d: jax.vmap(embedding_one, in_axes=(None, 0))(t, d).sum()))

  def hand_loss(t: Any, d: Any, m: Any) -> Any:
    return jnp.sum(jnp.where(m[..., None], jnp.tanh(t[d]), 0.0))

  hand = jax.jit(jax.grad(hand_loss))
  mask = _mask(r)
  return {"polyjit": lambda: polyjit(table, r), "jax.vmap": lambda: plain(table, r.data),
          "hand mask": lambda: hand(table, r.data, mask)}, None


# --- lstm --------------------------------------------------------------------

def _cell(p: Any, carry: Any, x: Any) -> Any:
  h, c = carry
  g = x @ p["wi"] + h @ p["wh"] + p["b"]
  i, f, o, u = jnp.split(g, 4, axis=-1)
  c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
  h = jax.nn.sigmoid(o) * jnp.tanh(c)
  return h, c


def lstm_one(p: Any, xs: Any) -> Any:
  hidden = p["wh"].shape[0]
  (h, c), _ = lax.scan(lambda carry, x: (_cell(p, carry, x), None),
                       (jnp.zeros(hidden), jnp.zeros(hidden)), xs)
  return jnp.sum(h) + jnp.sum(c)


def lstm_hand(p: Any, xs: Any, m: Any) -> Any:
  """One padded sequence with its mask: the carry kept where the step is padding."""
  hidden = p["wh"].shape[0]

  def step(carry: Any, xm: Any) -> Any:
    x, keep = xm
    new = _cell(p, carry, x)
    return tuple(jnp.where(keep, n, o) for n, o in zip(new, carry)), None

  (h, c), _ = lax.scan(step, (jnp.zeros(hidden), jnp.zeros(hidden)), (xs, m))
  return jnp.sum(h) + jnp.sum(c)


def lstm_contenders(hidden: int, rng: np.random.Generator, grad: bool
                    ) -> dict[str, Callable[[], Any]]:
  n = lambda *s: jnp.asarray(rng.standard_normal(s) / np.sqrt(s[0]), jnp.float32)
  p = {"wi": n(DIM, 4 * hidden), "wh": n(hidden, 4 * hidden), "b": jnp.zeros(4 * hidden)}
  r = _batch(rng, lambda k: rng.standard_normal((k, DIM)).astype(np.float32))
  mask = _mask(r)
  d = jax.grad if grad else (lambda f: f)
  polyjit = jax.jit(d(lambda p, r: pj.vmap(lstm_one, in_axes=(None, 0))(p, r).sum()))
  plain = jax.jit(d(lambda p, x: jax.vmap(lstm_one, in_axes=(None, 0))(p, x).sum()))
  hand = jax.jit(d(lambda p, x, m: jax.vmap(lstm_hand, in_axes=(None, 0, 0))(p, x, m).sum()))
  return {"polyjit": lambda: polyjit(p, r), "jax.vmap": lambda: plain(p, r.data),
          "hand mask": lambda: hand(p, r.data, mask)}


# --- timing ------------------------------------------------------------------

def _time(fn: Callable[[], Any], calls: int) -> float:
  jax.block_until_ready(fn())
  start = time.perf_counter()
  for _ in range(calls):
    jax.block_until_ready(fn())
  return (time.perf_counter() - start) / calls


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--calls", type=int, default=20)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  cases: dict[str, dict[str, Callable[[], Any]]] = {}
  for vocab in (1000, 5000, 20000):
    cases[f"embedding grad, vocab {vocab}"] = embedding_contenders(vocab, rng)[0]
  for hidden in (64, 256):
    cases[f"lstm forward, hidden {hidden}"] = lstm_contenders(hidden, rng, grad=False)
    cases[f"lstm grad, hidden {hidden}"] = lstm_contenders(hidden, rng, grad=True)
  times: dict[tuple[str, str], list[float]] = {}
  for _ in range(args.rounds):
    for case, contenders in cases.items():
      for name, fn in contenders.items():
        times.setdefault((case, name), []).append(_time(fn, args.calls))
  med = {k: float(np.median(v)) for k, v in times.items()}
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, polyjit from "
        f"{pj.__file__}; medians of {args.rounds} rounds x {args.calls} calls")
  print(f"{'case':32s} {'polyjit ms':>11s} {'jax.vmap ms':>12s} {'hand ms':>9s} "
        f"{'/ jax.vmap':>10s} {'/ hand':>7s}")
  for case in cases:
    p, v, h = (med[(case, k)] * 1e3 for k in ("polyjit", "jax.vmap", "hand mask"))
    print(f"{case:32s} {p:11.3f} {v:12.3f} {h:9.3f} {p / v:10.2f} {p / h:7.2f}")


if __name__ == "__main__":
  main()
