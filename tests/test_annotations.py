"""jaxtyping annotations: named dims become pj.jit's specs; pj.shapecheck(f)
checks the annotated result without running. Skipped without jaxtyping."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jit.annotations import annotated_specs, annotation_spec

jaxtyping = pytest.importorskip("jaxtyping")
from jaxtyping import Array, Float, Int  # noqa: E402


def score(x: Float[Array, "n d"], mask: Float[Array, "n"], w: Float[Array, "d 2"],
          scale: float = 2.0) -> Float[Array, "n 2"]:
  return jnp.tanh(x @ w) * mask[:, None] * scale


@pytest.mark.parametrize("token,spec", [
    ("n d", "(n, d)"), ("n 3", "(n, _)"), ("_ #m n", "(_, _, n)"), ("n ...", "(n, ...)"),
    ("*batch n", None), ("3 _", None), ("", None), ("n+1", "(n+1,)")])
def test_annotation_to_spec(token, spec):
  assert annotation_spec(Float[Array, token]) == spec


def test_named_dims_are_the_specs_from_the_first_call():
  assert annotated_specs(score) == ("(n, d)", "(n,)", "(d, _)", None)
  f = pj.jit(score)
  rng = np.random.default_rng(0)
  w = rng.standard_normal((3, 2)).astype(np.float32)
  lengths = (5, 11, 2, 20)
  refs, args = [], []
  for n in lengths:
    args.append((rng.standard_normal((n, 3)).astype(np.float32), np.ones(n, np.float32)))
    refs.append(jax.jit(score)(*args[-1], w))
  with pj.diagnostics.count_compiles() as compiles:
    outs = [f(x, m, w) for x, m in args]
  for out, ref in zip(outs, refs):
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
  policy = pj.buckets.as_policy(None)
  assert len(compiles) == len({policy.bucket(n) for n in lengths})
  assert {r.cause.kind for r in f.stats.compile_events} == {"bucket"}   # no exact first call
  assert f.lower(*args[0], w).bucket == {"d": policy.bucket(3), "n": policy.bucket(5)}


def test_explicit_specs_win_and_unmaskable_annotated_code_falls_back():
  f = pj.jit(score, polymorphic_shapes=["(n, _)", "n", None])
  x = np.ones((4, 3), np.float32)
  assert f.lower(x, np.ones(4, np.float32), np.ones((3, 2), np.float32)).bucket == {
      "n": pj.buckets.as_policy(None).bucket(4)}

  def sized(x: Float[Array, "n"]) -> Float[Array, "n"]:
    return x * int(x.shape[0])           # a size as a Python int: no symbolic trace

  g = pj.jit(sized)
  with pytest.warns(pj.FallbackWarning):
    out = g(np.ones(3, np.float32))
  np.testing.assert_array_equal(out, np.full(3, 3.0))


def test_shapecheck_reads_the_annotations():
  assert pj.shapecheck(score) is score

  @pj.shapecheck
  def pair(x: Float[Array, "n 3"],
           i: Int[Array, "k"]) -> tuple[Float[Array, "n"], Float[Array, "3 _"]]:
    return x.sum(1), x.T

  def swapped(x: Float[Array, "n d"]) -> Float[Array, "d n"]:
    return x

  def wrong_dtype(x: Float[Array, "n"]) -> Int[Array, "n"]:
    return x

  def wrong_rank(x: Float[Array, "n d"]) -> Float[Array, "n"]:
    return x

  def unannotated(x: Float[Array, "n"], y):
    return x

  for fun, match in [(swapped, r"\(n, d\).*\(d, n\)"), (wrong_dtype, "dtype float32"),
                     (wrong_rank, "rank 2"), (unannotated, "parameter 'y'")]:
    with warnings.catch_warnings(), pytest.raises(pj.ShapeError, match=match):
      pj.shapecheck(fun)
