"""Empty examples of a function JAX computes at size 0 but cannot reverse-
differentiate there (a `lax.while_loop`): their values and their forward-mode
derivatives are exact (`_masking/empty.py`: the FORWARD verdict,
`_masking/forward_only.py`); their reverse-mode derivatives are NaN (JAX
raises for the example alone), and where the other examples' path has the
while_loop too, reverse mode raises JAX's error, as for an example alone.

The empty path's VJP must trace for the program's reverse-mode derivatives;
where JAX refuses it, the whole path used to be poisoned, so a plain forward
call gave NaN for an empty example where the example alone gives a number;
then its values were exact and its derivatives NaN, so `jax.jvp` and
`jax.jacfwd` gave NaN where the example alone gives numbers. Checked against
each example alone under `jax.jit`, with NaN and inf in the padding, padded
and packed, eagerly and under `jax.jit`, through `pj.mask` with traced sizes
too.
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


def over_the_tokens(w, x):
  """A while_loop over the example's length: at length 0 the result is its
  initial carry, whose tangent is the parameters' (not 0). (Its step reads
  no token: JAX refuses `x[i]` of an empty `x`, for the example alone too.)"""
  s = jnp.sum(x[:, 0])
  def body(c):
    i, y = c
    return i + 1, jnp.tanh(y * w[:, 0] + s)
  return lax.while_loop(lambda c: c[0] < x.shape[0], body, (0, w[:, 0] + 0.5))[1]


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


@pytest.mark.parametrize("f", [newton, over_the_tokens])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_forward_mode_is_exact_on_every_example_empty_ones_included(f, packed):
  xs, w = _examples()
  batch = _batch(xs, packed)
  t = np.random.default_rng(1).normal(size=w.shape).astype(np.float32)
  run = lambda w: pj.vmap(f, in_axes=(None, 0))(w, batch)
  value, tangent = jax.jvp(run, (w,), (t,))
  jacobian = jax.jit(jax.jacfwd(run))(w)
  for i, x in enumerate(xs):
    want_value, want_tangent = jax.jit(lambda w: jax.jvp(lambda w: f(w, x), (w,), (t,)))(w)
    np.testing.assert_allclose(value[i], want_value, rtol=1e-6)
    np.testing.assert_allclose(tangent[i], want_tangent, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jacobian[i], jax.jit(jax.jacfwd(f))(w, x), rtol=1e-5, atol=1e-6)
  if f is over_the_tokens:
    assert np.all(tangent[1] != 0)   # (an empty example's tangent, a number)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_reverse_mode_raises_as_for_the_example_alone(packed):
  xs, w = _examples()
  batch = _batch(xs, packed)
  with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
    jax.grad(lambda w: jnp.sum(over_the_tokens(w, xs[0])))(w)
  with pytest.raises((ValueError, pj.MaskingError), match="while_loop"):
    jax.grad(lambda w: jnp.sum(pj.vmap(over_the_tokens, in_axes=(None, 0))(w, batch)))(w)


def test_traced_sizes_of_pj_mask_at_zero():
  xs, w = _examples()
  masked = pj.mask(lambda x: until_small(w, x), ["n, 3"])
  run = jax.jit(lambda xp, n: masked([xp], {"n": n}))
  for x in xs:
    xp = nan_padded(x, 8)
    np.testing.assert_allclose(run(xp, len(x)), jax.jit(until_small)(w, x), rtol=1e-6)


def loop_only_when_empty(w, x):
  """Differentiable at every length but 0, where a while_loop runs."""
  if x.shape[0] == 0:
    return lax.while_loop(lambda v: v[0] > 1.0, lambda v: v * 0.5, w[:, 0] + 4.0)[0]
  return jnp.sum(jnp.tanh(x @ w))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_reverse_mode_through_an_empty_path_is_nan_and_forward_mode_exact(packed):
  xs, w = _examples()
  batch = _batch(xs, packed)
  run = lambda w: pj.vmap(loop_only_when_empty, in_axes=(None, 0))(w, batch)
  t = np.random.default_rng(2).normal(size=w.shape).astype(np.float32)
  value, tangent = jax.jit(lambda w: jax.jvp(run, (w,), (t,)))(w)
  for i, x in enumerate(xs):
    want, want_t = jax.jit(lambda w: jax.jvp(lambda w: loop_only_when_empty(w, x),
                                             (w,), (t,)))(w)
    np.testing.assert_allclose(value[i], want, rtol=1e-6)
    np.testing.assert_allclose(tangent[i], want_t, rtol=1e-5, atol=1e-6)
  # reverse mode: JAX refuses the empty example alone; here no plausible number
  grad = jax.jit(jax.grad(lambda w: jnp.sum(run(w))))(w)
  assert np.all(np.isnan(grad))
  # without the empty examples, the gradient is JAX's
  full = [i for i, x in enumerate(xs) if len(x)]
  only = jax.jit(jax.grad(lambda w: sum(loop_only_when_empty(w, xs[i]) for i in full)))(w)
  grad_full = jax.jit(jax.grad(lambda w: jnp.sum(run(w)[np.array(full)])))(w)
  np.testing.assert_allclose(grad_full, only, rtol=1e-5, atol=1e-6)
