"""The gradient of a max/min over the tokens of packed examples is JAX's.

The derivative of a maximum divides the tangent among the positions that
reach it. The packed rule found them as `x == max`, where XLA computed `x`
again in another fused loop than the segment maximum's and rounded it
otherwise (XLA:CPU contracted the multiply-add into an FMA in one loop and
not in the other): in a jitted training step of
`jnp.max(x[:, :, None] + x[:, None, :] * s, axis=0)` positions that reach
the maximum were missed, and the gradient lost terms (73.6 for 83.1).
Compared with `jax.grad` of each example alone in float64, random values (no
ties) and small integers (many ties), NaN and inf in the unused tail.

A NaN maximum equals no position: JAX's derivative is 0/0 = NaN (eagerly),
and the packed rule's count, clamped to 1, made it a silent 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _poison


def max_loss(s, x):
  return jnp.sum(jnp.max(x[:, :, None] + x[:, None, :] * s, axis=0))


def min_loss(s, x):
  return jnp.sum(jnp.min(x[:, :, None] * s - x[:, None, :], axis=0) ** 2)


def _examples(kind):
  rng = np.random.default_rng(5)
  lengths = (33, 30, 16, 6, 40, 9)
  if kind == "ties":
    return [rng.integers(-3, 4, (n, 5)).astype(np.float32) for n in lengths]
  return [rng.uniform(-1, 1, (n, 5)).astype(np.float32) for n in lengths]


def _want(f, s, examples):
  """The value and gradient of each example alone, summed, in float64."""
  with jax.enable_x64():
    one = jax.jit(jax.value_and_grad(f))
    got = [one(np.float64(s), np.asarray(x, np.float64)) for x in examples]
    return sum(float(v) for v, _ in got), sum(float(g) for _, g in got)


@pytest.mark.parametrize("f", [max_loss, min_loss])
def test_jitted_packed_training_step(f):
  step = jax.jit(jax.value_and_grad(lambda s, b: pj.vmap(f, in_axes=(None, 0))(s, b).sum()))
  for kind in ("random", "ties"):   # (equal lengths: one program)
    examples = _examples(kind)
    batch = _poison(pj.Ragged.from_list(examples, packing=pj.Packing(row_length=64)))
    for s in (0.3, -1.25):
      value, grad = step(np.float32(s), batch)
      want_value, want_grad = _want(f, s, examples)
      np.testing.assert_allclose(grad, want_grad, rtol=1e-4, err_msg=kind)
      np.testing.assert_allclose(value, want_value, rtol=1e-5, err_msg=kind)


def test_a_nan_maximum_has_a_nan_gradient_as_jax():
  def f(w, x):
    return jnp.max(x + w) + jnp.min(x - 2 * w)

  examples = [np.array([1.0, np.nan, 2.0], np.float32), np.array([3.0, 1.0], np.float32),
              np.array([np.nan, 1.0], np.float32)]
  w = np.float32(1.5)
  batch = _poison(pj.Ragged.from_list(examples, packing=pj.Packing(row_length=8)))
  got = jax.grad(lambda w: pj.vmap(f, in_axes=(None, 0))(w, batch).sum())(w)
  wants = [jax.grad(f)(w, x) for x in examples]
  assert np.isnan(wants[0]) and np.isnan(wants[2]) and wants[1] == -1.0
  assert np.isnan(got)
  # the NaN stays in its example: the others' gradient is theirs
  clean = _poison(pj.Ragged.from_list(examples[1:2] * 3, packing=pj.Packing(row_length=8)))
  assert jax.grad(lambda w: pj.vmap(f, in_axes=(None, 0))(w, clean).sum())(w) == -3.0


def test_ties_over_the_tokens_and_another_axis_share_the_derivative_equally():
  """`jnp.max` of an (n, 2) value: three tied positions, two in one token,
  with derivatives 0, 2 and 4 in `w`: JAX gives each a third (2.0); divided
  per token first, then among the tokens, 1/4, 1/4, 1/2 (2.5)."""
  def f(w, x):
    return jnp.max(x[:, :2] + x[:, 2:] * w)

  examples = [np.array([[1, -1, 0, 2], [-3, 0, 4, 0]], np.float32),
              np.array([[0.5, 0, 0, 0]], np.float32)]
  w = np.float32(1.0)
  batch = _poison(pj.Ragged.from_list(examples, packing=pj.Packing(row_length=8)))
  got = jax.grad(lambda w: pj.vmap(f, in_axes=(None, 0))(w, batch).sum())(w)
  want = sum(jax.grad(f)(w, x) for x in examples)
  assert want == 2.0
  np.testing.assert_allclose(got, want)
