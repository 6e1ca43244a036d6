"""The index helpers and 1-d convolution at a dynamic size.

`jnp.diag_indices` (tinygp's `K.at[jnp.diag_indices(n)].add(diag)`),
`diag_indices_from`, `fill_diagonal`, `eye`/`identity`/`tri` with a dynamic
size, `tril_indices`/`triu_indices` (a selection of data-dependent size), and
`jnp.convolve` / `jnp.correlate` in every mode, with the dynamic operand first
or second, shorter or longer than the fixed one, or both dynamic
(`polyjit/_spellings/indices.py`, `signal.py`). Every row runs against the
unpadded computation with NaN/inf padding, under jit, under vmap over logical
sizes and under grad (tests/harness.py); the last tests run `pj.jit` over
many sizes (against `jax.jit`, with bounded compiles) and `pj.vmap` over a
`pj.Ragged`.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from harness import Case, make, normal, reference_options, table_test

COMPILED = ("jit", "vmap", "grad")
K3 = np.array([0.25, 0.5, -0.75], np.float32)
K4 = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


def row(name, fun, in_shapes, *pieces, **kw):
  return Case(name, fun, in_shapes, make(*pieces), **{"compiled": True, "modes": COMPILED,
                                                      **kw})


def tinygp_diag(k, d):
  """tinygp/noise.py: a covariance plus a diagonal, then its Cholesky solve."""
  K = k @ k.T + k.shape[0] * jnp.eye(k.shape[0])
  K = K.at[jnp.diag_indices(K.shape[0])].add(d ** 2)
  L = jnp.linalg.cholesky(K)
  return jax.scipy.linalg.cho_solve((L, True), d)


def diag_helpers(m, v):
  n = m.shape[0]
  i, j = jnp.diag_indices(n)
  return (m[i, j] * 2.0, m[jnp.diag_indices_from(m)], jnp.fill_diagonal(m, 3.0, inplace=False),
          jnp.fill_diagonal(m, v, inplace=False), m.at[jnp.diag_indices(n)].set(v),
          m + jnp.eye(n), m * jnp.eye(n, k=1), m @ jnp.identity(n), m * jnp.tri(n, k=-1),
          jnp.eye(3, n) @ v)


def diag_3d(t):
  return t[jnp.diag_indices(t.shape[0], 3)], t.at[jnp.diag_indices_from(t)].add(1.0)


def tri_indices(m):
  n = m.shape[0]
  return (m[jnp.tril_indices(n)], m[jnp.triu_indices(n, 1)], m[jnp.tril_indices_from(m, -1)],
          m[jnp.triu_indices_from(m)])


def convolutions(op):
  fn = getattr(jnp, op)   # a reference taken before the trace is intercepted too

  def f(x, y):
    return tuple(out for mode in ("full", "same", "valid")
                 for out in (fn(x, K3, mode), fn(K4, x, mode), fn(x, y, mode),
                             fn(x[::-1], x, mode), fn(x, jnp.ones(1), mode)))
  f.__name__ = op
  return f


def complex_correlate(x, y):
  z = x + 1j * y
  w = jnp.array([1 - 2j, 0.5j, 3.0], jnp.complex64)
  return (jnp.correlate(z, w, "same"), jnp.correlate(w, z, "full"),
          jnp.correlate(w, z, "valid"), jnp.convolve(w, z, "same"))


CASES = [
    row("tinygp_diagonal", tinygp_diag, ["(n, 3)", "n"], normal("n", 3), normal("n")),
    row("diag_indices_eye_tri_fill", diag_helpers, ["(n, n)", "n"], normal("n", "n"),
        normal("n")),
    row("diag_indices_3d", diag_3d, ["(n, n, n)"], normal("n", "n", "n"),
        sizes=({"n": 1}, {"n": 4}), padded={"n": 5}),
    row("tril_triu_indices", tri_indices, ["(n, n)"], normal("n", "n")),
    *[row(f"{op}_every_mode", convolutions(op), ["n", "m"], normal("n"), normal("m"),
          sizes=({"n": 1, "m": 2}, {"n": 3, "m": 5}, {"n": 6, "m": 1}),
          padded={"n": 8, "m": 6})
      for op in ("convolve", "correlate")],
    row("correlate_complex", complex_correlate, ["n", "n"], normal("n"), normal("n"),
        sizes=({"n": 1}, {"n": 2}, {"n": 5})),
]

CASES_BY_NAME, test_rule = table_test(CASES)


def smoothing(x):
  """A 3-tap smoothing, a matched filter, an autocorrelation and a diagonal."""
  n = x.shape[0]
  m = jnp.outer(x, x)
  return (jnp.convolve(x, K3 / 3, "same"), jnp.correlate(x, K4, "valid"),
          jnp.correlate(x, x, "full"), m.at[jnp.diag_indices(n)].add(1.0).sum(0),
          jnp.fill_diagonal(m, 0.0, inplace=False).sum(1))


def test_pj_jit_over_sizes_matches_jax_jit_with_bucketed_programs():
  f = pj.jit(smoothing, fallback="error", buckets=pj.buckets.PowersOfTwo(minimum=4))
  sizes = (1, 2, 3, 5, 6, 7, 9, 12)
  with pj.diagnostics.count_compiles() as compiles:
    outs = [f(np.random.default_rng(n).standard_normal(n).astype(np.float32)) for n in sizes]
  # jax.jit at each size, the sizes' programs in one (one compile, not one per size)
  wants = jax.jit(lambda xs: [smoothing(x) for x in xs], compiler_options=reference_options())(
      [np.random.default_rng(n).standard_normal(n).astype(np.float32) for n in sizes])
  for out, want in zip(outs, wants, strict=True):
    for a, b in zip(out, want, strict=True):
      assert a.shape == b.shape
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # the first call exact (one size seen), then the buckets 4, 8 and 16
  assert len([c for c in compiles if "smoothing" in c.fun_name]) <= 4


def test_pj_vmap_over_a_ragged_batch_matches_each_example():
  xs = [np.random.default_rng(n).standard_normal(n).astype(np.float32) for n in (1, 3, 4, 9)]
  outs = pj.vmap(smoothing)(pj.Ragged.from_list(xs))
  # each example alone, under one jax.jit (op by op, each op compiled at each length)
  wants = jax.jit(lambda xs: [smoothing(x) for x in xs], compiler_options=reference_options())(
      xs)
  for k, want in enumerate(wants):
    for out, w in zip(outs, want, strict=True):
      got = out.to_list()[k] if hasattr(out, "to_list") else np.asarray(out)[k]
      np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
