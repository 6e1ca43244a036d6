"""Gradients of max and min where valid values tie with the padding's fill.

The reduction rules fill the padding with the identity (-inf for max), and
JAX's derivative of a maximum divides the tangent among every position that
reaches it: with a valid maximum of -inf the filled padding tied with it, and
each valid position got 1/padded instead of 1/n. Each case compares with
`jax.grad` of the unpadded function, with NaN and inf in the padding, eagerly
and under `jax.jit` with a traced size, under `jax.vmap` of `pj.mask` and
under `pj.vmap`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

INF = np.inf
PADDING = [np.nan, INF, -INF, np.nan]

CASES = {
    "max_all_minus_inf": (jnp.max, "n", [-INF, -INF]),
    "min_all_plus_inf": (jnp.min, "n", [INF, INF]),
    "max_ties": (jnp.max, "n", [1.0, 3.0, 3.0]),
    "max_of_plus_inf": (jnp.max, "n", [INF, 2.0]),
    "amax_rows": (lambda v: jnp.sum(jnp.max(v, axis=0) * jnp.array([1.0, 2.0])), "(n, _)",
                  [[-INF, 1.0], [-INF, 2.0], [-INF, 2.0]]),
    "min_rows_kept_axis_dynamic": (lambda v: jnp.sum(jnp.min(v, axis=1) * 3.0), "(n, _)",
                                   [[INF, INF], [0.5, 0.5]]),
}


def _padded(values, padded=6):
  x = np.asarray(values, np.float32)
  fill = np.resize(np.asarray(PADDING, np.float32), (padded - x.shape[0],) + x.shape[1:])
  return np.concatenate([x, fill])


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_counts_valid_ties_only(name):
  f, spec, values = CASES[name]
  x = np.asarray(values, np.float32)
  n = x.shape[0]
  want = np.asarray(jax.grad(f)(x))
  xp = _padded(values)
  masked = lambda v, n: pj.mask(f, [spec])([v], {"n": n})
  for got in (jax.grad(masked)(xp, n), jax.jit(jax.grad(masked))(xp, n)):
    got = np.asarray(got)
    np.testing.assert_array_equal(got[:n], want)
    np.testing.assert_array_equal(got[n:], 0.0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_under_vmap_of_mask_and_pj_vmap(name):
  f, spec, values = CASES[name]
  x = np.asarray(values, np.float32)
  shorter = x[:1]
  wants = [np.asarray(jax.grad(f)(v)) for v in (x, shorter)]
  batch = np.stack([_padded(x), _padded(shorter)])
  lengths = np.array([x.shape[0], 1], np.int32)
  loss = lambda b, ns: jnp.sum(jax.vmap(lambda v, n: pj.mask(f, [spec])([v], {"n": n}))(b, ns))
  ragged_loss = lambda b, ns: jnp.sum(pj.vmap(f)(pj.Ragged(b, ns)))
  for got in (jax.jit(jax.grad(loss))(batch, lengths),
              jax.jit(jax.grad(ragged_loss))(batch, lengths)):
    got = np.asarray(got)
    for row, want, n in zip(got, wants, lengths, strict=True):
      np.testing.assert_array_equal(row[:n], want)
      np.testing.assert_array_equal(row[n:], 0.0)
