"""Softmax on packed attention scores: its max shift, and its product with the values.

`packed_pairs._shift` computes `jax.nn.softmax`'s `s - max(s)` (the maximum
under `stop_gradient`) with the scores off each example's block -inf before
the maximum and the difference both, so that XLA reads the scores once for
the maximum and the `exp`; off the blocks the difference is then NaN in the
rows whose maximum is not finite (the tail's, a query whose scores are all
-inf, or one NaN). `softmax(s) @ v` is the product of the quotient
`e / sum(e)` (`packed_pairs._normalize`) with the values, differentiated as
JAX differentiates it. Both must keep each example exact: values and
gradients against each example alone under `jax.jit`, the unused tail of every row NaN and inf,
rows with no finite maximum (all -inf, a NaN, a +inf score) and row sums
that are 0 or overflow; forward mode and second order too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _eqns, _poison, assert_each_example_as_alone

LENGTHS = [5, 3, 9, 13, 1, 7, 4, 2]
MARKED = 2   # the example whose marked query makes a degenerate row


def _scores(w, x):
  q = jnp.tanh(x @ w)   # (bounded: the marked token's large feature overflows nothing)
  return q @ q.T / 2


def _marked(x):
  return x[:, :1] > 50


def _attend(fill):
  """The marked query's scores all `fill` (its softmax row NaN for the example
  alone), its output masked as code masks a padding query."""
  def fun(w, x):
    s = jnp.where(_marked(x), fill, _scores(w, x))
    out = jnp.where(_marked(x), 0.0, jax.nn.softmax(s, axis=-1) @ (x @ w))
    return jnp.sum(jnp.sin(out))
  return fun


def _one_nan_score(w, x):
  """One score of the marked query NaN: its row's maximum is NaN."""
  s = _scores(w, x)
  s = jnp.where(_marked(x) & (jnp.arange(x.shape[0]) == 0)[None], jnp.nan, s)
  out = jnp.where(_marked(x), 0.0, jax.nn.softmax(s, axis=-1) @ (x @ w))
  return jnp.sum(jnp.sin(out))


def _heads_on_the_left(w, x):
  """Heads (2, n, n), the quotient the left operand (`hqk,khd->hqd`), one head
  of the marked query all -inf."""
  q = jnp.tanh(x @ w).reshape(-1, 2, 2)
  s = jnp.einsum("qhd,khd->hqk", q, q)
  s = jnp.where(_marked(x)[None] & (jnp.arange(2) == 1)[:, None, None], -jnp.inf, s)
  out = jnp.einsum("hqk,khd->hqd", jax.nn.softmax(s, axis=-1), q)
  return jnp.sum(jnp.sin(jnp.where(_marked(x)[None], 0.0, out)))


def _overflowing_sum(w, x):
  """No maximum subtracted: the marked query's exponentials are finite but
  their row sum overflows (its softmax row 0, finite, alone too)."""
  s = _scores(w, x)
  e = jnp.exp(jnp.where(_marked(x), 0.01 * s + 87.5, s))   # (each about 1e38)
  out = (e / jnp.sum(e, axis=-1, keepdims=True)) @ (x @ w)
  return jnp.sum(jnp.sin(out))


def _weights_read_twice(w, x):
  """The quotient in the product with the values and in an entropy."""
  p = jax.nn.softmax(jnp.where(_marked(x), -jnp.inf, _scores(w, x)), axis=-1)
  out = jnp.where(_marked(x), 0.0, p @ (x @ w))
  ent = jnp.sum(jnp.where(_marked(x), 0.0, p * jnp.tanh(_scores(w, x))))
  return jnp.sum(jnp.sin(out)) + ent


