"""`jnp.stack` and `jnp.unstack` in native mode (`_masking/native.py`).

The `stack` and `unstack` primitives move whole values onto or off a new axis
(the masking rule binds them as they are: padding stays padding), and their
tangent map is the same op on the tangents, so they are LINEAR equations of
the native gate. They were unjudged: a masked function that built per-token
values with `jnp.stack` (rotary position embeddings) was refused by the gate,
so `jax.grad` of a `pj.vmap` over a `pj.Ragged` built the shared parameters'
gradient once per example, with a `pj.PerformanceWarning`. Checked with NaN
in the padding against each example alone under `jax.jit`.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def _rotary(w, x):
  n = x.shape[0]
  a = jnp.arange(n, dtype=jnp.float32)[:, None] * jnp.arange(1, 3, dtype=jnp.float32)
  table = jnp.stack([jnp.cos(a), jnp.sin(a)], -1).reshape(n, 4)
  return jnp.sum(jnp.tanh(x @ w) * table)


def _unstacked(w, x):
  h = x @ w
  a, b = jnp.unstack(jnp.stack([h, jnp.sin(h)], 1), axis=1)   # (n, 2, 4) and back
  c, d = jnp.unstack(jnp.stack([a * b, b]), axis=0)           # a new leading axis
  return jnp.sum(c * d) + jnp.max(d)


MODELS = {"rotary_table": _rotary, "unstacked": _unstacked}


@pytest.mark.parametrize("name", list(MODELS))
def test_grad_of_vmap_is_native_and_exact(name):
  f = MODELS[name]
  rng = np.random.default_rng(6)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in (3, 1, 6)]
  ragged = pj.Ragged.from_list(xs)
  lengths = np.asarray(ragged.lengths)
  pad = np.arange(ragged.data.shape[1])[None, :, None] >= lengths[:, None, None]
  poisoned = pj.Ragged(jnp.where(pad, jnp.asarray(np.nan, np.float32), ragged.data),
                       ragged.lengths)
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)
    grad = jax.jit(jax.grad(lambda w: jnp.sum(pj.vmap(f, in_axes=(None, 0))(w, poisoned))))(w)
  want = jax.jit(lambda w, xs: sum(jax.grad(f)(w, x) for x in xs))(w, xs)
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-5)
