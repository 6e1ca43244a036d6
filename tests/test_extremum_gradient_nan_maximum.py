"""The gradient of max/min with a NaN among the valid positions is NaN, as JAX's.

JAX's derivative of a maximum divides the tangent by the number of positions
equal to the maximum; a NaN maximum equals no one, so the gradient is 0/0 =
NaN at every valid position (eagerly). polyjit's rule counted ties among valid
positions and clamped the count to 1, turning that NaN into a silent 0. Each
case compares eagerly with `jax.grad`/`jax.jvp` of the unpadded function, with
inf in the padding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

CASES = {
    "max": (jnp.max, "n", [1.0, np.nan, 2.0]),
    "min": (jnp.min, "n", [np.nan, 1.0, 2.0]),
    "max_rows": (lambda v: jnp.sum(jnp.max(v, axis=0)), "(n, _)", [[1.0, 2.0], [np.nan, 0.5]]),
}


def _padded(x, padded=6):
  return np.concatenate([x, np.full((padded - x.shape[0],) + x.shape[1:], np.inf, np.float32)])


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_and_tangent_with_a_valid_nan_match_jax(name):
  f, spec, values = CASES[name]
  x = np.asarray(values, np.float32)
  n = x.shape[0]
  masked = lambda v: pj.mask(f, [spec])([v], {"n": n})
  want = np.asarray(jax.grad(f)(x))
  got = np.asarray(jax.grad(masked)(_padded(x)))
  np.testing.assert_array_equal(got[:n], want)
  np.testing.assert_array_equal(got[n:], 0.0)
  t = np.arange(1, x.size + 1, dtype=np.float32).reshape(x.shape)
  want_t = np.asarray(jax.jvp(f, (x,), (t,))[1])
  got_t = np.asarray(jax.jvp(masked, (_padded(x),), (_padded(t),))[1])
  np.testing.assert_array_equal(got_t, want_t)