def _row_sums_per_token(w, x):
  """softmax's steps written out, the row sums read as a per-token value (a
  product with a projection of the tokens: on the tail of the rows too)."""
  s = _scores(w, x)
  e = jnp.exp(s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
  z = jnp.sum(e, axis=-1, keepdims=True)
  return jnp.sum(jnp.sin(z * (x @ w))) + jnp.sum(jnp.sin((e / z) @ (x @ w)))


FUNCTIONS = {"all_minus_inf": _attend(-jnp.inf), "all_plus_inf": _attend(jnp.inf),
             "one_nan_score": _one_nan_score, "heads_on_the_left": _heads_on_the_left,
             "overflowing_sum": _overflowing_sum, "weights_read_twice": _weights_read_twice,
             "row_sums_per_token": _row_sums_per_token}


def _batch(rng, lengths=LENGTHS):
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in lengths]
  xs[MARKED][1, 0] = 100.0   # one query of one example
  return xs


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_rows_with_no_finite_maximum_stay_in_their_example(name):
  """Each example's value, and the gradient of the batch's total with respect
  to each example's tokens, as that example alone gives (NaN where it does)."""
  fun = FUNCTIONS[name]
  rng = np.random.default_rng(7)
  xs = _batch(rng)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  assert_each_example_as_alone(fun, w, xs, MARKED)


@pytest.mark.parametrize("name", ["heads_on_the_left", "weights_read_twice",
                                  "row_sums_per_token"])
def test_parameter_gradients_forward_mode_and_second_order(name):
  """With no degenerate row: the gradient with respect to a shared parameter,
  `jax.jvp` and a Hessian-vector product equal the sum over the examples
  alone (the quotient's factor carries `z`'s derivative at every order)."""
  fun = FUNCTIONS[name]
  rng = np.random.default_rng(8)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  t = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))

  def checks(total):
    return (jax.grad(total)(w), jax.jvp(total, (w,), (t,))[1],
            jax.jvp(jax.grad(total), (w,), (t,))[1])

  got = jax.jit(lambda: checks(lambda w: jnp.sum(pj.vmap(fun, in_axes=(None, 0))(w, packed))))()
  want = jax.jit(lambda: checks(lambda w: sum(fun(w, x) for x in xs)))()
  for g, r in zip(got, want, strict=True):
    np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-3)


def _attention(w, x):
  q = jnp.tanh(x @ w).reshape(-1, 2, 2)
  s = jnp.einsum("qhd,khd->hqk", q, q)
  return jnp.sum(jnp.sin(jnp.einsum("hqk,khd->qhd", jax.nn.softmax(s, axis=-1), q)))


def _packed_grad_jaxpr():
  rng = np.random.default_rng(9)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16))
  attend = pj.vmap(_attention, in_axes=(None, 0))
  return jax.make_jaxpr(jax.grad(lambda w: jnp.sum(attend(w, packed))))(w), packed


def _pair_sized(var, packed):
  return getattr(var.aval, "shape", ())[-2:] == (packed.row_length, packed.row_length)


def test_softmax_derivative_sums_one_score_sized_product():
  """Two sums over a score-sized array: the forward pass's `sum(e)`, and in
  the backward pass the row sums of `e` times the quotient's cotangent (JAX's
  softmax derivative sums `p * g` as well; computed per token as
  `ct . (p @ v)`, its rounding was not JAX's where the softmax saturates:
  tests/test_packing_saturated_softmax_gradient.py). No other."""
  jaxpr, packed = _packed_grad_jaxpr()
  sums = [e for e in _eqns(jaxpr.jaxpr)
          if e.primitive.name == "reduce_sum" and _pair_sized(e.invars[0], packed)]
  assert len(sums) == 2, [e.invars[0].aval for e in sums]


def test_softmax_exp_takes_the_shifted_scores_unselected():
  """`exp` reads `s - max` as the maximum's reduction leaves it (XLA fuses the
  two): no select of the scores between them."""
  jaxpr, packed = _packed_grad_jaxpr()
  eqns = list(_eqns(jaxpr.jaxpr))
  made = {o: e for e in eqns for o in e.outvars}
  exps = [e for e in eqns if e.primitive.name == "exp" and _pair_sized(e.invars[0], packed)]
  assert exps and all(made[e.invars[0]].primitive.name == "sub" for e in exps)
