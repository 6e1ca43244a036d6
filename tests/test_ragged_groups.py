"""Length groups (`pj.LengthGroups`): a ragged batch in blocks by length.

Checked against a Python loop over the unpadded examples, with NaN and inf in
every block's padding: per-example and ragged outputs, their order, gradients
under `jax.jit(jax.value_and_grad(...))`, and the number of programs compiled
over batches of changing lengths (measured with `jax.monitoring`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

TOL = dict(rtol=2e-5, atol=2e-5)
LENGTHS = [3, 17, 2, 40, 17, 33, 3]   # blocks 2x64, 2x32, 3x16 with groups=3, rows=2


def normal(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


def attention(w, x):                        # one unpadded example (n, 3)
  scores = (x @ w) @ x.T / np.sqrt(3.0)
  return jax.nn.softmax(scores, axis=-1) @ x


def loss(w, x, y):
  return (jnp.mean(attention(w, x)) - y) ** 2


def numpy_attention(w, x):                  # the reference, on the unpadded example
  scores = (x @ w) @ x.T / np.sqrt(3.0)
  e = np.exp(scores - scores.max(axis=-1, keepdims=True))
  return (e / e.sum(axis=-1, keepdims=True)) @ x


def poisoned(batch: pj.GroupedRagged) -> pj.GroupedRagged:
  """The same batch with NaN and inf in every block's padding."""
  def poison(block):
    mask = np.asarray(block.mask)
    garbage = np.where(np.indices(mask.shape).sum(0) % 2, np.nan, np.inf).astype(np.float32)
    return pj.Ragged(np.where(mask, np.asarray(block.data), garbage), block.lengths)
  return pj.GroupedRagged(tuple(poison(b) for b in batch.blocks), batch.order, batch.position,
                          batch.batch_size_per_run)


def make(rng, lengths, **groups):
  xs = [normal(rng, n, 3) for n in lengths]
  batch = pj.Ragged.from_list(xs, groups=pj.LengthGroups(**groups))
  return xs, poisoned(batch)


def test_split_rows_classes_and_order():
  blocks = pj.LengthGroups(groups=3, rows=4).split(np.arange(1, 33) * 16)   # 16..512
  assert [p for _, p in blocks] == [512, 256, 128]
  assert [len(i) for i, _ in blocks] == [16, 8, 8]          # multiples of rows, then the rest
  seen = np.concatenate([i for i, _ in blocks])
  assert sorted(seen) == list(range(32))                    # every example once
  lengths = (np.arange(1, 33) * 16)[seen]
  assert all(np.diff(lengths) <= 0)                         # longest first
  for idx, padded in blocks:
    assert np.max((np.arange(1, 33) * 16)[idx]) <= padded


def test_a_new_layout_waits_in_a_used_one_that_fits():
  groups = pj.LengthGroups(rows=2, patience=2)
  def shapes(lengths):
    return [(len(idx), padded) for idx, padded in groups.layout(lengths)]
  first = shapes([50, 40, 3, 9, 6, 2])
  assert first == [(2, 64), (4, 32)]
  own = [(len(i), p) for i, p in groups.split([20, 3, 9, 4, 6, 2])]
  assert own == [(2, 32), (4, 16)]
  assert shapes([20, 3, 9, 4, 6, 2]) == first          # fits the used layout: no program
  assert shapes([20, 3, 9, 4, 6, 2]) == own            # wanted `patience` times: its own
  assert shapes([60, 50, 45, 9, 6, 2]) == [(4, 64), (2, 32)]   # fits none: its own


