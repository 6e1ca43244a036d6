"""Parameters and values that hold inf in a packed `pj.vmap`.

A contraction of per-token values with parameters (`x @ w`, heads of scores
mixed by a weight) multiplies the zeros of the rows' tails (and of the pairs
off each example's block) by the parameters: an inf there made NaN, which
`tanh` kept and whose derivative reached the parameters' gradient where
each example alone gives finite numbers. Checked against each example alone
under `jax.jit`, values and gradients.

An inf in one example's own values reached its row neighbours through a
product with the scores (zero scores times inf), and so did a NaN cotangent
of one example's attention output (a query that attends to nothing: its
softmax row is NaN) through the values' gradient: the last two tests (more
products in `test_packing_nonfinite_one_example.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _check, _examples, _poison, with_data


def _mixed_heads(w, x):
  """Two heads' scores mixed by `w[0, 2:]` (an inf in it: every score infinite)."""
  q = (x @ w[:, :2]).reshape(x.shape[0], 2, 1)
  k = jnp.tanh(x @ w[:, :2]).reshape(x.shape[0], 2, 1)
  # (held constant: its gradient through an infinite score is NaN alone too)
  scores = jax.lax.stop_gradient(jnp.einsum("qhd,khd->hqk", q, k))
  return jnp.tanh(jnp.einsum("hqk,h->qk", scores, w[0, 2:])) @ x


CASES = {
    "projection": lambda w, x: jnp.tanh(x @ w),
    "mixed_heads": _mixed_heads,
    # the projection used by other ops than an elementwise one: a reduction,
    # a reshape into heads, a product of two projections, a second projection
    "projection_used_whole": lambda w, x: (
        jnp.tanh(jnp.sum(x @ w, axis=0)), jnp.tanh((x @ w).reshape(-1, 2, 2)).sum(1),
        jnp.tanh(jnp.tanh(x @ w[:, 1:]) @ (x @ w[:, 1:]).T) @ x,
        jnp.tanh((x @ w) @ w.T + 1.0)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_inf_in_the_parameters_stays_off_the_tail(name):
  rng = np.random.default_rng(23)
  w = rng.normal(size=(3, 4)).astype(np.float32)
  w[0, 2 if name == "mixed_heads" else 0] = np.inf
  xs = [np.abs(x) + 0.5 for x in _examples(rng)]   # x @ w: +inf, not inf - inf
  _check(CASES[name], jnp.asarray(w), xs)


def test_an_inf_in_one_example_stays_in_that_example():
  rng = np.random.default_rng(24)
  xs = _examples(rng, [9, 5, 1])   # one row of 16
  xs[1][2, 0] = np.inf
  def attend(x):
    return jax.nn.softmax(jnp.tanh(x) @ jnp.tanh(x).T, axis=-1) @ x
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  assert packed.rows == 1
  got = jax.jit(pj.vmap(attend))(packed).to_list()
  for g, x in zip(got, xs, strict=True):
    np.testing.assert_allclose(g, jax.jit(attend)(x), rtol=2e-5, atol=2e-5)


def test_a_nan_row_of_one_example_stays_in_that_example():
  rng = np.random.default_rng(25)
  xs = _examples(rng, [9, 5, 1])   # one row of 16
  xs[1][2, 0] = 100.0   # this query attends to nothing
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))

  def attend(x):
    q = jnp.tanh(x @ w)
    s = jnp.where(x[:, :1] > 50, -jnp.inf, q @ q.T)
    return jnp.sum(jnp.sin(jax.nn.softmax(s, axis=-1) @ x))

  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  assert packed.rows == 1
  # the gradient of the total with respect to every token
  grad = jax.jit(jax.grad(lambda d: jnp.sum(pj.vmap(attend)(with_data(packed, d)))))(packed.data)
  grads = with_data(packed, grad).to_list()
  for i in (0, 2):   # the neighbours: finite alone, and the same here
    np.testing.assert_allclose(grads[i], jax.jit(jax.grad(attend))(xs[i]), rtol=1e-4,
                               atol=1e-4)
