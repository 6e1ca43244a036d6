"""Reductions and cumulative ops: fill the padding with the identity first.

A reduction over a dynamic axis would fold the padding into the result, so the
padding of the reduced axes is replaced by the operation's identity (0 for sum,
-inf for max, ...) before reducing. Padding along axes that are not reduced
stays in the padding of the result. `argmax`/`argmin` fill with the value that
can never win, and ties go to the lowest index, which is always a valid one.

Cumulative ops run forward need nothing: position i only sees positions <= i.
Run in reverse, position i sees the padding, so they fill it with the identity.
"""

from __future__ import annotations

from typing import Any

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
    x = ctx.fill_padding_if(x, aval, identity_value(kind, aval.dtype), axes)
    return ctx.bind(x, axes=axes, **params)
  return rule


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
