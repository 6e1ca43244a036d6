"""One example's inf or NaN stays in that example through the products per row.

A packed `pj.vmap` runs attention as one dense product per row
(`polyjit/_ragged/packed_block_dot.py`): the pairs of two examples of a row
add `0 * x` terms, NaN where `x` is inf or NaN. Here one example of a row
(`MARKED`) holds an inf among its values, keys or a NaN row of scores (a
query with no key), and each case checks, eagerly and under `jax.jit`, that
every example's value, its derivative with respect to the shared parameters
(its row of `jax.jacfwd`: the products' forward mode), the gradient of the
batch's total with respect to its tokens, and to the parameters, are what
that example alone gives under `jax.jit`: finite for its row neighbours. The
products: `P @ v` and its derivative products (`P.T @ ct`, `ct @ v.T`),
`scores.T @ v`, heads in einsum layouts, a causal mask, `q @ k.T`'s
derivative products (`ct_s @ k`), and the backward pass written in the
function itself (`jax.grad` inside, a training step's products).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _poison, with_data

LENGTHS = [9, 5, 2]   # one row of 16, the marked example between the others
MARKED = 1


def _softmax_attend(s, v):
  return jnp.sum(jnp.tanh(jax.nn.softmax(s, axis=-1) @ v))


def _values_inf(w, x):
  """An inf in the values (`x[:, 0]`), the scores finite."""
  q = jnp.tanh(x[:, 1:] @ w)
  return _softmax_attend(q @ q.T, x)


def _query_without_key(w, x):
  """A query that attends to nothing: its softmax row NaN, and the cotangent
  of its output too."""
  q = jnp.tanh(x[:, 1:] @ w)
  s = jnp.where(x[:, :1] > 50, -jnp.inf, q @ q.T)
  return jnp.sum(jnp.sin(jax.nn.softmax(s, axis=-1) @ x[:, 1:]))


def _transposed_scores(w, x):
  """A product along the first axis of the scores (`scores.T @ v`)."""
  q = jnp.tanh(x[:, 1:] @ w)
  return jnp.sum(jnp.tanh(jnp.tanh(q @ q.T).T @ x))


def _heads(w, x):
  """Two heads in Flax's layout: `qhd,khd->hqk` then `hqk,khd->qhd`."""
  q = jnp.tanh(x[:, 1:] @ w).reshape(x.shape[0], 2, 1)
  v = x[:, :2].reshape(x.shape[0], 2, 1)   # (n, heads, 1), the inf in head 0
  s = jnp.einsum("qhd,khd->hqk", q, q)
  return jnp.sum(jnp.tanh(jnp.einsum("hqk,khd->qhd", jax.nn.softmax(s, axis=-1), v)))


def _causal(w, x):
  q = jnp.tanh(x[:, 1:] @ w)
  n = x.shape[0]
  s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), q @ q.T, -jnp.inf)
  return _softmax_attend(s, x)


def _keys_inf(w, x):
  """An inf in the keys: the scores' derivative products `ct_s @ k` and
  `ct_s.T @ q` meet it."""
  q = jnp.tanh(x[:, 1:] @ w)
  return jnp.sum(jnp.tanh(jnp.tanh(q @ x[:, :2].T) @ jnp.tanh(x)))


def _grad_inside(w, x):
  """The backward pass in the function (a training step's): `P.T @ ct` and
  `ct @ v.T` as products of the jaxpr."""
  g = jax.grad(_values_inf, argnums=(0, 1))(w, x)
  return jnp.sum(jnp.tanh(g[0])) + jnp.sum(jnp.tanh(g[1]))


CASES = {
    "values_inf": (_values_inf, (2, 0, np.inf)),
    "query_without_key": (_query_without_key, (2, 0, 100.0)),
    "transposed_scores": (_transposed_scores, (2, 0, np.inf)),
    "heads": (_heads, (2, 0, np.inf)),
    "causal": (_causal, (3, 0, -np.inf)),
    "keys_inf": (_keys_inf, (2, 0, np.inf)),
    "grad_inside": (_grad_inside, (2, 0, np.inf)),
}


