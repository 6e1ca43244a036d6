"""`jax_debug_nans` / `jax_debug_infs` see only what the user's program computes.

A masked program puts values in its padding that the user's program never
computes: the sort rule's fill, 0/0 and log 0 of (zeroed) padding, and the
caller's own NaN/inf padding under pj.mask. JAX's checks look at every output
whole (and at every primitive eagerly), so these used to raise where jax.jit
on the unpadded input runs (JAX's InternalFloatingPointError escaped pj.jit).
Each case is compared with jax.jit / eager JAX on the unpadded input: the
same values where JAX runs, a FloatingPointError where JAX raises one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

pytestmark = pytest.mark.filterwarnings("ignore::polyjit.PerformanceWarning")

FLAGS = {"nans": jax.debug_nans, "infs": jax.debug_infs}
FUNS = {"sort": jnp.sort, "div": lambda x: x / x, "log": jnp.log,
        "sort_of_log": lambda x: jnp.sort(jnp.log(x))}
GARBAGE = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)


def _positive(rng, n):
  return (rng.random(n) + 0.5).astype(np.float32)


def _padded(x, size, rng):
  out = rng.choice(GARBAGE, size).astype(np.float32)
  out[:len(x)] = x
  return out


@pytest.mark.parametrize("flag", list(FLAGS))
@pytest.mark.parametrize("name", list(FUNS))
def test_pj_jit_runs_where_jax_jit_runs(flag, name):
  fun, rng = FUNS[name], np.random.default_rng(0)
  f = pj.jit(fun, polymorphic_shapes=["n"], buckets=[64])
  with FLAGS[flag](True):
    for n in (9, 31, 5):
      x = _positive(rng, n)
      np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(jax.jit(fun)(x)))


@pytest.mark.parametrize("flag", list(FLAGS))
def test_pj_jit_raises_jax_s_error_for_the_user_s_values(flag):
  bad = -1.0 if flag == "nans" else 0.0   # log(-1) is NaN, log(0) is -inf
  x = np.array([1.0, 2.0, bad, 3.0, 4.0], np.float32)
  f = pj.jit(jnp.log, polymorphic_shapes=["n"], buckets=[64])
  with FLAGS[flag](True):
    with pytest.raises(FloatingPointError) as want:
      jax.jit(jnp.log)(x)
    with pytest.raises(FloatingPointError) as got:
      f(x)
  assert type(got.value) is type(want.value)
  assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


@pytest.mark.parametrize("flag", list(FLAGS))
@pytest.mark.parametrize("name", list(FUNS))
def test_pj_mask_and_vmap_run_where_jax_runs(flag, name):
  fun, rng = FUNS[name], np.random.default_rng(1)
  masked = pj.mask(fun, ["n"])
  jitted = jax.jit(lambda x, n: masked([x], {"n": n}))
  xs = [_positive(rng, n) for n in (5, 1, 8)]
  with FLAGS[flag](True):
    for x in xs:
      want = np.asarray(fun(x))
      xp = _padded(x, 8, rng)
      for got in (masked([xp], {"n": len(x)}), jitted(xp, len(x))):
        np.testing.assert_allclose(np.asarray(got)[:len(x)], want, rtol=1e-6)
    got = pj.vmap(fun)(pj.Ragged.from_list([jnp.asarray(x) for x in xs])).to_list()
    for g, x in zip(got, xs, strict=True):
      np.testing.assert_allclose(np.asarray(g), np.asarray(fun(x)), rtol=1e-6)


@pytest.mark.parametrize("flag", list(FLAGS))
def test_gradients_run_where_jax_runs(flag):
  rng = np.random.default_rng(2)
  loss = lambda x: jnp.sum(jnp.sort(jnp.log(x)) * jnp.arange(x.shape[0]))
  masked = pj.mask(loss, ["n"])
  grad = jax.grad(lambda x, n: masked([x], {"n": n}))
  x = _positive(rng, 5)
  with FLAGS[flag](True):
    want = jax.grad(loss)(x)
    xp = _padded(x, 8, rng)
    for got in (grad(xp, 5), jax.jit(grad)(xp, 5)):
      np.testing.assert_allclose(np.asarray(got)[:5], want, rtol=1e-6)
    f = pj.jit(jax.grad(loss), polymorphic_shapes=["n"], buckets=[8])
    np.testing.assert_allclose(f(x), want, rtol=1e-6)


@pytest.mark.parametrize("flag", list(FLAGS))
def test_masked_functions_raise_for_the_user_s_values(flag):
  bad = -1.0 if flag == "nans" else 0.0
  x = np.array([1.0, 2.0, bad, 3.0, 4.0], np.float32)
  masked = pj.mask(jnp.log, ["n"])
  xp = _padded(x, 8, np.random.default_rng(3))
  with FLAGS[flag](True):
    with pytest.raises(FloatingPointError):
      jnp.log(x)   # (the reference: eager JAX raises)
    with pytest.raises(FloatingPointError):
      masked([xp], {"n": 5})
    with pytest.raises(FloatingPointError):
      jax.jit(lambda x, n: masked([x], {"n": n}))(xp, 5)
    with pytest.raises(FloatingPointError):
      pj.vmap(jnp.log)(pj.Ragged.from_list([jnp.asarray(x), jnp.ones(2)])).to_list()
