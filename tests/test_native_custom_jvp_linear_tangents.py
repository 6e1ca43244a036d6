"""Reverse mode through a user `jax.custom_jvp` whose rule moves its tangent.

In native mode (`_masking/native.py`) a custom_jvp rule is evaluated masked
and JAX transposes the tangent part of that evaluation. The rule's sums,
reshapes, transposes, cumsums, broadcasts and contractions of the tangent
are wrapped like any LINEAR equation's output; the wrap must be a map JAX can
transpose (a select of zeros), not `select(valid, t, stop_gradient(t))`,
whose `stop_gradient` has no transpose rule. Gradients with respect to the
padded input and to shared parameters are compared with `jax.grad` on the
unpadded input, padding NaN/inf/huge, eagerly, under jit and under pj.vmap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

GARBAGE = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)
PADDED, D = 8, 3


@jax.custom_jvp
def safe_norm(x):
  return jnp.sqrt(jnp.sum(x * x, -1) + 1e-6)


@safe_norm.defjvp
def _safe_norm_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  n = safe_norm(x)
  return n, (x * t).sum(-1) / n


@jax.custom_jvp
def flat_sin(x):
  return jnp.sin(x).reshape(-1)


@flat_sin.defjvp
def _flat_sin_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return flat_sin(x), (jnp.cos(x) * t).reshape(-1)


@jax.custom_jvp
def sin_t(x):
  return jnp.sin(x).T


@sin_t.defjvp
def _sin_t_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return sin_t(x), (jnp.cos(x) * t).T


@jax.custom_jvp
def cum_sin(x):
  return jnp.cumsum(jnp.sin(x), axis=0)


@cum_sin.defjvp
def _cum_sin_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return cum_sin(x), jnp.cumsum(jnp.cos(x) * t, axis=0)


@jax.custom_jvp
def scale(x, s):
  return x * s


@scale.defjvp
def _scale_jvp(primals, tangents):
  (x, s), (tx, ts) = primals, tangents
  return scale(x, s), tx * s + x * ts   # ts broadcast over the padded rows


@jax.custom_jvp
def matmul(x, w):
  return x @ w


@matmul.defjvp
def _matmul_jvp(primals, tangents):
  (x, w), (tx, tw) = primals, tangents
  return matmul(x, w), tx @ w + x @ tw   # contracts over x's columns


def _softmax(x, w, s):
  with jax.softmax_custom_jvp(True):
    return jnp.sum(jax.nn.softmax(x @ w, axis=0) * jnp.cos(x @ w)) * s


MODELS = {
    "sum": lambda x, w, s: jnp.sum(safe_norm(x @ w) * s),
    "reshape": lambda x, w, s: jnp.sum(jnp.cos(flat_sin(x @ w)) * s),
    "transpose": lambda x, w, s: jnp.sum(jnp.cos(sin_t(x @ w)) * s),
    "cumsum": lambda x, w, s: jnp.sum(jnp.cos(cum_sin(x @ w)) * s),
    "broadcast": lambda x, w, s: jnp.sum(jnp.sin(scale(x @ w, s))),
    "contraction": lambda x, w, s: jnp.sum(jnp.sin(matmul(jnp.tanh(x), w)) * s),
    "softmax": _softmax,
}


def _inputs(rng, n):
  x = rng.standard_normal((n, D)).astype(np.float32)
  w = (rng.standard_normal((D, D)) * 0.5).astype(np.float32)
  s = np.float32(1.3)
  xp = rng.choice(GARBAGE, (PADDED, D)).astype(np.float32)
  xp[:n] = x
  return x, xp, w, s


@pytest.mark.parametrize("name", list(MODELS))
def test_custom_jvp_rule_moving_its_tangent_under_mask(name):
  fun = MODELS[name]
  masked = pj.mask(fun, ["(n, _)", None, None])
  rng = np.random.default_rng(0)
  # eagerly (concrete n) and one jitted program for every n (traced); the
  # reference under jax.jit (a compile per length, not per op and length)
  grad = jax.grad(lambda xp, w, s, n: masked([xp, w, s], {"n": n}), argnums=(0, 1, 2))
  jitted, reference = jax.jit(grad), jax.jit(jax.grad(fun, argnums=(0, 1, 2)))
  for n in (5, 1, 8):
    x, xp, w, s = _inputs(rng, n)
    want = reference(x, w, s)
    for got in (grad(xp, w, s, n), jitted(xp, w, s, n)):
      np.testing.assert_allclose(got[0][:n], want[0], rtol=2e-5, atol=2e-6)
      for g, r in zip(got[1:], want[1:], strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", list(MODELS))
def test_custom_jvp_rule_moving_its_tangent_under_vmap(name):
  fun = MODELS[name]
  rng = np.random.default_rng(1)
  lengths = (5, 2, 8)
  ins = [_inputs(rng, n) for n in lengths]
  w, s = ins[0][2], ins[0][3]
  data = np.stack([xp for _, xp, _, _ in ins])
  batch = pj.Ragged(jnp.asarray(data), jnp.asarray(lengths, jnp.int32))
  loss = lambda w, s: pj.vmap(fun, in_axes=(0, None, None))(batch, w, s).sum()
  reference = jax.jit(jax.grad(fun, argnums=(1, 2)))
  want = [sum(g) for g in zip(*[reference(x, w, s) for x, _, _, _ in ins], strict=True)]
  for got in (jax.grad(loss, argnums=(0, 1))(w, s), jax.jit(jax.grad(loss, argnums=(0, 1)))(w, s)):
    for g, r in zip(got, want, strict=True):
      assert np.all(np.isfinite(g))
      np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)
