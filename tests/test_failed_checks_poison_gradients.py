"""A failed check on a data-dependent size poisons derivatives, not only values.

Under traced values nothing can raise, so an empty selection's `jnp.max`
(`x[x > 0]` with no positive entry; eager JAX raises ValueError) gives NaN
(`_masking/data_dependent.py`). Its gradient was 0 (a select's transpose
drops the poisoned branch), so under `jax.vmap` such an example silently
dropped out of a batch loss's gradient, where a traced size out of range
gives NaN (`_masking/size_range.py`). Now the derivatives are NaN too,
forward and reverse, with respect to padded and unpadded inputs; where the
checks pass they equal `jax.grad` of the unpadded function, with NaN and inf
in the padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

PADDED = 6
X = np.array([-1.0, -2.0, 3.0, 0.5], np.float32)   # no positive entry among the first 2


def f(s, x):
  return jnp.max(x[x > 0] * s)


MASKED = pj.mask(f, [None, "n"])


def _padded(x, fill):
  out = np.full(PADDED, fill, np.float32)
  out[:len(x)] = x
  return out


def _value_and_grad(s, x, n):
  return jax.value_and_grad(lambda s, x: MASKED([s, x], {"n": n})[0], argnums=(0, 1))(s, x)


@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_passed_checks_keep_the_exact_gradient(fill):
  s = np.float32(0.8)
  for n in (3, 4):
    want, (want_s, want_x) = jax.value_and_grad(f, argnums=(0, 1))(s, X[:n])
    for g in (jax.jit(_value_and_grad), jax.jit(_value_and_grad, static_argnums=2)):
      got, (got_s, got_x) = g(s, _padded(X[:n], fill), n)
      np.testing.assert_allclose(got, want, rtol=1e-6)
      np.testing.assert_allclose(got_s, want_s, rtol=1e-6)
      np.testing.assert_allclose(np.asarray(got_x)[:n], want_x, rtol=1e-6)


def test_a_failed_check_gives_nan_gradients():
  s, x = np.float32(0.8), _padded(X[:2], 1.0)
  with pytest.raises(ValueError):
    f(s, X[:2])   # eager JAX: an empty max
  # traced sizes, and concrete sizes with traced values
  for g in (jax.jit(_value_and_grad), jax.jit(_value_and_grad, static_argnums=2)):
    value, (got_s, got_x) = g(s, x, 2)
    assert np.isnan(value) and np.isnan(got_s) and np.all(np.isnan(got_x))
  _, tangent = jax.jit(lambda s, n: jax.jvp(lambda s: MASKED([s, x], {"n": n})[0],
                                            (s,), (np.float32(1),)))(s, 2)
  assert np.isnan(tangent)


# (a shared input of a function that creates sizes: differentiated per example, and said so)
@pytest.mark.filterwarnings("ignore::polyjit.PerformanceWarning")
def test_a_failed_example_does_not_drop_out_of_a_batch_gradient():
  s = np.float32(0.8)
  batch = np.stack([_padded(X[:3], np.nan), _padded(X[:4], np.inf), _padded(X, 1.0)])

  def loss(s, ns):
    return jnp.sum(jax.vmap(lambda x, n: MASKED([s, x], {"n": n})[0])(batch, ns))

  g = jax.jit(jax.grad(loss))
  want = 2 * jax.grad(f)(s, X[:3]) + jax.grad(f)(s, X[:4])
  np.testing.assert_allclose(g(s, np.array([3, 4, 3], np.int32)), want, rtol=1e-6)
  assert np.isnan(g(s, np.array([3, 4, 2], np.int32)))
