"""A masked `lax.scan` whose logical length can be 0 while the sizes are >= 1.

JAX's sizes are >= 1, and so are the sizes polyjit's main trace runs with
(`_masking/empty.py`), but a scan over `x[1:]` (the time steps between
observations, `jnp.diff`) has length `n - 1`: 0 for a one-element example.
In native mode (JAX differentiates the masked evaluation) the scan's steps
past the logical end run on the first real step's slices; with no real step
they run on zeros, where a body's derivative may be infinite (`w / dt` at
`dt = 0`), and 0 * inf = NaN reached the shared weights' gradient: a whole
batch's gradient NaN because one example had one element. And a scan whose
*padded* length is 0 (a batch of one-element examples) crashed on the slice
that takes the first real step. Each check: NaN/inf padding, lengths 1..9,
under `pj.vmap`, `jax.vmap(pj.mask)` and `jax.jit(pj.mask)`, against
`jax.value_and_grad` of each unpadded example.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

LENGTHS = (3, 1, 2, 9, 5, 1)
PADDED = 9
GARBAGE = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)


def decay(w, t):
  """A continuous-time recurrence over the gaps between observation times
  `t`: its derivative in `w` is infinite at a gap of 0."""
  dt = t[1:] - t[:-1]

  def step(h, d):
    h = h * jnp.exp(-w["rate"] / d) + w["gain"] * jnp.sqrt(d)
    return h, h * jnp.log(d)

  h, ys = lax.scan(step, jnp.float32(1.0), dt)
  hb, _ = lax.scan(step, jnp.float32(0.5), dt, reverse=True)
  return h + hb + jnp.sum(ys)


def _params():
  return {"rate": jnp.float32(0.3), "gain": jnp.float32(0.7)}


def _data(rng, lengths, padded):
  ts = [np.cumsum(rng.random(n) + 0.5).astype(np.float32) for n in lengths]
  t = rng.choice(GARBAGE, (len(lengths), padded)).astype(np.float32)
  for i, a in enumerate(ts):
    t[i, :len(a)] = a
  return ts, t, np.array(lengths, np.int32)


def _loss(how):
  masked = pj.mask(decay, [None, "n"], constraints=["n >= 1"])
  if how == "pj.vmap":
    return lambda w, t, n: pj.vmap(decay, in_axes=(None, 0))(w, pj.Ragged(t, n)).sum()
  if how == "jax.vmap(pj.mask)":
    return lambda w, t, n: jax.vmap(lambda t, n: masked([w, t], {"n": n}))(t, n).sum()
  each = jax.jit(lambda w, t, n: masked([w, t], {"n": n}))
  return lambda w, t, n: sum(each(w, t[i], n[i]) for i in range(t.shape[0]))


def _check(how, lengths, padded):
  rng = np.random.default_rng(0)
  w = _params()
  ts, t, n = _data(rng, lengths, padded)
  fun = jax.value_and_grad(_loss(how), argnums=(0, 1))
  value, (gw, gt) = fun(w, jnp.asarray(t), jnp.asarray(n))
  want = [jax.jit(jax.value_and_grad(decay, argnums=(0, 1)))(w, jnp.asarray(a)) for a in ts]
  np.testing.assert_allclose(value, sum(float(v) for v, _ in want), rtol=1e-5)
  want_w = jax.tree.map(lambda *g: sum(g), *[g for _, (g, _) in want])
  for key in w:
    assert np.isfinite(gw[key]), (key, gw[key])
    np.testing.assert_allclose(gw[key], want_w[key], rtol=1e-4, atol=1e-5)
  gt = np.asarray(gt)
  for i, (_, (_, g)) in enumerate(want):
    np.testing.assert_allclose(gt[i, :lengths[i]], g, rtol=1e-4, atol=1e-5)
    assert np.all(gt[i, lengths[i]:] == 0)


HOWS = ["pj.vmap", "jax.vmap(pj.mask)", "jax.jit(pj.mask)"]


@pytest.mark.parametrize("how", HOWS)
def test_a_scan_with_no_real_step_sends_no_nan_to_the_weights(how):
  _check(how, LENGTHS, PADDED)


@pytest.mark.parametrize("how", HOWS)
def test_a_scan_whose_padded_length_is_zero_differentiates(how):
  _check(how, (1, 1), 1)
