"""pj.jit under a configuration that changes between calls (x64, dtype promotion).

`jax.jit` keys its caches on the trace context (`jax_enable_x64`,
`jax_numpy_dtype_promotion`, ...): the same function called under another
configuration traces again. `pj.jit` keys its structures and its hot path the
same way, so a plan or program traced under one configuration never serves a
call under another. Each test compares dtypes and values with `jax.jit` in the
same configuration.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def cumsum2(v):
  return jnp.cumsum(v) * 2


X64 = np.linspace(0.5, 9.5, 10)  # float64


def assert_like_jax(got, want):
  assert got.dtype == want.dtype, (got.dtype, want.dtype)
  assert got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def compiles(fn):
  with pj.diagnostics.count_compiles() as events:
    out = fn()
  return len(events), out


@pytest.mark.parametrize("specs", [None, ["n"]], ids=["auto", "explicit"])
def test_x64_after_calls_without_it_returns_float64(specs):
  f = pj.jit(cumsum2, polymorphic_shapes=specs)
  f(X64[:3]), f(X64[:5])   # float32 programs (automatic mode: now bucketed)
  with jax.enable_x64():
    assert_like_jax(f(X64[:7]), jax.jit(cumsum2)(X64[:7]))
    assert_like_jax(f(X64[:7]), jax.jit(cumsum2)(X64[:7]))  # the hot path, too
    assert_like_jax(f(X64[:6]), jax.jit(cumsum2)(X64[:6]))  # a new size
  assert_like_jax(f(X64[:7]), jax.jit(cumsum2)(X64[:7]))    # back: float32 again


@pytest.mark.parametrize("specs", [None, ["n"]], ids=["auto", "explicit"])
def test_calls_without_x64_after_calls_under_it(specs):
  # Was a raw TypeError ("Argument types differ ... compiled with int64[]").
  f = pj.jit(cumsum2, polymorphic_shapes=specs)
  with jax.enable_x64():
    assert_like_jax(f(X64[:3]), jax.jit(cumsum2)(X64[:3]))
    assert_like_jax(f(X64[:5]), jax.jit(cumsum2)(X64[:5]))
  for n in (7, 7, 4):
    assert_like_jax(f(X64[:n]), jax.jit(cumsum2)(X64[:n]))


def test_x64_changes_the_trace_of_float32_arguments():
  # The arguments' dtypes are the same under both modes; the trace is not
  # (a size as a value, `astype(float)`): only the configuration tells them apart.
  def g(v):
    return (v.astype(float) * v.shape[0]).sum() + jnp.arange(v.shape[0]).sum()
  x = np.arange(10, dtype=np.float32)
  f = pj.jit(g)
  f(x[:3]), f(x[:5])
  with jax.enable_x64():
    for n in (7, 7, 6):
      assert_like_jax(f(x[:n]), jax.jit(g)(x[:n]))
  assert_like_jax(f(x[:7]), jax.jit(g)(x[:7]))


def test_returning_to_a_configuration_compiles_nothing_new():
  f = pj.jit(cumsum2, polymorphic_shapes=["n"])
  f(X64[:5])
  with jax.enable_x64():
    f(X64[:5])
  n, out = compiles(lambda: f(X64[:6]))
  assert n == 0 and out.dtype == jnp.float32
  with jax.enable_x64():
    n, out = compiles(lambda: f(X64[:6]))
  assert n == 0 and out.dtype == jnp.float64


def test_strict_dtype_promotion_is_honoured_after_standard_calls():
  def add(v, w):
    return v + w
  f = pj.jit(add, fallback="silent")  # (strict: the masked trace fails, as the exact one)
  i, w = np.arange(8, dtype=np.int32), np.float32(0.5)
  f(i[:3], w), f(i[:5], w)
  with jax.numpy_dtype_promotion("strict"):
    with pytest.raises(jax.dtypes.TypePromotionError):
      jax.jit(add)(i[:6], w)
    with pytest.raises(jax.dtypes.TypePromotionError):
      f(i[:6], w)
    with pytest.raises(jax.dtypes.TypePromotionError):
      f(i[:5], w)   # a signature the hot path knows under "standard"
  assert_like_jax(f(i[:6], w), jax.jit(add)(i[:6], w))
