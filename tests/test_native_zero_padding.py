"""Native mode skips the zero fill of a contraction's operand whose padding is
already exactly zero (`_masking/native_zeros.py`).

Both halves: the fact is proven only where it holds (a product with a
NaN-padded value, a bias added, a function input are *not* zero-padded; a
literal-zero broadcast, a segment_sum into zeros, a relu or tanh of zeros,
x[i] in native mode are; a concatenation of both kinds has only its other
parts filled), and gradients stay exact and finite with NaN/inf
padding in every input, including where the fill was skipped and where a
wrong fact would skip it (checked by forcing the fact: then they break).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._masking import native_zeros

GARBAGE = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30], np.float32)
NODES, EDGES, D = (3, 1, 6, 4), (4, 2, 9, 1), 3
PAD_N, PAD_E = 8, 12


def _facts(fun, *shapes):
  """`jaxpr_outputs` of `fun` traced at symbolic shapes, inputs unknown."""
  n, m = jax.export.symbolic_shape("n, m")
  avals = [jax.ShapeDtypeStruct(tuple({"n": n, "m": m}.get(d, d) for d in s),
                                jnp.int32 if i else jnp.float32)
           for i, s in enumerate(shapes)]
  jaxpr = jax.make_jaxpr(fun)(*avals).jaxpr
  return native_zeros.jaxpr_outputs(jaxpr, [False] * len(jaxpr.invars))


ZERO = lambda x, e: jnp.zeros_like(x)


@pytest.mark.parametrize("fun, expected", [
    (lambda x, e: jnp.zeros((x.shape[0], D)), True),
    (lambda x, e: jax.nn.relu(jnp.tanh(ZERO(x, e)) * 2.0 - ZERO(x, e)), True),
    (lambda x, e: jnp.concatenate([ZERO(x, e), -ZERO(x, e)], -1), True),
    (lambda x, e: jax.ops.segment_sum(x[e], e, num_segments=x.shape[0]), True),
    (lambda x, e: x, False),                                 # an input
    (lambda x, e: ZERO(x, e) * x, False),                    # 0 * NaN
    (lambda x, e: ZERO(x, e) * np.float32(np.inf), False),   # 0 * inf
    (lambda x, e: ZERO(x, e) / 0.0, False),
    (lambda x, e: ZERO(x, e) + jnp.ones(D), False),          # a bias in the padding
    (lambda x, e: jnp.exp(ZERO(x, e)), False),               # exp(0) = 1
    (lambda x, e: jnp.concatenate([ZERO(x, e), x], -1), False),
    (lambda x, e: jnp.concatenate([ZERO(x, e), ZERO(x, e)], 0), False),  # a dynamic axis
    (lambda x, e: jnp.broadcast_to(ZERO(x, e)[:, :1, None], (x.shape[0], D, x.shape[0])),
     False),                                                 # a new dynamic axis
    (lambda x, e: jax.ops.segment_sum(x[e], e, num_segments=x.shape[0]) + x, False),
])
def test_the_fact_holds_only_where_proven(fun, expected):
  assert _facts(fun, ("n", D), ("m",)) == [expected]


def _graph(p, x, e, u):
  """Message passing: gathers (zero-padded in native mode) into contractions,
  a segment_sum, and a product with a NaN-padded edge feature."""
  h = jnp.tanh(x @ p["a"])
  pairs = jnp.concatenate([h[e[:, 0]], h[e[:, 1]]], -1)   # zero-padded: no fill
  msg = jax.nn.relu(pairs @ p["w"])
  scaled = h[e[:, 0]] * u                                  # 0 * NaN: filled
  msg = msg + jnp.tanh(scaled @ p["v"])
  # a concatenation of a NaN-padded part and a zero-padded one: only the
  # first is filled
  msg = msg + jnp.tanh(jnp.concatenate([u, h[e[:, 1]]], -1) @ p["w"])
  agg = jax.ops.segment_sum(msg, e[:, 1], num_segments=x.shape[0])
  out = jnp.concatenate([agg, jax.nn.relu(agg)], -1) @ p["w"]   # zero-padded
  return jnp.sum(jnp.concatenate([h, agg], -1) @ p["w"]) + jnp.sum(out ** 2)


def _inputs(rng):
  xs = [rng.standard_normal((n, D)).astype(np.float32) for n in NODES]
  es = [rng.integers(0, n, (m, 2)).astype(np.int32) for n, m in zip(NODES, EDGES, strict=True)]
  us = [rng.standard_normal((m, D)).astype(np.float32) for m in EDGES]
  return xs, es, us


def _ragged(parts, padded, garbage):
  data = np.stack([np.resize(garbage, (padded, *parts[0].shape[1:])) for _ in parts])
  for i, a in enumerate(parts):
    data[i, :len(a)] = a
  return pj.Ragged(jnp.asarray(data), jnp.asarray([len(a) for a in parts], jnp.int32))


def _params(rng):
  n = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.5, jnp.float32)
  return {"a": n(D, D), "w": n(2 * D, D), "v": n(D, D)}


def _polyjit_and_reference(rng, reference=True):
  params = _params(rng)
  xs, es, us = _inputs(rng)
  batch = (_ragged(xs, PAD_N, GARBAGE), _ragged(es, PAD_E, np.array([10**6, -7, 3], np.int32)),
           _ragged(us, PAD_E, GARBAGE))
  fresh = lambda *args: _graph(*args)   # (no trace of another test reused)
  loss = lambda p: pj.vmap(fresh, in_axes=(None, 0, 0, 0))(p, *batch).sum()
  got = jax.jit(jax.grad(loss))(params)
  if not reference:
    return got, None
  grad = jax.jit(jax.grad(_graph))   # a compile per example's sizes, not op by op
  grads = [grad(params, *map(jnp.asarray, ex)) for ex in zip(xs, es, us, strict=True)]
  return got, jax.tree.map(lambda *g: sum(g), *grads)


def test_gradients_exact_with_garbage_padding_where_fills_are_skipped():
  got, want = _polyjit_and_reference(np.random.default_rng(0))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def test_a_wrong_fact_would_break_them(monkeypatch):
  """The check above can see a wrong fact: claimed for every value, the fill
  of the NaN-padded product is skipped and its gradient is not finite."""
  monkeypatch.setattr(native_zeros, "known", lambda env, x: True)
  got, _ = _polyjit_and_reference(np.random.default_rng(0), reference=False)
  assert not all(np.all(np.isfinite(g)) for g in jax.tree.leaves(got))


def test_a_literal_is_judged_in_the_dtype_the_program_computes_with():
  # 1e300 is finite as a Python float but inf in float32 (0 * inf is NaN), and
  # 1e-45 is a subnormal that XLA:CPU may flush to 0 (0 / 0 is NaN).
  from jax import lax
  closed = jax.make_jaxpr(lambda x: (lax.mul(x, 1e300), lax.div(x, 1e-45), lax.mul(x, 2.0),
                                     lax.div(x, 4.0)))(np.ones(3, np.float32))
  facts = [native_zeros.outputs(e, [True, False])[0] for e in closed.jaxpr.eqns]
  assert facts == [False, False, True, True]
