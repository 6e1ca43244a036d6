"""A masked scan keeps a real step's infinite derivative infinite.

In native mode the steps past the logical length rerun the first real step
with a zero cotangent. Where that step's derivative is infinite
(`jnp.sqrt(w + x_t)` with `x_0 = -w`), 0 * inf = NaN reached the consts'
cotangent, and the gradient of `w` was NaN where JAX's is inf. Each case
compares with `jax.grad` of the unpadded function, forward and reverse, with
NaN and inf in the padding, eagerly, under `jax.jit` with a traced length,
under `jax.vmap` of `pj.mask` and under `pj.vmap`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

PADDED = 6

STEPS = {
    "sqrt": lambda w, x: jnp.sqrt(w + x),
    "log": lambda w, x: jnp.log(w + x) * 0.5,
    "reciprocal": lambda w, x: 1.0 / (w + x + 1.0) + jnp.sqrt(w + x),
    "sqrt_in_a_jitted_call": lambda w, x: jax.jit(jnp.sqrt)(w + x) * w,
}


def _loss(step, reverse):
  def f(w, xs):
    def body(h, x):
      return h + step(w, x), h
    h, hs = lax.scan(body, jnp.zeros_like(w), xs, reverse=reverse)
    return jnp.sum(h) + jnp.sum(jnp.tanh(hs))
  return f


def _data(n, w, reverse):
  x = np.linspace(0.5, 2.0, n).astype(np.float32)
  x[-1 if reverse else 0] = -w    # the first real step: w + x = 0
  return x


def _padded(x, fill):
  out = np.full(PADDED, fill, np.float32)
  out[:len(x)] = x
  return out


_MASKED: dict[tuple[str, bool], pj.Masked] = {}


def _masked(name, reverse):
  key = (name, reverse)
  if key not in _MASKED:
    _MASKED[key] = pj.mask(_loss(STEPS[name], reverse), [None, "n"], constraints=["n >= 1"])
  return _MASKED[key]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("name", list(STEPS))
def test_an_infinite_gradient_stays_infinite(name, reverse):
  f, masked = _loss(STEPS[name], reverse), _masked(name, reverse)
  w = np.float32(2.0)
  x = _data(3, w, reverse)
  want_w, want_x = jax.grad(f, argnums=(0, 1))(w, x)
  assert np.isinf(want_w)   # (the case this checks)
  grad = jax.grad(lambda w, xp, n: masked([w, xp], {"n": n}), argnums=(0, 1))
  for fill in (np.nan, np.inf):
    xp = _padded(x, fill)
    for got_w, got_x in (grad(w, xp, 3), jax.jit(grad)(w, xp, 3)):
      np.testing.assert_allclose(got_w, want_w, rtol=1e-6)
      np.testing.assert_allclose(np.asarray(got_x)[:3], want_x, rtol=1e-6)
      assert np.all(np.asarray(got_x)[3:] == 0)


@pytest.mark.parametrize("reverse", [False, True])
def test_an_infinite_gradient_of_a_batch(reverse):
  f, masked = _loss(STEPS["sqrt"], reverse), _masked("sqrt", reverse)
  w = np.float32(2.0)
  examples = [_data(n, w, reverse) for n in (3, 1, 5)]
  examples.append(np.linspace(0.5, 1.0, 4).astype(np.float32))   # all finite
  want = sum(jax.grad(f)(w, x) for x in examples)
  assert np.isinf(want)
  batch = np.stack([_padded(x, np.nan) for x in examples])
  lengths = np.array([len(x) for x in examples], np.int32)
  loss = lambda w: jnp.sum(jax.vmap(lambda x, n: masked([w, x], {"n": n}))(batch, lengths))
  ragged = lambda w: pj.vmap(f, in_axes=(None, 0))(w, pj.Ragged(batch, lengths)).sum()
  for g in (jax.jit(jax.grad(loss)), jax.jit(jax.grad(ragged))):
    np.testing.assert_allclose(g(w), want, rtol=1e-6)
  finite = [x for x in examples if np.all(x > -w)]   # (and a finite one stays exact)
  want = sum(jax.grad(f)(w, x) for x in finite)
  rows = np.stack([_padded(x, np.inf) for x in finite])
  got = jax.jit(jax.grad(lambda w: pj.vmap(f, in_axes=(None, 0))(
      w, pj.Ragged(rows, np.array([len(x) for x in finite], np.int32))).sum()))(w)
  np.testing.assert_allclose(got, want, rtol=1e-6)
