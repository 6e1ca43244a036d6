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
  at = valid & (x == lax.broadcast_in_dim(ans, x.shape, kept))
  # No valid position: 0, not 0/0. A NaN among the valid positions equals no
  # one (count 0): 0/0 = NaN, as JAX's own derivative of a maximum gives.
  count = jnp.where(jnp.any(valid, axis=axes), jnp.sum(at, axis=axes, dtype=x.dtype), 1)
  # (t times the indicator, as JAX's rule: its transpose carries a NaN cotangent
  # to every valid position; the padding's tangent never enters)
  return ans, jnp.sum(jnp.where(valid, t * at.astype(t.dtype), 0), axis=axes) / count


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
