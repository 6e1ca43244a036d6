"""Traced sizes that break the contract poison gradients too, not only values.

A traced size out of range (7, 100 or -1 for 6 padded values) or one that
violates a declared constraint gets a NaN output (`_masking/size_range.py`);
its gradient was 0 (a select's transpose drops the poisoned branch), so
under `jax.vmap` such an example silently dropped out of a batch loss's
gradient. Now the derivatives are NaN, forward and reverse, with respect to
padded and unpadded inputs; with sizes in range they equal `jax.grad` of the
unpadded function, with NaN and inf in the padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

PADDED = 6
X = np.array([0.5, 2.0, 0.0, 1.5], np.float32)   # (sqrt at 0: an inf derivative)


def f(s, x):
  return jnp.sum(jnp.sqrt(x * s)) + jnp.sum(x) * s


def _padded(x, fill):
  out = np.full(PADDED, fill, np.float32)
  out[:len(x)] = x
  return out


MASKED = pj.mask(f, [None, "n"])
CONSTRAINED = pj.mask(f, [None, "n"], constraints=["n >= 2"])


def _grad(masked):
  return jax.jit(jax.grad(lambda s, x, n: masked([s, x], {"n": n}), argnums=(0, 1)))


@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_sizes_in_range_keep_the_exact_gradient(fill):
  s = np.float32(0.8)
  for n in (1, 3, 4):
    want_s, want_x = jax.grad(f, argnums=(0, 1))(s, X[:n])
    for masked in (MASKED, CONSTRAINED) if n >= 2 else (MASKED,):
      got_s, got_x = _grad(masked)(s, _padded(X[:n], fill), n)
      np.testing.assert_allclose(got_s, want_s, rtol=1e-6)
      np.testing.assert_allclose(np.asarray(got_x)[:n], want_x, rtol=1e-6)
      assert np.all(np.asarray(got_x)[n:] == 0)


@pytest.mark.parametrize("n", [7, 100, -1])
def test_sizes_out_of_range_give_nan_gradients(n):
  s, x = np.float32(0.8), _padded(X, 1.0)
  assert np.isnan(jax.jit(lambda s, x, n: MASKED([s, x], {"n": n}))(s, x, n))
  got_s, got_x = _grad(MASKED)(s, x, n)
  assert np.isnan(got_s) and np.all(np.isnan(got_x))
  _, tangent = jax.jit(lambda s, n: jax.jvp(lambda s: MASKED([s, x], {"n": n}),
                                            (s,), (np.float32(1),)))(s, n)
  assert np.isnan(tangent)


def test_a_violated_constraint_gives_nan_gradients():
  s, x = np.float32(0.8), _padded(X, 1.0)
  got_s, got_x = _grad(CONSTRAINED)(s, x, 1)
  assert np.isnan(got_s) and np.all(np.isnan(got_x))


# (lengths traced inside the step: the empty path runs, and says so)
@pytest.mark.filterwarnings("ignore::polyjit.PerformanceWarning")
def test_a_bad_example_does_not_drop_out_of_a_batch_gradient():
  s = np.float32(0.8)
  batch = np.stack([_padded(X[:3], np.nan), _padded(X[:2], np.inf)])

  def loss(s, ns):
    return jnp.sum(jax.vmap(lambda x, n: CONSTRAINED([s, x], {"n": n}))(batch, ns))

  def ragged_loss(s, ns):
    return pj.vmap(f, in_axes=(None, 0))(s, pj.Ragged(batch, ns)).sum()

  want = jax.grad(f)(s, X[:3]) + jax.grad(f)(s, X[:2])
  for g in (jax.jit(jax.grad(loss)), jax.jit(jax.grad(ragged_loss))):
    np.testing.assert_allclose(g(s, np.array([3, 2], np.int32)), want, rtol=1e-6)
  for ns in ([3, 7], [-1, 2]):
    for g in (jax.jit(jax.grad(loss)), jax.jit(jax.grad(ragged_loss))):
      assert np.isnan(g(s, np.array(ns, np.int32))), ns
  assert np.isnan(jax.jit(jax.grad(loss))(s, np.array([3, 1], np.int32)))


# --- the sign of a zero derivative: x + 0 is not x for x = -0.0 --------------------

def scaled(s, x):
  return x * s


@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_sizes_in_range_keep_the_sign_of_a_zero_tangent(fill):
  s, n = np.float32(1.0), 3
  x = np.array([1.0, -2.0, 0.0], np.float32)
  for masked in (pj.mask(scaled, [None, "n"]),
                 pj.mask(scaled, [None, "n"], constraints=["n >= 2"])):
    for ts in (np.float32(-0.0), np.float32(0.0)):
      _, want = jax.jit(lambda s, t: jax.jvp(lambda s: scaled(s, x), (s,), (t,)))(s, ts)
      _, got = jax.jit(lambda s, t, n: jax.jvp(
          lambda s: masked([s, _padded(x, fill)], {"n": n}), (s,), (t,)))(s, ts, n)
      got = np.asarray(got)[:n]
      np.testing.assert_array_equal(got, want)
      np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_an_input_no_output_depends_on_keeps_a_gradient_of_plus_zero():
  # (what jax.grad gives it: the gate that poisons the inputs' cotangents
  # must add 0, not -0.0, where the sizes are in range)
  def unused(s, x):
    return jnp.sum(x * 2.0)
  for masked in (pj.mask(unused, [None, "n"]),
                 pj.mask(unused, [None, "n"], constraints=["n >= 2"])):
    want = jax.jit(jax.grad(unused))(np.float32(-0.0), X[:3])
    got = _grad(masked)(np.float32(-0.0), _padded(X[:3], np.nan), 3)[0]
    assert got == want and np.signbit(got) == np.signbit(want)
