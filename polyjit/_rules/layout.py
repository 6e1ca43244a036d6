"""Ops whose output positions depend on a size: re-anchor the data at 0.

On padded arrays, "the end" of a dynamic axis is the padded end, not the
logical one. `rev` would put the data at the back, `concatenate` would put the
second operand after the first one's padding, `slice` from a size-dependent
start would start in the wrong place. These rules move data by the traced
logical amount (see `_util.place`) so that the valid region is leading again.
`pad` fills the operand's padding with the pad value first, so that the
high padding it adds starts right after the logical end.
"""

from __future__ import annotations

from jax import lax

from .. import _jax_compat as jc
from .._core import register
from ._util import pad_high, place


@register("rev")
def _rev(ctx, x, *, dimensions):
  aval, = ctx.in_avals
  x = lax.rev(x, dimensions)
  for axis in dimensions:
    d = aval.shape[axis]
    if jc.is_symbolic_dim(d):
      # Reversed data sits at [P - n, P): move it to [0, n).
      size = ctx.padded(d)
      x = place(x, axis, ctx.logical(d) - size, size)
  return [x]


@register("concatenate")
def _concatenate(ctx, *operands, dimension):
  avals = ctx.in_avals
  sizes = [a.shape[dimension] for a in avals]
  if not any(jc.is_symbolic_dim(d) for d in sizes[:-1]):
    return ctx.bind(*operands, dimension=dimension)  # offsets are all static
  out_aval, = ctx.out_avals
  out_size = ctx.padded(out_aval.shape[dimension])
  out_shape = ctx.padded_shape(out_aval.shape)
  iota = lax.broadcasted_iota(jc.dim_value_dtype(), out_shape, dimension)
  offset = 0
  out = None
  for x, d in zip(operands, sizes):
    placed = place(x, dimension, offset, out_size)
    out = placed if out is None else lax.select(iota >= offset, placed, out)
    offset = offset + (ctx.logical(d) if jc.is_symbolic_dim(d) else int(d))
  return [out]


@register("pad")
def _pad(ctx, x, padding_value, *, padding_config):
  aval = ctx.in_avals[0]
  for axis, (lo, _hi, interior) in enumerate(padding_config):
    if jc.is_symbolic_dim(lo) or jc.is_symbolic_dim(interior):
      raise ctx.error(
          f"the low or interior padding of axis {axis} ({lo}, {interior}) "
          "depends on a dimension, so the data would start at a size-dependent "
          "place.",
          "pad with sizes that do not depend on the dynamic dimensions, or pad "
          "at the high end.")
  mask = ctx.valid_mask(aval)
  if mask is not None:
    x = lax.select(mask, x, lax.broadcast(padding_value, x.shape))
  return ctx.bind(x, padding_value, padding_config=padding_config)


@register("slice")
def _slice(ctx, x, *, start_indices, limit_indices, strides):
  aval, = ctx.in_avals
  out_aval, = ctx.out_avals
  strides = strides or (1,) * len(start_indices)
  starts, limits = [], []
  for axis, (start, stride) in enumerate(zip(start_indices, strides)):
    size = x.shape[axis]
    if jc.is_symbolic_dim(start):
      x = place(x, axis, -ctx.logical(start), size)
      start = 0
    out_size = ctx.padded(out_aval.shape[axis])
    limit = int(start) + (out_size - 1) * stride + 1 if out_size else int(start)
    if limit > x.shape[axis]:
      x = pad_high(x, axis, limit - x.shape[axis])
    starts.append(int(start))
    limits.append(limit)
  return [lax.slice(x, starts, limits, strides)]


@register("split")
def _split(ctx, x, *, sizes, axis):
  aval, = ctx.in_avals
  if not jc.is_symbolic_dim(aval.shape[axis]) and not any(map(jc.is_symbolic_dim, sizes)):
    return ctx.bind(x, sizes=sizes, axis=axis)
  outs, offset = [], 0
  for d in sizes:  # piece j starts at the logical sum of the sizes before it
    outs.append(place(x, axis, -offset, ctx.padded(d)))
    offset = offset + (ctx.logical(d) if jc.is_symbolic_dim(d) else int(d))
  return outs
