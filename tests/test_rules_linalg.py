"""Linear algebra on dynamic matrices: one row per primitive and jnp/scipy function.

Every row runs eagerly, under jit, under vmap over different logical sizes,
and under grad (see harness.py), with NaN/inf/huge values in the padding.
Matrices come from generators that keep them well conditioned (SPD, or a
dominant diagonal), so the comparison tolerances stay tight.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import Case, make, normal, table_test

SIZES = ({"n": 1}, {"n": 4})
PADDED = {"n": 5}
FORWARD = ("eager", "jit", "vmap")


def _dims(shape, sizes):
  return tuple(d if isinstance(d, int) else sizes[d] for d in shape)


def spd(*shape):
  """Symmetric positive definite matrices (the last two axes), eigenvalues >= k."""
  def gen(rng, sizes):
    *batch, k, _ = _dims(shape, sizes)
    b = rng.standard_normal((*batch, k, k))
    return (b @ np.swapaxes(b, -1, -2) + k * np.eye(k)).astype(np.float32)
  return gen


def dominant(*shape):
  """General square matrices with a dominant diagonal: every triangle is well
  conditioned, and partial pivoting has clear winners."""
  def gen(rng, sizes):
    *batch, k, _ = _dims(shape, sizes)
    a = rng.standard_normal((*batch, k, k)) + 3 * np.eye(k) * rng.choice([-1, 1], (*batch, k, 1))
    return a.astype(np.float32)
  return gen


def hermitian(*shape):
  """Complex Hermitian matrices."""
  def gen(rng, sizes):
    *batch, k, _ = _dims(shape, sizes)
    a = rng.standard_normal((*batch, k, k)) + 1j * rng.standard_normal((*batch, k, k))
    return (a + np.conj(np.swapaxes(a, -1, -2))).astype(np.complex64)
  return gen


def pivots(n):
  """LU pivots: row i swaps with some row in [i, n)."""
  return lambda rng, sizes: np.array([rng.integers(i, sizes[n]) for i in range(sizes[n])],
                                     np.int32)


def case(*args, **kw):
  """A Case whose reference and gradient checks run compiled (fewer compiles)."""
  return Case(*args, compiled=True, **kw)


def square(fun, name, gen=spd, **kw):
  return case(name, fun, ["(n, n)"], make(gen("n", "n")), sizes=SIZES, padded=PADDED, **kw)


def solve_case(fun, name, gen=spd, rhs=("n",), **kw):
  spec = "(" + ", ".join(d if isinstance(d, str) else "_" for d in rhs) + ")"
  return case(name, fun, ["(n, n)", spec], make(gen("n", "n"), normal(*rhs)),
              sizes=SIZES, padded=PADDED, **kw)


def triangular_solves(a, left, right, fixed, rhs):
  """Every left_side/lower/transpose_a/unit_diagonal combination, the scipy
  wrapper, and a fixed matrix with a dynamic right-hand side."""
  solves = [lax.linalg.triangular_solve(a, left if side else right, left_side=side,
                                        lower=lower, transpose_a=transpose,
                                        unit_diagonal=unit)
            for side in (True, False) for lower in (True, False)
            for transpose in (True, False) for unit in (True, False)]
  return (*solves, jsl.solve_triangular(a, left, trans=1, lower=True),
          lax.linalg.triangular_solve(fixed, rhs, left_side=False, lower=True))


def sign_fixed(v):
  """Eigenvectors with the sign that makes each column's largest entry positive."""
  big = jnp.argmax(jnp.abs(v), axis=0)
  return v * jnp.sign(jnp.take_along_axis(v, big[None], axis=0))


def gp_log_likelihood(x, y, log_scale, log_noise):
  """A Gaussian-process regression log marginal likelihood over n observations."""
  n = x.shape[0]
  k = jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / jnp.exp(2 * log_scale))
  k = k + jnp.exp(log_noise) * jnp.eye(n)
  chol = jnp.linalg.cholesky(k)
  alpha = jsl.cho_solve((chol, True), y)
  return (-0.5 * y @ alpha - jnp.sum(jnp.log(jnp.diag(chol)))
          - 0.5 * n * jnp.log(2 * jnp.pi))


