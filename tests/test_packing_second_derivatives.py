"""Second derivatives of a packed attention: what the examples alone give.

The derivative products of `packed_block_dot.block_dot` (`P.T @ ct`,
`ct_s @ k`, `ct_s.T @ q`) are block products themselves, guarded, with
block_dot's own derivatives:

- a reverse-mode derivative of the gradient (`jax.grad` of `jax.grad`,
  `jax.jacrev` of `jax.grad`: a gradient penalty, a meta-learning step)
  runs, and matches the examples alone. (A guard whose transpose rule held
  a `lax.while_loop` in plain JAX had none: JAX raised "Reverse-mode
  differentiation does not work for lax.while_loop".)
- a tangent that is not finite where its primal is (`sqrt` at 0 in one
  example's keys) stays in that example: the second derivative's products
  (`ct_s @ dk`) are guarded on their own. (With JAX's derivative of the
  guard, which repairs where the primal product is not finite, the Hessian
  of its row neighbours was NaN where alone it is finite.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _poison, with_data

LENGTHS = [9, 5, 2]   # one row of 16
MARKED = 1


def _attend(w, x):
  q = jnp.tanh(x[:, 1:] @ w)
  return jnp.sum(jnp.tanh(jax.nn.softmax(q @ q.T, axis=-1) @ x))


def _sqrt_keys(w, x):
  """Keys `sqrt(|x|)`: where x is 0 the key is 0, its tangent 0 * inf (NaN)."""
  q = jnp.tanh(x[:, 1:] @ w)
  k = jnp.sqrt(jnp.abs(x[:, 1:]))
  return jnp.sum(jnp.tanh(jnp.tanh(q @ k.T) @ x))


def _inputs():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  w = jnp.asarray(rng.normal(size=(2, 2)).astype(np.float32))
  return w, xs


def _second(kind, f):
  if kind == "hessian":
    return jax.hessian(f)
  if kind == "jacrev_of_grad":
    return jax.jacrev(jax.grad(f))
  return jax.grad(lambda w: jnp.sum(jax.grad(f)(w) ** 2))   # a gradient penalty


@pytest.mark.parametrize("kind", ["hessian", "jacrev_of_grad", "grad_of_gradient_norm"])
def test_second_derivative_wrt_shared_parameters_matches_examples_alone(kind):
  w, xs = _inputs()
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  assert packed.rows < len(xs)
  total = lambda w: jnp.sum(pj.vmap(_attend, in_axes=(None, 0))(w, packed))
  alone = lambda w: sum(_attend(w, x) for x in xs)
  got = jax.jit(_second(kind, total))(w)
  want = jax.jit(_second(kind, alone))(w)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_nonfinite_tangent_of_one_examples_keys_stays_in_its_hessian():
  w, xs = _inputs()
  xs[MARKED][2, 1:] = 0.0
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  assert packed.rows == 1
  total = lambda d: jnp.sum(pj.vmap(_sqrt_keys, in_axes=(None, 0))(w, with_data(packed, d)))
  tokens = packed.rows * 16
  hess = np.asarray(jax.jit(jax.hessian(total))(packed.data)).reshape(tokens, 3, tokens, 3)
  segments = np.asarray(packed.segments).ravel()
  finite = []
  for e, x in enumerate(xs):
    want = np.asarray(jax.jit(jax.hessian(_sqrt_keys, 1))(w, x))
    at = np.flatnonzero(segments == e)
    got = hess[at][:, :, at]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=str(e))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=1e-4,
                               err_msg=str(e))
    finite.append(bool(np.isfinite(want).all()))
  assert finite == [e != MARKED for e in range(len(xs))], finite   # (the case tests a leak)