def test_outputs_and_gradients_exact_in_order_under_jit():
  rng = np.random.default_rng(0)
  # batch_size=2: blocks of 2 run at once, the block of 3 as lax.map + a remainder
  xs, batch = make(rng, LENGTHS, groups=3, rows=2, batch_size=2)
  assert batch.padded_lengths == (64, 32, 16)
  assert batch.to_list()[3].shape == (40, 3) and np.asarray(batch.lengths).tolist() == LENGTHS
  w, ys = normal(rng, 3, 3), normal(rng, len(xs))

  def total(w, b, y):
    losses = pj.vmap(loss, in_axes=(None, 0, 0))(w, b, y)        # per example
    return losses.mean(), (losses, pj.vmap(attention, in_axes=(None, 0))(w, b))

  step = jax.jit(jax.value_and_grad(total, argnums=(0, 2), has_aux=True))
  (value, (losses, ragged)), (gw, gy) = step(w, batch, ys)
  want = [(numpy_attention(w, x).mean() - y) ** 2 for x, y in zip(xs, ys)]
  np.testing.assert_allclose(losses, want, **TOL)
  assert isinstance(ragged, pj.Ragged)
  assert np.asarray(ragged.lengths).tolist() == LENGTHS
  for got, x in zip(ragged.to_list(), xs):
    np.testing.assert_allclose(got, numpy_attention(w, x), **TOL)
  # The reference: a loop over the unpadded examples (one program, exact shapes).
  want_value, (want_w, want_y) = jax.jit(jax.value_and_grad(
      lambda w, ys: jnp.mean(jnp.stack([loss(w, x, y) for x, y in zip(xs, ys)])),
      argnums=(0, 1)))(w, ys)
  np.testing.assert_allclose(value, want_value, **TOL)
  for got, want in ((gw, want_w), (gy, want_y)):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_programs_follow_block_shapes_across_batches():
  rng = np.random.default_rng(2)
  w = normal(rng, 3, 3)
  step = jax.jit(jax.grad(lambda w, b, y: pj.vmap(loss, in_axes=(None, 0, 0))(w, b, y).mean()))
  shapes, compiled = [], []
  for lengths in ([50, 3, 9, 40, 6, 2], [60, 5, 7, 34, 2, 11],        # 2 long: blocks 2x64, 4x32
                  [60, 44, 39, 8, 2, 11]):                              # 3 long: 4x64, 2x32
    xs = [normal(rng, n, 3) for n in lengths]
    batch = pj.Ragged.from_list(xs, groups=pj.LengthGroups(groups=2, rows=2))
    with pj.diagnostics.count_compiles() as compiles:
      jax.block_until_ready(step(w, batch, normal(rng, len(xs))))
    shapes.append(tuple((b.batch_size, b.padded_lengths) for b in batch.blocks))
    compiled.append(len(compiles))
  assert shapes[0] == shapes[1] and len(set(shapes)) == 2
  assert compiled[1] == 0                                   # same block shapes: no compile
  assert all(c >= 1 for i, c in enumerate(compiled) if shapes[i] not in shapes[:i])


def test_errors_name_what_to_do():
  rng = np.random.default_rng(3)
  xs = [normal(rng, n, 3) for n in (4, 9)]
  groups = pj.LengthGroups(rows=1)
  with pytest.raises(TypeError, match="batch_buckets nor"):
    pj.Ragged.from_list(xs, groups=groups, batch_buckets=8)
  with pytest.raises(pj.ShapeError, match="ragged_axes=2"):
    pj.Ragged.from_list([normal(rng, 2, 2, 3)], ragged_axes=2, groups=groups)
  a, b = (pj.Ragged.from_list(xs, groups=groups) for _ in range(2))
  with pytest.raises(pj.ShapeError, match="one pj.Ragged"):
    pj.vmap(lambda x, y: x.sum() + y.sum())(a, b)
  with pytest.raises(TypeError, match="int >= 1"):
    pj.LengthGroups(rows=0)


@pytest.mark.parametrize("groups", [pj.LengthGroups(), pj.LengthGroups(rows=1),
                                    pj.LengthGroups(batch_size=1)])
def test_a_length_mismatch_names_the_original_example(groups):
  """The blocks run longest first, but the error names the example's index in
  the list it was built from (it named its row in its block)."""
  rng = np.random.default_rng(7)
  xs = pj.Ragged.from_list([normal(rng, n) for n in (2, 6, 3)], groups=groups)
  ys = pj.Ragged.from_list([normal(rng, n) for n in (2, 5, 3)])
  message = (r"(?s)argument 0 and argument 1 are pj.Ragged arguments that <lambda> needs "
             r"with equal lengths, example by example, but example 1 has length 6 in "
             r"argument 0 and length 5 in argument 1\.")
  with pytest.raises(jax.errors.JaxRuntimeError, match=message):
    jax.block_until_ready(pj.vmap(lambda x, y: jnp.sum(x * y))(xs, ys))
