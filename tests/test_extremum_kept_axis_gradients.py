"""Gradients of a max/min over one dynamic axis of a value padded along another.

The extremum's derivative counts the valid positions that reach it. Counted
along the reduced axes only, a padded slice of a *kept* dynamic axis (a
column past `m` of `jnp.max(x, axis=0)` for x of spec "(n, m)") had no
position equal to its NaN maximum: 0/0, and the reverse pass carried that
NaN into the gradient of what was broadcast into the slice (a scalar `s` in
`x + s`, a vector in `y[:, None] + y[None, :]`). Each case compares with
`jax.grad` of the unpadded function, with NaN and inf in the padding, eagerly,
under `jax.jit` with traced sizes, under `jax.vmap` of `pj.mask` and under
`pj.vmap`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

FILLS = [np.nan, np.inf]

# (f(s, x), spec of x, logical shape of x)
CASES = {
    "max_over_rows_of_two_padded_axes": (
        lambda s, x: jnp.sum(jnp.sin(jnp.max(x + s, axis=0))), "(n, m)", (3, 2)),
    "min_over_columns_of_two_padded_axes": (
        lambda s, x: jnp.sum(jnp.cos(jnp.min(x * s, axis=1))), "(n, m)", (2, 3)),
    "max_of_outer_sum_of_a_vector": (
        lambda s, y: jnp.sum(jnp.sin(jnp.max(y[:, None] + y[None, :] * s, axis=0))), "n",
        (4,)),
    "min_of_outer_sum_of_a_vector": (
        lambda s, y: jnp.sum(jnp.min(y[:, None] - y[None, :] + s, axis=1) ** 2), "n", (3,)),
}

PADDED = {"(n, m)": (5, 4), "n": (6,)}

_MASKED: dict[str, pj.Masked] = {}


def _masked(name):
  """One pj.mask per case, shared by the fills (one trace each)."""
  if name not in _MASKED:
    f, spec, _ = CASES[name]
    _MASKED[name] = pj.mask(f, [None, spec], constraints=["n >= 1"])
  return _MASKED[name]


def _padded(x, shape, fill):
  out = np.full(shape, fill, np.float32)
  out[tuple(slice(0, d) for d in x.shape)] = x
  return out


def _sizes(spec, x):
  return {"n": x.shape[0], "m": x.shape[1]} if spec == "(n, m)" else {"n": x.shape[0]}


def _want(f, s, x):
  return [np.asarray(g) for g in jax.grad(f, argnums=(0, 1))(s, jnp.asarray(x))]


def _check(got, want, x):
  gs, gx = (np.asarray(g) for g in got)
  np.testing.assert_allclose(gs, want[0], rtol=1e-6)
  valid = tuple(slice(0, d) for d in x.shape)
  np.testing.assert_allclose(gx[valid], want[1], rtol=1e-6)
  rest = np.ones(gx.shape, bool)
  rest[valid] = False
  assert np.all(gx[rest] == 0)


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("name", list(CASES))
def test_gradient_is_exact_eagerly_and_under_jit(name, fill):
  f, spec, shape = CASES[name]
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  s = np.float32(0.7)
  want = _want(f, s, x)
  xp = _padded(x, PADDED[spec], fill)
  masked = _masked(name)
  sizes = _sizes(spec, x)
  eager = jax.grad(lambda s, xp: masked([s, xp], sizes), argnums=(0, 1))
  traced = jax.jit(jax.grad(lambda s, xp, sz: masked([s, xp], sz), argnums=(0, 1)))
  _check(eager(s, xp), want, x)
  _check(traced(s, xp, {k: np.int32(v) for k, v in sizes.items()}), want, x)


@pytest.mark.parametrize("fill", [np.nan, np.inf])
@pytest.mark.parametrize("name", [k for k, v in CASES.items() if v[1] == "n"])
def test_gradient_of_a_batch_is_exact(name, fill):
  f, spec, _ = CASES[name]
  rng = np.random.default_rng(1)
  examples = [rng.standard_normal(n).astype(np.float32) for n in (4, 1, 6, 3)]
  s = np.float32(0.7)
  want = sum(_want(f, s, x)[0] for x in examples)
  batch = np.stack([_padded(x, (6,), fill) for x in examples])
  lengths = np.array([len(x) for x in examples], np.int32)
  masked = _masked(name)
  loss = lambda s: jnp.sum(jax.vmap(lambda x, n: masked([s, x], {"n": n}))(batch, lengths))
  ragged = lambda s: pj.vmap(f, in_axes=(None, 0))(s, pj.Ragged(batch, lengths)).sum()
  for g in (jax.grad(loss), jax.jit(jax.grad(ragged))):
    np.testing.assert_allclose(g(s), want, rtol=1e-5)
