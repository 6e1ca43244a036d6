"""Reverse mode through a jax.custom_vjp function under batching.

`jax.grad` of `pj.vmap` (or of `jax.vmap(pj.mask)`) over a function that calls
a custom_vjp function takes the symbolic path, whose batched tangent map
(`Batched(Lin)`) must not be traced: JAX cannot trace a custom_vjp function's
tangent map, and reverse mode needs only its output shapes. Gradients are
compared with the per-example sum of `jax.grad` on the unpadded examples, with
NaN and inf in the padding; forward mode stays refused with a clear message."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

LENGTHS = (3, 5, 1)
PADDED = 8


@jax.custom_vjp
def _square(x):
  return x * x


_square.defvjp(lambda x: (x * x, x), lambda x, g: (2 * x * g,))


def loss(p, x):
  return jnp.sum(jnp.sin(_square(x * p)))


def _examples():
  rng = np.random.default_rng(0)
  return [rng.standard_normal(n).astype(np.float32) for n in LENGTHS]


def _padded(xs):
  data = np.full((len(xs), PADDED), np.nan, np.float32)
  data[:, -1] = np.inf
  for row, x in zip(data, xs, strict=True):
    row[:len(x)] = x
  return data, np.array([len(x) for x in xs], np.int32)


@pytest.fixture(autouse=True)
def _quiet():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.PerformanceWarning)
    yield


def test_gradients_under_pj_vmap():
  xs = _examples()
  data, lengths = _padded(xs)
  p = np.float32(0.7)
  batched = lambda p, d: jnp.sum(pj.vmap(loss, in_axes=(None, 0))(p, pj.Ragged(d, lengths)))
  gp, gd = jax.jit(jax.grad(batched, argnums=(0, 1)))(p, data)
  want_p = sum(float(jax.grad(loss)(p, x)) for x in xs)
  np.testing.assert_allclose(float(gp), want_p, rtol=1e-5)
  for row, x in zip(np.asarray(gd), xs, strict=True):
    np.testing.assert_allclose(row[:len(x)], jax.grad(loss, argnums=1)(p, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(row[len(x):], 0.0)


def test_gradients_under_vmap_of_mask():
  xs = _examples()
  data, lengths = _padded(xs)
  p = np.float32(-1.3)
  one = lambda p, x, n: pj.mask(loss, [None, "n"])([p, x], {"n": n})
  batched = lambda p: jnp.sum(jax.vmap(one, in_axes=(None, 0, 0))(p, data, lengths))
  want = sum(float(jax.grad(loss)(p, x)) for x in xs)
  np.testing.assert_allclose(float(jax.grad(batched)(p)), want, rtol=1e-5)
  np.testing.assert_allclose(float(jax.jit(jax.grad(batched))(p)), want, rtol=1e-5)


def test_forward_mode_is_refused_with_the_reason():
  data, lengths = _padded(_examples())
  batched = lambda p: jnp.sum(pj.vmap(loss, in_axes=(None, 0))(p, pj.Ragged(data, lengths)))
  with pytest.raises(pj.MaskingError, match="custom_vjp"):
    jax.jvp(batched, (np.float32(0.7),), (np.float32(1.0),))
