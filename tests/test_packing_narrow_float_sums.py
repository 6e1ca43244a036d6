"""Sums over an example's tokens in float16/bfloat16 accumulate as JAX's do.

A packed batch sums over each example's tokens with a segment sum, a
scatter-add that adds one token at a time in the value's own type. In
bfloat16 a running sum stops growing once a token is below half its unit in
the last place: the sum of 1,500 tokens near 1 came out 512 where JAX's
reduction (accumulated in float32 by XLA, rounded once) gives 1,488. The
same held for the gradient reaching a per-example value broadcast back onto
the tokens (the gather's transpose is such a scatter-add), and for the count
of an extremum's ties in its derivative. Each is compared with the example
alone under `jax.jit`, to a few units in the last place of the narrow type.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

LENGTHS = [700, 300, 5, 1]     # rows of 1024: 700 300 5 1 | ...


def _batch(dtype, rng):
  # positive tokens: their sums grow, so a stalled accumulation shows
  return [jnp.asarray(rng.uniform(0.5, 1.5, size=(n, 3)), dtype) for n in LENGTHS]


def _assert_close(got, want, dtype):
  """Equal to a few units in the last place of `dtype` (the order of the
  additions differs; a stalled sum is off by tens of percent)."""
  tol = 8 * float(jnp.finfo(dtype).eps)
  for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32),
                               rtol=tol, atol=tol)


def _per_example(fun, w, xs, dtype):
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=1024))
  assert packed.rows == 1
  values = jax.jit(pj.vmap(fun, in_axes=(None, 0)))(w, packed)
  for i, x in enumerate(xs):
    _assert_close([v[i] for v in values], jax.jit(fun)(w, x), dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_sum_in_the_narrow_type(dtype):
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(3, 2)), dtype)
  _per_example(lambda w, x: (jnp.sum(x, axis=0, dtype=dtype),
                             jnp.sum(x * w[:, 0], dtype=dtype)), w, _batch(dtype, rng), dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gradient_through_a_per_example_value(dtype):
  """`m` is per example, broadcast onto the tokens: its cotangent is the sum
  of the tokens' (about one per token here)."""
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.uniform(0.5, 1.0, size=(3, 2)), dtype)
  xs = _batch(dtype, rng)

  def fun(w, x):
    m = jnp.max(x @ w, axis=0)                   # per example
    return jnp.sum((x[:, :2] * m).astype(jnp.float32))

  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=1024))
  grad = jax.jit(jax.grad(lambda w: jnp.sum(pj.vmap(fun, in_axes=(None, 0))(w, packed))))(w)
  want = [jax.jit(jax.grad(fun))(w, x) for x in xs]
  _assert_close(grad, sum(np.asarray(g, np.float32) for g in want), dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gradient_of_a_maximum_with_many_ties(dtype):
  """Every token ties for the maximum: the derivative is divided by their
  count (700 for the first example), and by JAX's count."""
  rng = np.random.default_rng(2)
  w = jnp.asarray(rng.uniform(0.5, 1.0, size=(3, 2)), dtype)   # (no cancellation)
  xs = [jnp.ones((n, 3), dtype) for n in LENGTHS]
  fun = lambda w, x: jnp.max(x @ w, axis=0) * jnp.sum(x[:, 0] * w[0, 0], dtype=jnp.float32)
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=1024))
  loss = lambda w: jnp.sum(pj.vmap(fun, in_axes=(None, 0))(w, packed).astype(jnp.float32))
  grad = jax.jit(jax.grad(loss))(w)
  want = sum(np.asarray(jax.jit(jax.grad(lambda w, x: jnp.sum(fun(w, x).astype(jnp.float32))))(w, x),
                        np.float32) for x in xs)
  _assert_close(grad, want, dtype)


def test_contraction_over_the_tokens_in_the_narrow_type():
  dtype = jnp.bfloat16
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(3, 2)), dtype)
  _per_example(lambda w, x: (jax.nn.softmax((x @ w)[:, 0]) @ x, x[:, 0] @ x,
                             x.T @ (x @ w)), w, _batch(dtype, rng), dtype)


def test_gradient_of_a_contraction_over_the_tokens_in_the_narrow_type():
  """The shared parameters' gradient through `softmax(s) @ x` and `x.T @ (x @ w)`
  over 700 bfloat16 tokens: each example's, summed, as `jax.jit` gives it."""
  dtype = jnp.bfloat16
  rng = np.random.default_rng(4)
  w = jnp.asarray(rng.normal(size=(3, 2)), dtype)
  xs = _batch(dtype, rng)
  fun = lambda w, x: jnp.sum((jax.nn.softmax((x @ w)[:, 0]) @ x).astype(jnp.float32)) \
      + jnp.sum((x.T @ (x @ w)).astype(jnp.float32)) * 1e-3
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=1024))
  got = jax.jit(jax.grad(lambda w: jnp.sum(pj.vmap(fun, in_axes=(None, 0))(w, packed))))(w)
  want = sum(np.asarray(jax.jit(jax.grad(fun))(w, x), np.float32) for x in xs)
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0.02, atol=0.02)


def test_sum_of_pair_scores_over_both_axes_in_the_narrow_type():
  """`lax.reduce_sum` of bfloat16 attention scores over both their axes (the
  packed sum goes along each query's row, then over the example's queries as
  a segment sum). The reference is the example alone under `jax.jit` with
  the same sum accumulated in float32 and rounded once: XLA:CPU's own
  bfloat16 reduction over two axes stalls too (1500 x 1500 ones sum to
  262,144), where its reduction over one axis (and `jnp.sum`, which widens)
  accumulates in float32."""
  dtype = jnp.bfloat16
  rng = np.random.default_rng(5)
  w = jnp.asarray(rng.uniform(0.5, 1.0, size=(3, 2)), dtype)
  xs = _batch(dtype, rng)

  def scores(w, x):
    q = x @ w
    return q @ q.T

  fun = lambda w, x: lax.reduce_sum(scores(w, x), (0, 1))
  wide = lambda w, x: lax.reduce_sum(scores(w, x).astype(jnp.float32), (0, 1)).astype(dtype)
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=1024))
  assert packed.rows == 1
  got = jax.jit(pj.vmap(fun, in_axes=(None, 0)))(w, packed)
  for i, x in enumerate(xs):
    _assert_close(got[i], jax.jit(wide)(w, x), dtype)
