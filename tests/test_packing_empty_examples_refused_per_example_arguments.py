"""An empty example where JAX refuses the function (`jnp.max` of nothing) is
poisoned with NaN derivatives for its per-example arguments too, packed as
over the padded batch.

Its outputs are NaN, and the documented derivative is NaN: over the padded
batch the gradient with respect to that example's own argument is NaN, but
the packed batch gave it 0 (the poison's derivative held only the shared
arguments), a finite gradient for an example that has no value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj


def test_refused_empty_example_gradient_of_its_own_argument():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in [5, 0, 1, 9, 0, 13]]
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  b = jnp.asarray(rng.normal(size=(len(xs), 4)).astype(np.float32))
  fun = lambda w, x, b: jnp.max(x @ w + b)
  empty = np.array([len(x) == 0 for x in xs])
  first = np.arange(len(xs)) == 0

  def gradients(batch):
    vmapped = pj.vmap(fun, in_axes=(None, 0, 0))
    values = jax.jit(vmapped)(w, batch, b)
    # the first example's output only: the others' cotangents are 0
    grad = jax.jit(jax.grad(lambda b: jnp.sum(jnp.where(first, vmapped(w, batch, b), 0.0))))(b)
    return np.asarray(values), np.asarray(grad)

  packed = gradients(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  padded = gradients(pj.Ragged.from_list(xs))
  for got, want in zip(packed, padded, strict=True):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)
  values, grad = packed
  assert np.isnan(values[empty]).all() and np.isnan(grad[empty]).all()
  for i in np.flatnonzero(~empty):   # the others: each example's own, under jax.jit
    np.testing.assert_allclose(values[i], jax.jit(fun)(w, xs[i], b[i]), rtol=1e-6)
  np.testing.assert_allclose(grad[0], jax.grad(fun, argnums=2)(w, xs[0], b[0]), rtol=1e-6)
  np.testing.assert_array_equal(grad[~empty & ~first], 0.0)
