"""Derivatives with respect to a float64 array made under `jax.enable_x64()`
and used with x64 off, through pj.mask and pj.vmap, have the dtype jax.jit
gives them: float64 (a cotangent has its primal's dtype).

The native flat contraction's node (`native_dot._Dot`) transposed at a
`jax.ShapeDtypeStruct` of its operand, which makes float64 float32 with x64
off: the gradient of pj.mask with respect to a float64 weight (`x @ w`,
the native flat contraction) came back float32, and jax.grad of pj.vmap
with respect to one raised JAX's AssertionError (a float64 and a float32
cotangent added). Compared with jax.jit on each unpadded example (dtypes
and values), NaN and inf in the padding, eagerly and under jax.jit. (The
`gathered` cases, a weight reached without the flat contraction, passed before:
guards.)
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

LENGTHS = (3, 7, 5)
ROW = 16


@pytest.fixture(autouse=True)
def _quiet():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)   # (JAX's truncation warning)
    yield


def dense(x, w):       # the native flat contraction (`native_dot`)
  return jnp.sum(jnp.tanh(x @ w))


def gathered(x, w):    # x[i] promised in bounds (a linear call), times the weight
  rows = x.at[jnp.array([0, 2, 1])].get(mode="promise_in_bounds")
  return jnp.sum(rows @ w) + jnp.sum(x[:, 0]) * w[1]


FUNS = pytest.mark.parametrize("fun", [dense, gathered])


def _weight():
  with jax.enable_x64(True):
    w = jnp.asarray(np.random.default_rng(1).normal(size=3))
  assert w.dtype == np.float64
  return w


def _examples():
  rng = np.random.default_rng(0)
  return [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]


def _assert_as(got, want):
  assert np.asarray(got).dtype == np.asarray(want).dtype, (np.asarray(got).dtype, want.dtype)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=2e-6)


@FUNS
def test_mask_gradient_of_a_float64_weight_is_float64(fun):
  w, x = _weight(), _examples()[1]
  padded = np.concatenate([x, np.full((3, 3), np.nan, np.float32)])
  padded[-1] = np.inf
  masked = pj.mask(fun, ["(n, _)", None])
  want = jax.jit(jax.grad(fun, argnums=1))(jnp.asarray(x), w)
  assert want.dtype == np.float64
  loss = lambda v: masked([jnp.asarray(padded), v], {"n": len(x)})
  _assert_as(jax.grad(loss)(w), want)
  _assert_as(jax.jit(jax.grad(loss))(w), want)


@FUNS
@pytest.mark.parametrize("packing", [None, pj.Packing(row_length=ROW)], ids=["padded", "packed"])
def test_vmap_gradient_of_a_shared_float64_weight_is_float64(fun, packing):
  w, xs = _weight(), _examples()
  batch = pj.Ragged.from_list(xs, packing=packing)
  grads = [jax.jit(jax.grad(fun, argnums=1))(jnp.asarray(x), w) for x in xs]
  want = functools.reduce(lax.add, grads)   # (lax keeps float64; `sum` from 0 would not)
  assert want.dtype == np.float64
  loss = lambda v: jnp.sum(pj.vmap(fun, in_axes=(0, None))(batch, v))
  _assert_as(jax.grad(loss)(w), want)
  _assert_as(jax.jit(jax.grad(loss))(w), want)