#: Several rows, two marked examples in rows that are neither the first nor
#: the last (the exact products run only in the rows that are not all finite).
ROWS_LENGTHS = (14, 12, 9, 5, 2, 11, 4, 13, 3)
ROWS_MARKED = (5, 7)


def _inputs(where, lengths=tuple(LENGTHS), marked=(MARKED,)):
  rng = np.random.default_rng(31)
  w = jnp.asarray(rng.normal(size=(2, 2)).astype(np.float32))
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in lengths]
  for m in marked:
    xs[m][where[:2]] = where[2]
  return w, xs


@functools.cache
def _alone(name, lengths=tuple(LENGTHS), marked=(MARKED,)):
  """Each example alone under jax.jit: its value, gradient (w, x) and forward
  mode (its NaN are not always reverse mode's). One program per case, which
  the jit and the eager test share (the same inputs: `_inputs`), compiled at
  XLA's default options."""
  fun, where = CASES[name]
  w, xs = _inputs(where, lengths, marked)
  alone = jax.jit(lambda w, xs: [(fun(w, x), jax.grad(fun, (0, 1))(w, x), jax.jacfwd(fun)(w, x))
                                 for x in xs])(w, xs)
  return jax.tree.map(np.asarray, alone)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_one_examples_nonfinite_values_stay_in_that_example(name, jit):
  _check_as_alone(name, jit, tuple(LENGTHS), (MARKED,))


@pytest.mark.parametrize("name", ["values_inf", "keys_inf", "causal", "grad_inside"])
def test_nonfinite_examples_in_middle_rows_stay_there(name):
  """Two marked examples in two rows of several, neither the first nor the
  last: each row's exact product is taken where it is needed, the rows
  between and around them keep the dense one's values."""
  _check_as_alone(name, True, ROWS_LENGTHS, ROWS_MARKED)


def _check_as_alone(name, jit, lengths, marked):
  fun, where = CASES[name]
  w, xs = _inputs(where, lengths, marked)
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  assert packed.rows < len(xs)
  if len(marked) > 1:   # (the layout the case is about)
    rows = np.asarray(packed.segments).reshape(packed.rows, -1)
    where_marked = sorted({int(np.flatnonzero((rows == m).any(axis=1))[0]) for m in marked})
    assert len(where_marked) == len(marked) and 0 < where_marked[0], where_marked
    assert where_marked[-1] < packed.rows - 1 and where_marked[1] - where_marked[0] > 1, where_marked
  vmapped = lambda w, data: pj.vmap(fun, in_axes=(None, 0))(w, with_data(packed, data))
  total = lambda w, data: jnp.sum(vmapped(w, data))

  def packed_run(w, data):
    # per example with respect to the shared parameters: forward mode (in
    # reverse mode, an example's zero cotangent times its own NaN derivatives
    # is NaN in every example's row, under `jax.vmap` too: the total's)
    return vmapped(w, data), jax.jacfwd(vmapped)(w, data), jax.grad(total, (0, 1))(w, data)

  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)   # (packed, not a fallback)
    values, jac_fwd, (grad_w, grad_x) = (jax.jit(packed_run) if jit else packed_run)(
        w, packed.data)
  grads = with_data(packed, grad_x).to_list()

  alone = _alone(name, lengths, marked)
  for i, (value, (dw, dx), fwd) in enumerate(alone):
    np.testing.assert_allclose(values[i], value, rtol=2e-5, atol=2e-5, err_msg=str(i))
    np.testing.assert_allclose(jac_fwd[i], fwd, rtol=1e-4, atol=1e-4, err_msg=str(i))
    np.testing.assert_allclose(grads[i], dx, rtol=1e-4, atol=1e-4, err_msg=str(i))
  np.testing.assert_allclose(grad_w, sum(dw for _, (dw, _), _ in alone), rtol=1e-4, atol=1e-4)
  # the neighbours are finite alone (the case tests a leak), the marked one not
  finite = [bool(np.isfinite(v) and np.isfinite(dw).all() and np.isfinite(dx).all())
            for v, (dw, dx), _ in alone]
  assert finite == [i not in marked for i in range(len(xs))], finite
