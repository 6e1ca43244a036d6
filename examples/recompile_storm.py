"""Diagnosing a real recompile storm with pj.watch, then fixing it with pj.jit.

A typical evaluation loop over a text dataset: sentences are batched and each
batch is padded to its longest sentence (what most input pipelines do), the
last batch is smaller, and a `jax.jit` of a `functools.partial` is created in
the loop to pass a temperature. Every batch recompiles. `pj.watch` names the
two causes: the axes that vary (with the bucket trade-off for the sizes seen)
and the function re-created in the loop. The fix: create the function once and
give `pj.jit` the unpadded sentences; `pj.assert_max_compiles` then holds it to
a budget.

    python examples/recompile_storm.py           # seconds
    python examples/recompile_storm.py --big     # 2,000 sentences
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj

DIM = 16


def score(tokens: jax.Array, mask: jax.Array, table: jax.Array, temperature: float) -> jax.Array:
  """Mean embedding of each padded sentence, scored with a temperature."""
  emb = table[tokens] * mask[..., None]
  pooled = emb.sum(axis=1) / mask.sum(axis=1, keepdims=True)
  return jax.nn.log_softmax(pooled / temperature, axis=-1)


def score_one(tokens: jax.Array, table: jax.Array) -> jax.Array:
  """The same for one unpadded sentence: no mask needed."""
  return jax.nn.log_softmax(table[tokens].mean(axis=0) / 0.7, axis=-1)


def padded_batches(sentences: list[np.ndarray], batch: int):
  for i in range(0, len(sentences), batch):
    chunk = sentences[i:i + batch]
    longest = max(map(len, chunk))
    tokens = np.zeros((len(chunk), longest), np.int32)
    mask = np.zeros((len(chunk), longest), np.float32)
    for row, s in enumerate(chunk):
      tokens[row, :len(s)], mask[row, :len(s)] = s, 1
    yield tokens, mask


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--big", action="store_true", help="2,000 sentences")
  args = parser.parse_args(argv)
  n_sentences, batch = (2000, 32) if args.big else (64, 16)

  rng = np.random.default_rng(0)
  table = jnp.asarray(rng.standard_normal((100, DIM)).astype(np.float32))
  sentences = [rng.integers(0, 100, n).astype(np.int32)
               for n in rng.zipf(1.5, n_sentences).clip(2, 120)]

  print("== the storm, under pj.watch ==")
  with pj.watch() as report:
    for tokens, mask in padded_batches(sentences, batch):
      scorer = jax.jit(functools.partial(score, temperature=0.7))  # re-created every batch
      scorer(tokens, mask, table)
  print(report)

  print("\n== padded per batch, the function created once ==")
  scorer = jax.jit(functools.partial(score, temperature=0.7))
  with pj.watch() as report:
    for tokens, mask in padded_batches(sentences, batch):
      scorer(tokens, mask, table)
  print(report)

  print("\n== the fix: pj.jit on unpadded sentences, within a compile budget ==")
  fixed = pj.jit(score_one)
  reference = jax.jit(score_one)
  with pj.assert_max_compiles(8):
    results = [fixed(s, table) for s in sentences]
  for s, got in zip(sentences[:5], results):  # same values as jax.jit, sentence by sentence
    np.testing.assert_allclose(got, reference(s, table), rtol=1e-5, atol=1e-6)
  print(pj.explain(fixed))


if __name__ == "__main__":
  main()
