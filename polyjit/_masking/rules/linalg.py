"""Linear algebra on dynamic matrices: pad so the valid block is decoupled.

A factorization or solve mixes every row and column of a matrix, so garbage
in the padding of an (n, n) matrix would reach every entry. The rules replace
the padding with a block that never couples to the valid one: for the padded
matrix `M = [[A, 0], [0, D]]` every decomposition used here is block-wise,
`f(M) = [[f(A), 0], [0, f(D)]]`, so the valid block of the result is `f(A)`:

* `cholesky`, `lu`, `triangular_solve`: `D = I`. Cholesky and LU of the
  identity are the identity; LU's partial pivoting never picks a padding row
  for a valid column (its entries there are exact zeros, and ties go to the
  first row), so pivots and permutation keep the valid rows in place. The
  right-hand side of a solve gets zeros in its padding, so the solution is
  zero there and `0 * NaN` never enters a back substitution.
* `eigh`: `D = c I` with `c` strictly above every eigenvalue of `A` (a
  Gershgorin bound of the triangle the primitive reads), so the padding
  eigenvalues sort after the valid ones and the valid eigenpairs come first.
* `qr`: `D = 0` (and zero rows or columns for rectangular matrices). A zero
  column gives a Householder reflection of zero (tau = 0), so the valid part
  of Q and R is that of A, for thin, full and tall or wide matrices.

Padding along batch axes gets the same block, so every padded matrix is a
harmless one. `lu_pivots_to_permutation` gets identity swaps in the padding
of its pivots; `custom_linear_solve` (`jnp.linalg.solve`) evaluates its solve
jaxpr masked, as its implementation does. Derivatives need nothing more:
their JVPs emit the same primitives, plus matmuls and triangle masks that
other rule families handle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax
import jax.numpy as jnp

from ... import _jax as jc
from ..core import RuleContext, register


def _zero(dtype: Any) -> Any:
  return np.zeros((), dtype)[()]


def _eye_like(x: Any) -> Any:
  """The identity matrix broadcast to `x`'s shape (its last two axes)."""
  rows = lax.broadcasted_iota(np.int32, x.shape, x.ndim - 2)
  cols = lax.broadcasted_iota(np.int32, x.shape, x.ndim - 1)
  return lax.convert_element_type(lax.eq(rows, cols), x.dtype)


def _pad_diagonal(ctx: RuleContext, x: Any, aval: Any, diagonal: Any=None) -> Any:
  """`x` with its padding replaced by `diagonal` times the identity.

  `diagonal` is broadcastable to the batch shape (default 1); padding along
  batch axes becomes a whole such matrix.
  """
  mask = ctx.valid_mask(aval)
  if mask is None:
    return x
  block = _eye_like(x)
  if diagonal is not None:
    block = block * diagonal[..., None, None]
  return lax.select(mask, x, block)


def _check_square(ctx: RuleContext, aval: Any) -> None:
  rows, cols = aval.shape[-2:]
  if (jc.is_symbolic_dim(rows) or jc.is_symbolic_dim(cols)) and rows != cols:
    raise ctx.error(
        f"its matrix {aval.str_short()} is not square with equal dynamic "
        "dimensions, so no padding block keeps the valid block's pivoting "
        "intact.",
        "factor a square matrix whose two axes share one dimension, or give "
        "the matrix fixed sizes.")


@register("cholesky")
def _cholesky(ctx: RuleContext, x: Any, **params: Any) -> list[Any]:
  aval, = ctx.in_avals
  return ctx.bind(_pad_diagonal(ctx, x, aval), **params)


@register("lu")
def _lu(ctx: RuleContext, x: Any, **params: Any) -> list[Any]:
  aval, = ctx.in_avals
  _check_square(ctx, aval)
  return ctx.bind(_pad_diagonal(ctx, x, aval), **params)


@register("triangular_solve")
def _triangular_solve(ctx: RuleContext, a: Any, b: Any, **params: Any) -> list[Any]:
  a_aval, b_aval = ctx.in_avals
  a = _pad_diagonal(ctx, a, a_aval)
  b = ctx.fill_padding(b, b_aval, _zero(b.dtype))
  return ctx.bind(a, b, **params)


@register("lu_pivots_to_permutation")
def _lu_pivots_to_permutation(ctx: RuleContext, pivots: Any, **params: Any) -> list[Any]:
  aval, = ctx.in_avals
  mask = ctx.valid_mask(aval)
  if mask is not None:  # swapping row i with itself does nothing
    identity = lax.broadcasted_iota(pivots.dtype, pivots.shape, pivots.ndim - 1)
    pivots = lax.select(mask, pivots, identity)
  return ctx.bind(pivots, **params)


@register("qr")
def _qr(ctx: RuleContext, x: Any, *, pivoting: Any, **params: Any) -> list[Any]:
  aval, = ctx.in_avals
  if pivoting and jc.is_symbolic_dim(aval.shape[-1]):
    raise ctx.error(
        "column pivoting would rank the zero padding columns against valid "
        "columns of zero norm.",
        "use QR without pivoting, or a fixed number of columns.")
  return ctx.bind(ctx.fill_padding(x, aval, _zero(x.dtype)), pivoting=pivoting,
                  **params)


def _eigenvalue_bound(x: Any, lower: bool) -> Any:
  """A value above every eigenvalue of the Hermitian matrices `x` defines.

  `x` has zeros in its padding; only the triangle the primitive reads counts.
  Row i of the Hermitian matrix holds row i and column i of that triangle, so
  the largest sum of both bounds its spectral radius (Gershgorin).
  """
  mag = jnp.abs(jnp.tril(x) if lower else jnp.triu(x))
  radius = jnp.max(jnp.sum(mag, axis=-1) + jnp.sum(mag, axis=-2), axis=-1)
  # Strictly above, even after rounding and for the zero matrix.
  return radius * np.asarray(1.0625, radius.dtype) + np.finfo(radius.dtype).tiny


@register("eigh")
def _eigh(ctx: RuleContext, x: Any, *, lower: Any, sort_eigenvalues: Any,
          **params: Any) -> list[Any]:
  aval, = ctx.in_avals
  if ctx.valid_mask(aval) is not None:
    if not sort_eigenvalues:
      raise ctx.error(
          "without sorting, the valid eigenvalues are not guaranteed to come "
          "before those of the padding.",
          "use sorted eigenvalues (lax.linalg.eigh(..., sort_eigenvalues=True), "
          "the default).")
    x = ctx.fill_padding(x, aval, _zero(x.dtype))
    bound = _eigenvalue_bound(x, lower)
    x = _pad_diagonal(ctx, x, aval, bound.astype(x.dtype))
  return ctx.bind(x, lower=lower, sort_eigenvalues=sort_eigenvalues, **params)


@register("custom_linear_solve")
def _custom_linear_solve(ctx: RuleContext, *args: Any, const_lengths: Any, jaxprs: Any,
                         **_: Any) -> list[Any]:
  # Its implementation is the solve jaxpr applied to the right-hand side; the
  # other jaxprs only serve differentiation, done before masking.
  start = const_lengths.matvec + const_lengths.vecmat
  solve_consts = args[start:start + const_lengths.solve]
  b = args[sum(const_lengths):]
  return ctx.eval_jaxpr(jaxprs.solve, *solve_consts, *b)
