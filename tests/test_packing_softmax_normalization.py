"""Softmax's normalization `e / sum(e)` on packed attention scores.

`packed_pairs._normalize` divides the scores' exponentials by their row sums
kept per token, with no guard of the pairs between examples before the
division (only its result is selected): exact because the row sum of
non-negative terms is 0 only where every valid term of the row is 0, and NaN
only where one is. Those rows are NaN for the example alone too, and must stay
in their example: its neighbours in the row keep their values and gradients.
The tests make such rows in one example (a query whose scores are all -inf,
or whose exponentials all underflow), mask that query's output as code
masks a padding query, and compare each example's value and gradient with
that example alone under `jax.jit`, the unused tail of every row holding NaN
and inf. (Unmasked, the NaN output's cotangent stays in its example too:
`test_packing_nonfinite_values.py` and `test_packing_nonfinite_one_example.py`.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _eqns, _poison, assert_each_example_as_alone

LENGTHS = [5, 3, 9, 13, 2, 7, 4]
MARKED = 2   # the example whose marked queries make degenerate rows


def _scores(w, x):
  q = jnp.tanh(x @ w)   # (bounded: the marked token's large feature overflows nothing)
  return q @ q.T / 2


def _marked(x):
  return x[:, :1] > 50


def _masked_query(w, x):
  """A marked query attends to nothing (-inf): its softmax row is NaN, and its
  output is masked, as code masks a query that is padding."""
  s = jnp.where(_marked(x), -jnp.inf, _scores(w, x))
  out = jnp.where(_marked(x), 0.0, jax.nn.softmax(s, axis=-1) @ (x @ w))
  return jnp.sum(jnp.sin(out))


def _underflow(w, x):
  """No max subtracted: a marked query's exponentials are all 0, its row sum 0."""
  e = jnp.exp(_scores(w, x) - 1e4 * _marked(x))
  out = jnp.where(_marked(x), 0.0, (e / jnp.sum(e, axis=-1, keepdims=True)) @ (x @ w))
  return jnp.sum(jnp.sin(out))


def _multihead(w, x):
  """Heads (2, n, n) with a masked query in one head."""
  q = jnp.tanh(x @ w).reshape(-1, 2, 2)
  s = jnp.einsum("qhd,khd->hqk", q, q)
  s = jnp.where(_marked(x)[None] & (jnp.arange(2) == 1)[:, None, None], -jnp.inf, s)
  out = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(s, axis=-1), q)
  return jnp.sum(jnp.sin(jnp.where(_marked(x)[:, :, None], 0.0, out)))


FUNCTIONS = {"masked_query": _masked_query, "underflow": _underflow, "multihead": _multihead}


def _batch(rng):
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  xs[MARKED][1, 0] = 100.0   # one query of one example
  return xs


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_degenerate_rows_stay_in_their_example(name):
  """Each example's value, and the gradient of the batch's total with respect
  to each example's tokens, as that example alone gives. (With respect to a
  shared parameter the total's gradient is NaN once one example's is, with
  `jax.vmap` too: the tokens' gradients are where a leak would show.)"""
  fun = FUNCTIONS[name]
  rng = np.random.default_rng(3)
  xs = _batch(rng)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  assert_each_example_as_alone(fun, w, xs, MARKED)


def test_softmax_keeps_its_denominator_per_token():
  """The division's derivative keeps `sum(e) ** -2` per token, not per pair
  (the general rule's guard made it a pair-sized array)."""
  rng = np.random.default_rng(4)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16))
  attend = pj.vmap(lambda w, x: jax.nn.softmax(_scores(w, x), axis=-1) @ x, in_axes=(None, 0))
  jaxpr = jax.make_jaxpr(jax.grad(lambda w: jnp.sum(attend(w, packed).data)))(w)
  pows = [e.outvars[0].aval.shape for e in _eqns(jaxpr.jaxpr)
          if e.primitive.name == "integer_pow"]
  assert pows and all(s[-1] == 1 for s in pows), pows


def test_forward_mode_and_second_order_through_the_normalization():
  """Through the quotient's select on the valid pairs (`_normalize`):
  `jax.jvp`, `jax.jacfwd` and a Hessian-vector product of packed attention
  equal the sum over the examples run alone."""
  rng = np.random.default_rng(5)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  t = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))

  def attend(w, x):
    q = x @ w
    return jnp.sum(jnp.sin(jax.nn.softmax(q @ q.T / 2, axis=-1) @ q))

  def checks(total):
    return (jax.jvp(total, (w,), (t,))[1], jax.jacfwd(total)(w),
            jax.jvp(jax.grad(total), (w,), (t,))[1])

  got = jax.jit(lambda: checks(lambda w: jnp.sum(pj.vmap(attend, in_axes=(None, 0))(w, packed))))()
  want = jax.jit(lambda: checks(lambda w: sum(attend(w, x) for x in xs)))()
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-3)