CASES = [
    # cholesky, with batches of dynamic matrices and dynamic batches of fixed ones
    case("cholesky",
         lambda a, b, c: (jnp.linalg.cholesky(a), jsl.cho_factor(a, lower=False)[0],
                          jnp.linalg.cholesky(b), jnp.linalg.cholesky(c)),
         ["(n, n)", "(_, n, n)", "(b, _, _)"], make(spd("n", "n"), spd(2, "n", "n"),
                                                     spd("b", 3, 3)),
         sizes=({"b": 1, "n": 1}, {"b": 3, "n": 4}), padded={"b": 4, "n": 5}),
    case("triangular_solve", triangular_solves, ["(n, n)", "(n, _)", "(_, n)", None, "(n, _)"],
         make(dominant("n", "n"), normal("n", 2), normal(2, "n"), dominant(3, 3),
              normal("n", 3)), sizes=SIZES, padded=PADDED),
    # lu; `% n` keeps the padding's garbage pivots in range, where swaps would bite
    case("lu", lambda a, p: (*lax.linalg.lu(a),
                             lax.linalg.lu_pivots_to_permutation(p % p.shape[0], p.shape[0])),
         ["(n, n)", "n"], make(dominant("n", "n"), pivots("n")), sizes=SIZES, padded=PADDED),
    solve_case(lambda a, b: (jnp.linalg.solve(a, b), jnp.linalg.solve(a, b[:, 0]),
                             jsl.lu_solve(jsl.lu_factor(a), b), jnp.linalg.inv(a)),
               "solve_inv", gen=dominant, rhs=("n", 2), rtol=1e-4, atol=1e-4),
    square(lambda a: (*jnp.linalg.slogdet(a), jnp.linalg.det(a),
                      jnp.linalg.det(a.at[0].set(0.0))),  # singular: the adjugate
           "slogdet_det", gen=dominant, rtol=1e-4, atol=1e-4),
    # cholesky solves, and the Gaussian-process likelihood that motivates them
    solve_case(lambda a, b: (jsl.cho_solve(jsl.cho_factor(a), b),
                             jsl.cho_solve(jsl.cho_factor(a, lower=True), b[:, 0])),
               "cho_solve", rhs=("n", 2)),
    case("gp_log_likelihood", gp_log_likelihood, ["n", "n", None, None],
         make(normal("n"), normal("n"), lambda rng, s: np.float32(0.3),
              lambda rng, s: np.float32(-1.0)),
         sizes=SIZES, padded=PADDED, rtol=1e-4, atol=1e-4),
    # eigh: eigenvalues sorted, the padding's after them
    case("eigh",
         lambda a, s, h: (*(lambda w, v: (w, sign_fixed(v), (v * jnp.exp(w)) @ v.T))(
             *jnp.linalg.eigh(a)), jnp.linalg.eigh(s, UPLO="U", symmetrize_input=False)[0],
             jnp.linalg.eigh(-s)[0], jnp.linalg.eigvalsh(h)),
         ["(n, n)", "(n, n)", "(_, n, n)"], make(normal("n", "n"), spd("n", "n"),
                                                  hermitian(2, "n", "n")),
         sizes=SIZES, padded=PADDED, rtol=1e-4, atol=1e-4),
    square(lambda a: jnp.linalg.eigh(a * 0.0), "eigh_zero_matrix", modes=FORWARD),
    # qr
    square(jnp.linalg.qr, "qr", gen=normal, rtol=1e-4, atol=1e-4),
    case("qr_rectangular",
         lambda t, w: (jnp.linalg.qr(t), jnp.linalg.qr(w), jnp.linalg.qr(t, mode="complete"),
                       jsl.qr(t, pivoting=True, mode="economic")),
         ["(n, _)", "(_, n)"], make(normal("n", 2), normal(2, "n")),
         sizes=({"n": 3}, {"n": 4}), padded=PADDED, constraints=("n >= 3",),
         rtol=1e-4, atol=1e-4),
]

CASES_BY_NAME, test_rule = table_test(CASES)


# --- what cannot be masked exactly raises ------------------------------------

def _raises(fun, spec, arg, match):
  masked = pj.mask(fun, [spec])
  with pytest.raises(pj.MaskingError, match=match):
    masked([arg], {"n": 2})


def test_lu_of_a_matrix_with_one_dynamic_axis_raises():
  _raises(lax.linalg.lu, "(n, _)", np.ones((4, 3), np.float32), "not square")


def test_qr_with_pivoting_over_dynamic_columns_raises():
  _raises(lambda a: jsl.qr(a, pivoting=True), "(_, n)", np.ones((3, 4), np.float32),
          "column pivoting")


def test_unsorted_eigh_raises():
  _raises(lambda a: lax.linalg.eigh(a, sort_eigenvalues=False), "(n, n)",
          np.eye(4, dtype=np.float32), "without sorting")
