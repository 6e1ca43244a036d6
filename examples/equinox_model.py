"""An Equinox GRU trained on sequences of different lengths, with pj.vmap.

The model is an ordinary `eqx.Module` (a `GRUCell` scanned over one unpadded
sequence, then a `Linear` head) and is written for one sequence. `pj.vmap` maps
it over a `pj.Ragged` batch, each sequence at its own length, inside Equinox's
own `eqx.filter_jit` and `eqx.filter_value_and_grad`: the module's non-array
leaves (activation functions, sizes) stay static as usual, and the step compiles
once per bucket of the longest sequence, not once per batch. The script checks
the first loss against the per-sequence unpadded losses.

    python examples/equinox_model.py             # seconds
    python examples/equinox_model.py --big       # 200 steps, sequences up to 400
"""

from __future__ import annotations

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import polyjit as pj


# The padded lengths a batch may take: one training-step program per bucket used.
BUCKETS = pj.buckets.Explicit([32, 64, 128, 256, 512])


class GRURegressor(eqx.Module):
  cell: eqx.nn.GRUCell
  head: eqx.nn.Linear

  def __init__(self, features: int, hidden: int, key: jax.Array):
    k1, k2 = jax.random.split(key)
    self.cell = eqx.nn.GRUCell(features, hidden, key=k1)
    self.head = eqx.nn.Linear(hidden, "scalar", key=k2)

  def __call__(self, xs: jax.Array) -> jax.Array:
    """One unpadded sequence `(length, features)` -> a scalar prediction."""
    def step(h, x):
      return self.cell(x, h), None
    h, _ = jax.lax.scan(step, jnp.zeros(self.cell.hidden_size), xs)
    return self.head(h)


def sequence_loss(model: GRURegressor, xs: jax.Array, y: jax.Array) -> jax.Array:
  return (model(xs) - y) ** 2


def batch_loss(model: GRURegressor, xs: pj.Ragged, ys: jax.Array) -> jax.Array:
  return pj.vmap(sequence_loss, in_axes=(None, 0, 0))(model, xs, ys).mean()


def batch(rng: np.random.Generator, size: int, max_len: int):
  """Target: the mean of the first feature over the whole sequence."""
  lengths = rng.integers(3, max_len, size)
  xs = [rng.standard_normal((n, 2)).astype(np.float32) for n in lengths]
  ys = np.array([x[:, 0].mean() for x in xs], np.float32)
  return xs, ys


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--big", action="store_true", help="200 steps, sequences up to 400")
  args = parser.parse_args(argv)
  steps, size, max_len = (200, 32, 400) if args.big else (25, 8, 30)

  rng = np.random.default_rng(0)
  model = GRURegressor(2, 16, jax.random.key(0))
  optimizer = optax.adam(1e-2)
  state = optimizer.init(eqx.filter(model, eqx.is_array))

  @eqx.filter_jit
  def train_step(model, state, xs, ys):
    value, grads = eqx.filter_value_and_grad(batch_loss)(model, xs, ys)
    updates, state = optimizer.update(grads, state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), state, value

  start, compiles, losses = time.perf_counter(), 0, []
  for step in range(steps):
    xs, ys = batch(rng, size, max_len)
    with pj.diagnostics.count_compiles() as step_compiles:
      new_model, state, value = train_step(model, state,
                                           pj.Ragged.from_list(xs, buckets=BUCKETS), ys)
    compiles += len(step_compiles)
    if step == 0:
      per_sequence = eqx.filter_jit(sequence_loss)
      want = np.mean([per_sequence(model, x, y) for x, y in zip(xs, ys)])
      np.testing.assert_allclose(value, want, rtol=1e-5)
    model = new_model
    losses.append(float(value))
  seconds = time.perf_counter() - start
  print(f"{steps} steps in {seconds:.1f} s, {compiles} compiles of the training step; "
        f"mean loss of the first 5 steps {np.mean(losses[:5]):.4f}, "
        f"of the last 5 {np.mean(losses[-5:]):.4f}")


if __name__ == "__main__":
  main()
