"""pj.mask and pj.jit of 64-bit arrays with x64 off, as jax.jit computes them.

A `jax.Array` made under `jax.enable_x64()` keeps its float64 (int64) type
with x64 off, and jax.jit traces it so: JAX's functions convert it where
they would (`jnp.sum`, `x * 0.1`), lax keeps it (`lax.reduce_sum(x * x)` is
float64). pj.mask traced it as float32 (through `jax.ShapeDtypeStruct`) and
then failed on its own program (`lax.mul requires arguments to have the same
dtypes`). A NumPy float64 array with x64 off is converted to float32 at the
call, by jax.jit and by polyjit alike; pj.jit runs a 64-bit `jax.Array`
through jax.jit's own program (`args.uncanonical_array`). Where a masking
rule cannot keep float64 with x64 off (it builds values with JAX's functions,
which make float32), polyjit raises a MaskingError that says so, never a
float32 answer. Compared with `jax.jit(f)` on the unpadded array (values and
dtypes), with NaN and inf in the padding, eagerly, under jit and grad.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

N, PADDED = 7, 10


def converts(x):
  return jnp.sum(x * 0.1) + jnp.max(x)


def keeps(x):
  return lax.reduce_sum(x * x, (0,))


def cumulative(x):
  return lax.cumsum(x * x)


FUNS = pytest.mark.parametrize("fun", [converts, keeps, cumulative])


def _arrays(dtype=np.float64):
  """(the unpadded array, a padded one with NaN and inf, or an int's maximum,
  past N), jax.Arrays made under x64."""
  rng = np.random.default_rng(0)
  if np.issubdtype(dtype, np.floating):
    x = rng.normal(size=N).astype(dtype)
    tail = np.array([np.nan, np.inf, -np.inf], dtype)
  else:
    x = rng.integers(-9, 9, size=N).astype(dtype)
    tail = np.full(PADDED - N, np.iinfo(dtype).max, dtype)
  with jax.enable_x64(True):
    return jnp.asarray(x), jnp.asarray(np.concatenate([x, tail]))


def _valid(out):
  return out[:N] if np.ndim(out) else out


def _assert_as(got, want):
  assert np.asarray(got).dtype == np.asarray(want).dtype, (np.asarray(got).dtype, want.dtype)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.fixture(autouse=True)
def _quiet():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)   # (JAX's truncation warning)
    yield


@FUNS
def test_mask_of_float64_array_without_x64_is_jax_jit(fun):
  x, padded = _arrays()
  assert x.dtype == np.float64
  masked = pj.mask(fun, ["n"])
  want = jax.jit(fun)(x)
  _assert_as(_valid(masked([padded], {"n": N})), want)
  _assert_as(_valid(jax.jit(lambda p, n: masked([p], {"n": n}))(padded, N)), want)
  grad_want = jax.jit(jax.grad(lambda v: jnp.sum(fun(v))))(x)
  grad = jax.jit(jax.grad(lambda p: jnp.sum(masked([p], {"n": N}))))(padded)
  _assert_as(grad[:N], grad_want)
  assert np.isfinite(np.asarray(grad[:N])).all()


@pytest.mark.parametrize("fun", [lambda x: jnp.sum(x * 3) + jnp.max(x), lambda x: x * 2 - 1,
                                 lambda x: lax.cumsum(x)], ids=["sum", "tokens", "cumsum"])
def test_mask_of_int64_array_without_x64_is_jax_jit(fun):
  x, padded = _arrays(np.int64)
  masked = pj.mask(fun, ["n"])
  want = jax.jit(fun)(x)
  _assert_as(_valid(masked([padded], {"n": N})), want)
  _assert_as(_valid(jax.jit(lambda p, n: masked([p], {"n": n}))(padded, N)), want)


@FUNS
def test_mask_of_numpy_float64_without_x64_is_jax_jit(fun):
  x, padded = (np.asarray(a) for a in _arrays())
  want = jax.jit(fun)(x)
  assert want.dtype == np.float32
  _assert_as(_valid(pj.mask(fun, ["n"])([padded], {"n": N})), want)


@FUNS
def test_jit_of_64_bit_arrays_without_x64_is_jax_jit(fun):
  f = pj.jit(fun)
  for dtype in (np.float64, np.int64):
    x, _ = _arrays(dtype)
    _assert_as(f(x), jax.jit(fun)(x))
  x, _ = _arrays()
  _assert_as(jax.grad(lambda v: jnp.sum(f(v)))(x), jax.grad(lambda v: jnp.sum(fun(v)))(x))


@FUNS
def test_float32_array_under_x64_is_jax_jit(fun):
  x, padded = _arrays(np.float32)
  with jax.enable_x64(True):
    masked = pj.mask(fun, ["n"])
    _assert_as(_valid(masked([padded], {"n": N})), jax.jit(fun)(x))
    grad = jax.grad(lambda p: jnp.sum(masked([p], {"n": N})))(padded)
    _assert_as(grad[:N], jax.grad(lambda v: jnp.sum(fun(v)))(x))


def test_a_rule_that_cannot_keep_float64_says_so():
  x, padded = _arrays()
  assert jax.jit(lambda v: lax.rev(v, (0,)))(x).dtype == np.float64
  with pytest.raises(pj.MaskingError, match=r"'rev'.*float32 where jax.jit computes in "
                     r"float64(.|\n)*jax_enable_x64"):
    pj.mask(lambda v: lax.rev(v, (0,)), ["n"])([padded], {"n": N})
