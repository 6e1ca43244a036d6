"""`jnp.pad(mode="edge")` of a 2-D array with a dynamic axis.

Its edge mode reshapes an `(n, 1, 0)` array to `(n, 0)` for an axis padded by
zero; the reshape rule's gather path took from the empty array and returned
shape `(0,)`, and `concatenate` then failed with a raw JAX TypeError. Compared
with the unpadded function, value and gradient, under `jax.jit` with traced
sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


@pytest.mark.parametrize("widths", [((1, 2), (0, 0)), ((1, 2), (0, 1)), ((0, 0), (2, 1))])
def test_edge_pad_of_a_matrix_with_dynamic_axes(widths):
  f = lambda v: jnp.sum(jnp.pad(v, widths, mode="edge") * 1.5 ** jnp.arange(v.shape[1] + sum(widths[1])))
  x = np.arange(15, dtype=np.float32).reshape(3, 5)
  padded = np.full((6, 7), np.nan, np.float32)
  padded[:3, :5] = x
  m = lambda v, n, k: pj.mask(f, ["(n, k)"])([v], {"n": n, "k": k})
  np.testing.assert_allclose(jax.jit(m)(padded, 3, 5), f(x), rtol=1e-6)
  grad = np.asarray(jax.jit(jax.grad(m))(padded, 3, 5))
  np.testing.assert_allclose(grad[:3, :5], jax.grad(f)(x), rtol=1e-6)
  assert np.all(grad[3:] == 0) and np.all(grad[:, 5:] == 0)
