"""Derivative rules that work at symbolic sizes, where JAX's do not.

Gradients of masked functions come from tracing `jax.vjp(fun)` with symbolic
shapes (see `trace.py`). A few of JAX's JVP rules need constant sizes:
`cumprod`, `cummax`, `cummin` and `cumlogsumexp` differentiate a parallel
`associative_scan`, which needs a static axis length, and `reduce_prod`
reshapes its operand with static sizes. For exactly those cases (the scanned or
reduced axis is symbolic, where JAX's rule raises) these rules take over:

* cumulative ops: the tangent of a sequential `lax.scan` over the axis with
  the same combine function (a scan of symbolic length differentiates and
  transposes fine); the primal output still comes from the primitive itself.
  At exact ties (cummax/cummin), JAX's rule splits the tangent along the tree
  of its parallel scan and this one along the sequential fold: both are valid
  subgradients, and they agree everywhere else.
* `reduce_prod` (any symbolic axis, reduced or not: JAX's rule reshapes the
  operand with static sizes): d prod(x) = sum_i t_i * prod_{j<i} x_j *
  prod_{j>i} x_j, one reduced axis at a time, with exclusive cumulative
  products: exact with zeros, no division.
* `triangular_solve`: JAX's rule compares the two sizes of the right-hand
  side to pick the cheaper product order; with a symbolic size the comparison
  is undecidable. Here: dX = solve(A, dB - op(dA) X) (or X op(dA) on the
  right side), one order for every size.
* `jnp.linalg.det` (a custom_jvp, not a primitive): JAX's rule shortcuts size
  1 in Python, a branch a symbolic size never takes, and its general path is
  wrong at size 1. Here both matrices get a unit corner, [[A, 0], [0, 1]],
  whose determinant and adjugate trace are those of A at every size >= 1.

* transposes of `conv_general_dilated` (symbolic spatial sizes) and of
  `fft` (RFFT/IRFFT along a symbolic axis): written beside their masking rules
  (`rules/windows.py`, `rules/fft.py`), installed here with the rest.

Every derivative rule polyjit puts in JAX's tables is installed by `install`
below: one list. Everywhere else JAX's own rules run unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import _jax as jc
from .rules._util import identity_value
from .rules.fft import fft_transpose_rule
from .rules.windows import conv_transpose_rule

_COMBINE: dict[str, Callable[[Any, Any], Any]] = {
    "cumsum": lax.add, "cumprod": lax.mul, "cummax": lax.max, "cummin": lax.min,
    "cumlogsumexp": jnp.logaddexp,
}
_IDENTITY = {"cumprod": "mul", "cummax": "max", "cummin": "min",
             "cumlogsumexp": "logaddexp"}


def _sequential_cumulative(name: str, x: Any, *, axis: int, reverse: bool) -> Any:
  combine = _COMBINE[name]
  xs = jnp.moveaxis(x, axis, 0)
  init = jnp.full(xs.shape[1:], identity_value(_IDENTITY[name], x.dtype), x.dtype)

  def step(carry: Any, xi: Any) -> tuple[Any, Any]:
    new = combine(carry, xi)
    return new, new

  _, ys = lax.scan(step, init, xs, reverse=reverse)
  return jnp.moveaxis(ys, 0, axis)


def _cumulative_jvp(name: str, original: Callable[..., Any], primals: Any,
                    tangents: Any, *, axis: int, reverse: bool) -> Any:
  x, = primals
  if not jc.is_symbolic_dim(x.shape[axis]):
    return original(primals, tangents, axis=axis, reverse=reverse)
  prim = jc.primitive(name)
  # install() wraps only rules of primitives this JAX has, so prim is not None
  out = prim.bind(x, axis=axis, reverse=reverse)  # type: ignore[union-attr]
  _, t_out = jax.jvp(functools.partial(_sequential_cumulative, name, axis=axis,
                                       reverse=reverse), (x,), (_instantiate(tangents[0], x),))
  return out, t_out


def _instantiate(t: Any, like: Any) -> Any:
  return jc.instantiate_zeros(t, like)


def _exclusive_cumprod(x: Any, axis: int, reverse: bool) -> Any:
  """prod of the entries strictly before (or after, if reverse) each entry."""
  c = lax.cumprod(x, axis=axis, reverse=reverse)
  ones = jnp.ones_like(lax.slice_in_dim(x, 0, 1, axis=axis))
  n = x.shape[axis]
  if reverse:
    return jnp.concatenate([lax.slice_in_dim(c, 1, n, axis=axis), ones], axis=axis)
  return jnp.concatenate([ones, lax.slice_in_dim(c, 0, n - 1, axis=axis)], axis=axis)


def _reduce_prod_jvp(original: Callable[..., Any], primals: Any, tangents: Any, *,
                     axes: tuple[int, ...], **params: Any) -> Any:
  x, = primals
  if not any(jc.is_symbolic_dim(d) for d in x.shape):  # JAX's rule reshapes x statically
    return original(primals, tangents, axes=axes, **params)
  t = _instantiate(tangents[0], x)
  for a in sorted(axes, reverse=True):  # reduce the last axes first: indices stay valid
    others = _exclusive_cumprod(x, a, False) * _exclusive_cumprod(x, a, True)
    t = jnp.sum(t * others, axis=a)
    # reduce_prod exists in every JAX (its rule is the one being wrapped)
    x = jc.primitive("reduce_prod").bind(x, axes=(a,), **params)  # type: ignore[union-attr]
  return x, t


def _triangular_solve_jvp(original: Callable[..., Any], primals: Any, tangents: Any, *,
                          left_side: bool, lower: bool, transpose_a: bool,
                          conjugate_a: bool, unit_diagonal: bool) -> Any:
  a, b = primals
  if not any(jc.is_symbolic_dim(d) for d in b.shape[-2:]):
    return original(primals, tangents, left_side=left_side, lower=lower,
                    transpose_a=transpose_a, conjugate_a=conjugate_a,
                    unit_diagonal=unit_diagonal)
  solve = functools.partial(lax.linalg.triangular_solve, left_side=left_side,
                            lower=lower, transpose_a=transpose_a,
                            conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)
  x = solve(a, b)
  a_dot, b_dot = tangents
  rhs = _instantiate(b_dot, b)
  if not jc.is_zero_tangent(a_dot):  # only the triangle the solve reads moves
    k = 1 if unit_diagonal else 0
    da = jnp.tril(a_dot, -k) if lower else jnp.triu(a_dot, k)
    da = jnp.swapaxes(da, -1, -2) if transpose_a else da
    da = jnp.conj(da) if conjugate_a else da
    rhs = rhs - (da @ x if left_side else x @ da)
  return x, solve(a, rhs)


def _bordered(x: Any, corner: Any) -> Any:
  """[[x, 0], [0, corner]] over the last two axes."""
  pads = [(0, 0)] * (x.ndim - 2) + [(0, 1), (0, 1)]
  return jnp.pad(x, pads).at[..., -1, -1].set(corner)


def _det_jvp(original: Callable[..., Any], primals: Any, tangents: Any) -> Any:
  x, = primals
  if not any(jc.is_symbolic_dim(d) for d in x.shape[-2:]):
    return original(primals, tangents)
  t, = tangents
  return original((_bordered(x, 1),), (_bordered(t, 0),))


def install() -> None:
  """Wraps JAX's JVP and transpose rules for the primitives above (given to
  `_jax.install_patches` at import; idempotent)."""
  for name in _IDENTITY:
    jc.wrap_jvp_rule(name, functools.partial(_cumulative_jvp, name))
  jc.wrap_jvp_rule("reduce_prod", _reduce_prod_jvp)
  jc.wrap_jvp_rule("triangular_solve", _triangular_solve_jvp)
  jc.wrap_custom_jvp_rule("jnp.linalg.det", _det_jvp)
  # Transposes: their code lives beside the masking rules of the same family
  # (they share its helpers); this list is the one place that installs them.
  jc.wrap_transpose_rules("conv_general_dilated", conv_transpose_rule)
  jc.wrap_transpose_rules("fft", fft_transpose_rule)
