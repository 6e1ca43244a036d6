"""Training a small transformer encoder on sentences of different lengths, with optax.

Each example is one unpadded sequence of token ids; the model (embedding, one
self-attention block, a per-token classifier) is written for one sequence and
`pj.vmap` maps it over a `pj.Ragged` batch, each example at its own length: no
masks written by hand. The training step is `jax.jit` of `jax.value_and_grad`;
it compiles once per bucket of the longest sentence in a batch (here 32, 64, 128
or 256), not once per batch. The script checks the first loss against the per-sentence unpadded losses.

    python examples/ragged_transformer.py              # seconds
    python examples/ragged_transformer.py --big        # 300 steps, longer sentences
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import polyjit as pj

VOCAB, DIM = 32, 32
# The padded lengths a batch may take: one training-step program per bucket used.
BUCKETS = pj.buckets.Explicit([32, 64, 128, 256])


def init(key: jax.Array) -> dict[str, jax.Array]:
  k = jax.random.split(key, 6)
  scale = 1 / np.sqrt(DIM)
  return {"embed": jax.random.normal(k[0], (VOCAB, DIM)) * scale,
          "wq": jax.random.normal(k[1], (DIM, DIM)) * scale,
          "wk": jax.random.normal(k[2], (DIM, DIM)) * scale,
          "wv": jax.random.normal(k[3], (DIM, DIM)) * scale,
          "mlp": jax.random.normal(k[4], (DIM, DIM)) * scale,
          "out": jax.random.normal(k[5], (DIM, VOCAB)) * scale}


def loss(params: dict[str, jax.Array], tokens: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-token cross-entropy of one unpadded sentence."""
  x = params["embed"][tokens]
  positions = jnp.arange(tokens.shape[0])[:, None] / 64.0
  x = x + jnp.sin(positions * jnp.arange(DIM)[None, :] / DIM)
  q, k, v = x @ params["wq"], x @ params["wk"], x @ params["wv"]
  attention = jax.nn.softmax(q @ k.T / jnp.sqrt(DIM), axis=-1)
  x = jax.nn.standardize(x + attention @ v, axis=-1)
  x = x + jax.nn.gelu(x @ params["mlp"])
  logits = x @ params["out"]
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def batch_loss(params, tokens: pj.Ragged, labels: pj.Ragged) -> jax.Array:
  return pj.vmap(loss, in_axes=(None, 0, 0))(params, tokens, labels).mean()


def sentences(rng: np.random.Generator, batch: int, max_len: int):
  """A toy task: label each token with the sentence's most frequent token so far."""
  lengths = np.exp(rng.uniform(np.log(4), np.log(max_len), batch)).astype(int)
  tokens = [rng.integers(0, VOCAB, n).astype(np.int32) for n in lengths]
  labels = []
  for t in tokens:
    counts = np.zeros((len(t), VOCAB), np.int32)
    counts[np.arange(len(t)), t] = 1
    labels.append(np.argmax(np.cumsum(counts, axis=0), axis=1).astype(np.int32))
  return tokens, labels


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--big", action="store_true", help="300 steps, sentences up to 256")
  args = parser.parse_args(argv)
  steps, batch, max_len = (300, 32, 256) if args.big else (30, 4, 30)

  rng = np.random.default_rng(0)
  params = init(jax.random.key(0))
  optimizer = optax.adam(1e-2)
  state = optimizer.init(params)

  @jax.jit
  def train_step(params, state, tokens, labels):
    value, grads = jax.value_and_grad(batch_loss)(params, tokens, labels)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value

  start, losses, compiles = time.perf_counter(), [], 0
  for step in range(steps):
    tokens, labels = sentences(rng, batch, max_len)
    with pj.diagnostics.count_compiles() as step_compiles:
      new_params, state, value = train_step(params, state,
                                            pj.Ragged.from_list(tokens, buckets=BUCKETS),
                                            pj.Ragged.from_list(labels, buckets=BUCKETS))
    compiles += len(step_compiles)
    if step == 0:  # the ragged loss is the mean of the unpadded per-sentence losses
      want = np.mean([jax.jit(loss)(params, t, y) for t, y in zip(tokens, labels)])
      np.testing.assert_allclose(value, want, rtol=1e-5)
    params = new_params
    losses.append(float(value))
    if step % max(1, steps // 6) == 0 or step == steps - 1:
      print(f"step {step:3d}  loss {losses[-1]:.3f}  longest sentence "
            f"{max(map(len, tokens)):3d}")
  seconds = time.perf_counter() - start
  print(f"{steps} steps in {seconds:.1f} s, {compiles} compiles of the training step "
        f"(jax.jit padding each batch to its longest sentence compiles once per distinct "
        f"longest length); loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
  main()
