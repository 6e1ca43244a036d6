"""pj.filter_jit: eqx.filter_jit's semantics, bucketed.

Real Equinox models over a variable number of tokens: results equal to
eqx.filter_jit's, and compiles (measured with jax.monitoring) one per bucket
instead of one per length. Equinox itself is only needed by these tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from test_jit import default_compiles as expected_compiles

eqx = pytest.importorskip("equinox")

D = 4
LENGTHS = (5, 9, 3, 17)   # buckets 16, 16, 32 after the first (exact) call


def tokens(n, seed=0):
  return np.random.default_rng(seed + n).standard_normal((n, D)).astype(np.float32)


def mlp_loss(model, x, scale=2.0):
  return jnp.mean(jax.vmap(model)(x) ** 2) * scale


def mlp_grads(model, x):
  return eqx.filter_grad(mlp_loss)(model, x)


def attention(model, x):
  return model(x, x, x)


def gru(cell, xs):
  def step(h, x):
    h = cell(x, h)
    return h, h
  return lax.scan(step, jnp.zeros(cell.hidden_size), xs)


def models():
  key = jax.random.key(0)
  return {
      "mlp": eqx.nn.MLP(D, 3, 8, 1, activation=jax.nn.gelu, key=key),
      "attention": eqx.nn.MultiheadAttention(num_heads=2, query_size=D, key=key),
      "gru": eqx.nn.GRUCell(D, 3, key=key),
  }


def run(fun, model, lengths):
  with pj.diagnostics.count_compiles() as compiles:
    outs = [fun(model, tokens(n)) for n in lengths]
  return outs, len(compiles)


@pytest.mark.parametrize("name,fun", [("mlp", mlp_grads), ("attention", attention),
                                      ("gru", gru)])
def test_equinox_models_match_eqx_filter_jit_with_one_compile_per_bucket(name, fun):
  model = models()[name]
  actual, pj_compiles = run(pj.filter_jit(fun, fallback="error"), model, LENGTHS)
  expected, eqx_compiles = run(eqx.filter_jit(fun), model, LENGTHS)
  for a, e in zip(actual, expected):
    assert jax.tree.structure(a) == jax.tree.structure(e)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(e)):
      if eqx.is_array(y):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
      else:
        assert x == y
  assert eqx_compiles == len(set(LENGTHS))
  assert pj_compiles == expected_compiles(LENGTHS)


def test_non_array_leaves_are_static_like_equinox():
  calls = []

  def f(x, scale, act, flag=True):
    calls.append(1)                        # one trace per static value
    y = act(x) * scale
    return {"y": y if flag else -y, "n": x.shape[0], "tag": "out", "none": None}

  g = pj.filter_jit(f)
  for n in (3, 6, 11):
    x = tokens(n)
    for args, kwargs in [((2.0, jnp.tanh), {}), ((3.0, jnp.tanh), {}),
                         ((2.0, jax.nn.relu), {"flag": False})]:
      out, ref = g(x, *args, **kwargs), eqx.filter_jit(f)(x, *args, **kwargs)
      assert jax.tree.structure(out) == jax.tree.structure(ref)
      assert out["n"] == n and type(out["n"]) is int and out["tag"] == "out"
      np.testing.assert_allclose(out["y"], ref["y"], rtol=1e-6)
  with pj.diagnostics.count_compiles() as compiles:
    g(tokens(12), 3.0, jnp.tanh)           # a known bucket, known static values
  assert len(compiles) == 0


def test_the_function_itself_may_be_a_model_and_stats_explain_it():
  model = models()["mlp"]
  g = pj.filter_jit(model)
  for n in (2, 5):
    x = tokens(n)
    np.testing.assert_allclose(g(x[n - 1]), model(x[n - 1]), rtol=1e-6)
  assert pj.stats(g).calls == 2 and "pj.jit" in pj.explain(g)


def test_unhashable_static_leaf_is_named():
  class Opaque:
    __hash__ = None

  with pytest.raises(pj.PolyjitError, match=r"argument leaf \[1\] is a Opaque"):
    pj.filter_jit(lambda x, o: x)(tokens(2), Opaque())
