"""Reductions and cumulative ops: fill the padding with the identity first.

A reduction over a dynamic axis would fold the padding into the result, so the
padding of the reduced axes is replaced by the operation's identity (0 for sum,
-inf for max, ...) before reducing. Padding along axes that are not reduced
stays in the padding of the result. `argmax`/`argmin` fill with the value that
can never win, and ties go to the lowest index, which is always a valid one.

A maximum or minimum of floats differentiates with the count of positions
that reach it (JAX divides the tangent among ties); a padding filled with
-inf ties with a valid maximum of -inf, so that count is taken over the valid
positions only (`_extremum`, a custom JVP). Valid means valid along every
dynamic axis, the kept ones too: a padded slice of a kept axis has no valid
position, so its tangent is 0 (not 0/0, which a reverse pass would carry
into the gradient of whatever was broadcast into that slice).

Cumulative ops run forward need nothing: position i only sees positions <= i.
Run in reverse, position i sees the padding, so they fill it with the identity.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core import Rule, RuleContext, register
from ._util import identity_value

_REDUCERS = {
    "reduce_sum": "add", "reduce_prod": "mul", "reduce_max": "max",
    "reduce_min": "min", "reduce_and": "and", "reduce_or": "or",
    "reduce_xor": "xor", "argmax": "max", "argmin": "min",
}

_CUMULATIVE = {
    "cumsum": "add", "cumprod": "mul", "cummax": "max", "cummin": "min",
    "cumlogsumexp": "logaddexp",
}


def _reducer(kind: str) -> Rule:
  def rule(ctx: RuleContext, x: Any, *, axes: Any, **params: Any) -> list[Any]:
    aval, = ctx.in_avals
    if kind in ("max", "min") and ctx.eqn.primitive.name.startswith("reduce_") \
        and jnp.issubdtype(aval.dtype, jnp.inexact):
      if ctx.valid_mask(aval, axes) is not None:
        # (valid along every dynamic axis, the kept ones too: a padded slice
        # of a kept axis then has no valid position, and its tangent is 0,
        # where counting ties along the reduced axes only gave 0/0 there)
        valid = ctx.valid_mask(aval)
        return [_extremum(kind, tuple(axes), identity_value(kind, aval.dtype), x,
                          lax.broadcast_in_dim(valid, x.shape, tuple(range(x.ndim))))]
    x = ctx.fill_padding_if(x, aval, identity_value(kind, aval.dtype), axes)
    return ctx.bind(x, axes=axes, **params)
  return rule


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _extremum(kind: str, axes: tuple[int, ...], identity: Any, x: Any, valid: Any) -> Any:
  """max/min of `x` over `axes` where `valid`; ties counted among valid positions."""
  filled = lax.select(valid, x, lax.full_like(x, identity))
  return (lax.reduce_max if kind == "max" else lax.reduce_min)(filled, axes)


@_extremum.defjvp
def _extremum_jvp(kind: str, axes: tuple[int, ...], identity: Any,
                  primals: Any, tangents: Any) -> Any:
  x, valid = primals
  t, _ = tangents
  ans = _extremum(kind, axes, identity, x, valid)
  kept = tuple(d for d in range(x.ndim) if d not in axes)
  at = valid & _reaches(kind, axes, x, valid, kept)
  # No valid position: 0, not 0/0. A NaN among the valid positions equals no
  # one (count 0): 0/0 = NaN, as JAX's own derivative of a maximum gives.
  count = jnp.where(jnp.any(valid, axis=axes), jnp.sum(at, axis=axes, dtype=x.dtype), 1)
  # (t times the indicator, as JAX's rule: its transpose carries a NaN cotangent
  # to every valid position; the padding's tangent never enters)
  return ans, jnp.sum(jnp.where(valid, t * at.astype(t.dtype), 0), axis=axes) / count


def _reaches(kind: str, axes: tuple[int, ...], x: Any, valid: Any, kept: tuple[int, ...]
             ) -> Any:
  """Whether each position reaches the extremum of its slice, told apart
  without comparing `x` with the extremum for equality.

  `x == max` compares a value that XLA may compute again in another loop,
  rounded differently (a multiply-add contracted in one loop and not in the
  other), with the maximum the reduction computed: then no position, or not
  the one the count saw, equalled it (0/0, or a term of the gradient
  dropped). One reduction, which reads each value once, finds the maximum,
  the first position that reaches it, how many do and the largest value
  below it (the runner-up); a position reaches the maximum if it is that
  first one, or, where there are ties, if it lies above the midpoint between
  the maximum and the runner-up, which a rounding error cannot cross unless
  the two are adjacent floating-point numbers. A min is the max of -x."""
  y = x if kind == "max" else -x   # (exact)
  shape = y.shape
  pos: Any = None
  stride = 1
  for a in sorted(axes, reverse=True):
    here = lax.broadcasted_iota(np.int32, shape, a) * np.int32(stride)
    pos = here if pos is None else pos + here
    stride *= shape[a]
  past = np.int32(stride)   # (after every position)
  low = np.asarray(-np.inf, y.dtype)
  filled = lax.stop_gradient(lax.select(valid, y, lax.full_like(y, low)))

  def combine(a: Any, b: Any) -> tuple[Any, Any, Any, Any]:
    (m1, r1, p1, c1), (m2, r2, p2, c2) = a, b
    m = lax.max(m1, m2)
    e1, e2 = m1 == m, m2 == m
    zero, never, lowest = jnp.zeros_like(c1), jnp.full_like(p1, past), jnp.full_like(m1, low)
    runner = lax.max(lax.max(r1, r2), lax.max(lax.select(e1, lowest, m1),
                                               lax.select(e2, lowest, m2)))
    return (m, runner, lax.min(lax.select(e1, p1, never), lax.select(e2, p2, never)),
            lax.select(e1, c1, zero) + lax.select(e2, c2, zero))

  top, runner, first, count = lax.reduce(
      (filled, lax.full_like(filled, low), lax.select(valid, pos, jnp.full_like(pos, past)),
       valid.astype(np.int32)),
      (low, low, past, np.int32(0)), combine, axes)
  # Ties: above the midpoint; with nothing but -inf below the maximum, above
  # -inf; with a maximum of -inf, every valid position (all tie at -inf).
  mid = lax.select(runner == low, lax.select(top == low, top, runner),
                   top * np.asarray(0.5, y.dtype) + runner * np.asarray(0.5, y.dtype))
  mid = lax.broadcast_in_dim(mid, shape, kept)
  above = lax.select(lax.broadcast_in_dim((runner == low) & (top != low), shape, kept),
                     y > mid, y >= mid)
  tied = lax.broadcast_in_dim(count > 1, shape, kept)
  return (pos == lax.broadcast_in_dim(first, shape, kept)) | (tied & above)


for _name, _kind in _REDUCERS.items():
  register(_name)(_reducer(_kind))


def _cumulative(kind: str) -> Rule:
  def rule(ctx: RuleContext, x: Any, *, axis: Any, reverse: Any, **params: Any) -> list[Any]:
    if reverse:
      aval, = ctx.in_avals
      x = ctx.fill_padding(x, aval, identity_value(kind, aval.dtype), axes=(axis,))
    return ctx.bind(x, axis=axis, reverse=reverse, **params)
  return rule


for _name, _kind in _CUMULATIVE.items():
  register(_name)(_cumulative(_kind))


@register("reduce")
def _reduce(ctx: RuleContext, *args: Any, dimensions: Any, **params: Any) -> list[Any]:
  """`lax.reduce` with a custom computation: its init values are identities."""
  n = len(args) // 2
  operands, inits = args[:n], args[n:]
  filled = []
  for x, init, aval in zip(operands, inits, ctx.in_avals[:n], strict=True):
    mask = ctx.valid_mask(aval, dimensions)
    filled.append(x if mask is None else
                  lax.select(mask, x, lax.broadcast(init, x.shape)))
  return ctx.bind(*filled, *inits, dimensions=dimensions, **params)
