"""`jax.custom_jvp` functions in a packed `pj.vmap`.

On attention scores (pairs of tokens): `jax.nn.relu`, `jax.nn.softplus` and
`jax.nn.log_sigmoid` run packed and differentiate (their rule raised an
internal error from inside JAX's differentiation, past `pj.vmap`'s
fallback), and a function returning a token broadcast onto pairs gives each
example's own values (its output was taken as zero off each example's block,
and the other examples' tokens of the row leaked into the product). On
tokens: a rule with no packed evaluation (a loop over the tokens) runs
unpacked with a warning (it raised the packed evaluation's internal refusal
from inside JAX's differentiation: the rule was not tried while tracing, for
the trace's time; now it is where it holds a primitive no packed rule
covers), and a rule that refuses only when JAX runs it raises a
pj.MaskingError naming it. Checked against each example alone under
`jax.jit`, values and gradients (tangents), NaN and inf in the rows' tails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

from test_packing import _check, _examples, _poison


@jax.custom_jvp
def _broadcast_rows(x):
  return jnp.broadcast_to(x[:, None], (x.shape[0], x.shape[0]))


_broadcast_rows.defjvp(lambda p, t: (_broadcast_rows(p[0]), _broadcast_rows(t[0])))


def _scores(w, x):
  return (x @ w) @ jnp.tanh(x @ w).T


CASES = {
    "relu": lambda w, x: jax.nn.relu(_scores(w, x)) @ x,
    "softplus_log_sigmoid": lambda w, x: (jax.nn.softplus(_scores(w, x)) @ x,
                                          jnp.sum(jax.nn.log_sigmoid(_scores(w, x)), axis=1)),
    "returns_a_token_broadcast": lambda w, x: _broadcast_rows(jnp.tanh(x @ w)[:, 0]) @ x,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_custom_jvp_on_pairs_is_exact(name):
  rng = np.random.default_rng(22)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(CASES[name], w, _examples(rng))


@jax.custom_jvp
def _tanh_looping_rule(x):
  return jnp.tanh(x)


@_tanh_looping_rule.defjvp
def _tanh_looping_rule_jvp(primals, tangents):
  (x,), (t,) = primals, tangents   # (a loop over the tokens: not packed)
  total = lax.fori_loop(0, x.shape[0], lambda i, c: c + t[i], jnp.zeros(x.shape[1:]))
  return jnp.tanh(x), t * (1 - jnp.tanh(x) ** 2) + 0.1 * total


def test_a_rule_with_no_packed_evaluation_runs_unpacked():
  """(Forward mode: JAX transposes no loop of a dynamic length.)"""
  rng = np.random.default_rng(25)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  tw = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = _examples(rng)
  fun = lambda w, x: jnp.sum(_tanh_looping_rule(x @ w), axis=0)
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  with pytest.warns(pj.PerformanceWarning, match="'while'"):
    got = jax.jit(lambda w, tw: jax.jvp(
        lambda w: pj.vmap(fun, in_axes=(None, 0))(w, packed), (w,), (tw,)))(w, tw)
  for i, x in enumerate(xs):
    want = jax.jit(lambda w, tw: jax.jvp(lambda w: fun(w, x), (w,), (tw,)))(w, tw)
    for g, r in zip(got, want, strict=True):
      np.testing.assert_allclose(g[i], r, rtol=2e-5, atol=2e-5)


@jax.custom_jvp
def _tanh_pair_rule(x):
  return jnp.tanh(x)


@_tanh_pair_rule.defjvp
def _tanh_pair_rule_jvp(primals, tangents):
  (x,), (t,) = primals, tangents   # (a cumulative sum of pairs of tokens: not packed)
  scale = jnp.sum(jnp.cumsum(jnp.tanh(x @ x.T), axis=0), axis=1)
  return jnp.tanh(x), t * (1 - jnp.tanh(x) ** 2) * scale[:, None]


def test_a_rule_that_refuses_when_jax_runs_it_raises_a_masking_error():
  """Its primitives all have packed or relayout rules, so it is not tried
  while tracing; on pairs of tokens a cumulative sum has none, which only
  JAX's differentiation finds: a pj.MaskingError naming the rule's line and
  saying what to do, not the packed evaluation's internal refusal."""
  rng = np.random.default_rng(26)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = _examples(rng)
  fun = lambda w, x: jnp.sum(_tanh_pair_rule(x @ w), axis=0)
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  with pytest.raises(pj.MaskingError, match="(?s)custom_jvp.*cumsum.*no packing="):
    jax.jvp(lambda w: pj.vmap(fun, in_axes=(None, 0))(w, packed), (w,), (w,))
