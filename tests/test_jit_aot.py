"""pj.jit's ahead-of-time API: trace, lower, compile, eval_shape, clear_cache.

Each stage is compared with jax.jit's on the same (unpadded) arguments;
compile counts come from jax.monitoring.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def f(x, w):
  return {"y": jnp.tanh(x @ w), "s": x.sum(), "n": x.shape[0] * jnp.ones(2), "k": 2.0 * x[0, 0]}


W = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)


def data(n, seed=0):
  return np.random.default_rng(seed).standard_normal((n, 3)).astype(np.float32)


def assert_same(actual, expected):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    assert a.shape == e.shape and a.dtype == e.dtype
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-6, atol=2e-6)


def same_info(a, b):
  return [(x.shape, x.dtype, x.weak_type) for x in jax.tree.leaves(a)] == \
         [(x.shape, x.dtype, x.weak_type) for x in jax.tree.leaves(b)] and \
         jax.tree.structure(a) == jax.tree.structure(b)


def test_lower_compile_call_is_jax_jit_and_compiles_the_bucket_once():
  g = pj.jit(f, polymorphic_shapes=["(n, _)", None])
  x5, x7 = data(5), data(7, 1)
  ref5, ref7 = jax.jit(f)(x5, W), jax.jit(f)(x7, W)
  with pj.diagnostics.count_compiles() as compiles:
    lowered = g.lower(x5, W)
  assert len(compiles) == 0
  assert lowered.bucket == {"n": 16} and lowered.padded_shapes == ((16, 3), (3, 2))
  assert "16x3xf32" in lowered.as_text()          # the bucket program, padded
  assert same_info(lowered.out_info, jax.jit(f).eval_shape(x5, W))
  assert isinstance(lowered.cost_analysis(), dict)
  with pj.diagnostics.count_compiles() as compiles:
    compiled = lowered.compile()
    assert_same(compiled(x5, W), ref5)
    assert_same(g(x5, W), ref5)                    # the call reuses it
    assert_same(g(x7, W), ref7)                    # and so does another size in the bucket
  assert len(compiles) == 1
  assert compiled.cost_analysis() is not None and "HloModule" in compiled.as_text()
  with pytest.raises(pj.ShapeError, match="call pj.jit"):
    compiled(x7, W)


def test_lower_after_a_call_reuses_its_program_and_automatic_mode_plans_as_a_call():
  g = pj.jit(f)
  x5, x9, x12 = data(5), data(9, 1), data(12)
  ref9, ref12 = jax.jit(f)(x9, W), jax.jit(f)(x12, W)
  assert g.lower(x5, W).bucket is None              # the first call's exact program
  g(x5, W)
  lowered = g.lower(x9, W)                          # a new length: the axis is dynamic
  assert lowered.bucket == {"x_0": pj.buckets.CostAware().roomy(9, 5)}  # the default's headroom
  with pj.diagnostics.count_compiles() as compiles:
    assert_same(lowered.compile()(x9, W), ref9)
    assert_same(g(x12, W), ref12)
    g.lower(x9, W).compile()
  assert len(compiles) == 1


def test_trace_gives_the_bucket_jaxpr_and_jax_jit_out_info():
  g = pj.jit(f, polymorphic_shapes=["(n, _)", None])
  traced = g.trace(data(20), W)
  bucket = pj.buckets.CostAware().roomy(20, 20)  # the default's headroom bucket
  assert [tuple(a.shape) for a in traced.jaxpr.in_avals] == [(bucket, 3), (3, 2), ()]
  assert same_info(traced.out_info, jax.jit(f).trace(data(20), W).out_info)
  assert_same(traced.lower().compile()(data(20), W), jax.jit(f)(data(20), W))


@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_eval_shape_is_jax_jit_eval_shape_and_learns_nothing(mode):
  specs = ["(n, _)", None] if mode == "explicit" else None
  g = pj.jit(f, polymorphic_shapes=specs)
  for n in (4, 13, 1):
    assert same_info(g.eval_shape(data(n), W), jax.jit(f).eval_shape(data(n), W))
  abstract = jax.ShapeDtypeStruct((6, 3), jnp.float32)
  assert same_info(g.eval_shape(abstract, W), jax.jit(f).eval_shape(abstract, W))
  with pj.diagnostics.count_compiles() as compiles:
    g(data(4), W)
  assert len(compiles) == 1
  kinds = [r.cause.kind for r in g.stats.compile_events]
  assert kinds == (["first call"] if mode == "auto" else ["bucket"])


def test_clear_cache_drops_the_programs():
  g = pj.jit(f, polymorphic_shapes=["(n, _)", None])
  g(data(5), W)
  g.clear_cache()
  ref = jax.jit(f)(data(5), W)
  with pj.diagnostics.count_compiles() as compiles:
    assert_same(g(data(5), W), ref)
  assert len(compiles) == 1
