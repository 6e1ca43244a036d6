"""Empty examples of a function JAX computes at size 0 but cannot reverse-
differentiate there (a `lax.while_loop`): their values are exact, and only
their derivatives are NaN (`_masking/empty.py`: the VALUES verdict).

The empty path's VJP must trace for the program's derivatives; where JAX
refuses it, the whole path used to be poisoned, so a plain forward call gave
NaN for an empty example where the example alone gives a number. Checked
against each example alone under `jax.jit`, with NaN and inf in the padding,
padded and packed, eagerly and under `jax.jit`, through `pj.mask` with traced
sizes too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import nan_padded
from test_packing import _poison


def newton(w, x):
  """A while_loop over a per-example start (its trip count fixed, its body not)."""
  h = jnp.sum(x @ w, axis=0) + 0.5
  def body(c):
    i, y = c
    return i + 1, jnp.tanh(y) + 1.0
  _, y = lax.while_loop(lambda c: c[0] < 3, body, (0, h))
  return jnp.sum(y)


def until_small(w, x):
  """A data-dependent trip count."""
  h = jnp.sum(jnp.abs(x @ w)) + 4.0
  return lax.while_loop(lambda v: v > 1.0, lambda v: v * 0.5, h)


LENGTHS = (2, 0, 3, 0, 5)


def _examples():
  rng = np.random.default_rng(0)
  return ([rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS],
          rng.normal(size=(3, 4)).astype(np.float32))


def _batch(xs, packed):
  if packed:
    return _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=8)))
  return pj.Ragged(np.stack([nan_padded(x, 8) for x in xs]), np.array([len(x) for x in xs]))


@pytest.mark.parametrize("f", [newton, until_small])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_empty_examples_have_the_values_of_each_example_alone(f, packed):
  xs, w = _examples()
  batch = _batch(xs, packed)
  want = np.array([jax.jit(f)(w, x) for x in xs])
  assert np.all(np.isfinite(want))
  run = lambda w, b: pj.vmap(f, in_axes=(None, 0))(w, b)
  np.testing.assert_allclose(run(w, batch), want, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(run)(w, batch), want, rtol=1e-6)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_forward_mode_is_exact_where_examples_are_not_empty_and_nan_where_they_are(packed):
  xs, w = _examples()
  batch = _batch(xs, packed)
  t = np.random.default_rng(1).normal(size=w.shape).astype(np.float32)
  value, tangent = jax.jvp(lambda w: pj.vmap(newton, in_axes=(None, 0))(w, batch), (w,), (t,))
  for i, x in enumerate(xs):
    want_value, want_tangent = jax.jit(lambda w: jax.jvp(lambda w: newton(w, x), (w,), (t,)))(w)
    np.testing.assert_allclose(value[i], want_value, rtol=1e-6)
    if len(x):
      np.testing.assert_allclose(tangent[i], want_tangent, rtol=1e-5)
    else:   # the empty path's derivative: JAX cannot transpose it, so NaN, never a number
      assert np.isnan(tangent[i])


def test_traced_sizes_of_pj_mask_at_zero():
  xs, w = _examples()
  masked = pj.mask(lambda x: until_small(w, x), ["n, 3"])
  run = jax.jit(lambda xp, n: masked([xp], {"n": n}))
  for x in xs:
    xp = nan_padded(x, 8)
    np.testing.assert_allclose(run(xp, len(x)), jax.jit(until_small)(w, x), rtol=1e-6)
