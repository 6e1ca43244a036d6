"""Ops whose output positions depend on a size: re-anchor the data at 0.

On padded arrays, "the end" of a dynamic axis is the padded end, not the
logical one. `rev` would put the data at the back, `concatenate` would put the
second operand after the first one's padding, `slice` from a size-dependent
start would start in the wrong place, `tile` would repeat the padding. These
rules move data by the traced logical amount (see `_util.place`), or gather
each output entry from the input position the unpadded op reads, so that the
valid region is leading again.

`pad` fills the operand's padding with the pad value first, so that the
high padding it adds starts right after the logical end; a low padding or an
interior padding that depends on a size is a gather from the logical source
position, with the pad value wherever no source entry lands.

Sizes that can shrink as a dimension grows
------------------------------------------
`jnp.roll(x, 2)` on a dynamic axis slices `x[mod(-2, n):]`, of length
`n - mod(-2, n)`, and concatenates it with `x[:mod(-2, n)]`. `ctx.padded`
gives such a size an upper bound over all logical sizes (see
`MaskEnv.padded`), so the buffers of these pieces can be longer than the
operand they come from; the rules here work from the buffers' own lengths.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from ... import _jax as jc
from ..core import RuleContext, register
from ._util import pad_high, place


def _take(x: Any, axis: int, index: Any) -> Any:
  """`x[..., index, ...]` along `axis` for a 1-D `index` (clamped into range)."""
  return jnp.take(x, index, axis=axis, mode="clip")


def _fill_tail(ctx: RuleContext, x: Any, aval: Any, value: Any) -> Any:
  """`x` with `value` past the logical end of each dynamic axis of `aval`.

  Uses `x`'s own shape, which may be a bound rather than the padded size.
  """
  for axis, d in enumerate(aval.shape):
    if jc.is_symbolic_dim(d):
      keep = lax.broadcasted_iota(jc.dim_value_dtype(), x.shape, axis) < ctx.logical(d)
      x = lax.select(keep, x, lax.broadcast(value, x.shape))
  return x


@register("rev")
def _rev(ctx: RuleContext, x: Any, *, dimensions: Any) -> list[Any]:
  aval, = ctx.in_avals
  x = lax.rev(x, dimensions)
  for axis in dimensions:
    d = aval.shape[axis]
    if jc.is_symbolic_dim(d):
      # Reversed data sits at [P - n, P): move it to [0, n).
      size = x.shape[axis]
      x = place(x, axis, ctx.logical(d) - size, size)
  return [x]


@register("concatenate")
def _concatenate(ctx: RuleContext, *operands: Any, dimension: Any) -> list[Any]:
  sizes = [a.shape[dimension] for a in ctx.in_avals]
  if not any(jc.is_symbolic_dim(d) for d in sizes[:-1]):
    return ctx.bind(*operands, dimension=dimension)  # offsets are all static
  out_aval, = ctx.out_avals
  out_size = ctx.padded(out_aval.shape[dimension])
  out_shape = list(operands[0].shape)
  out_shape[dimension] = out_size
  iota = lax.broadcasted_iota(jc.dim_value_dtype(), out_shape, dimension)
  offset = 0
  out = None
  for x, d in zip(operands, sizes, strict=True):
    placed = place(x, dimension, offset, out_size)
    out = placed if out is None else lax.select(iota >= offset, placed, out)
    offset = offset + (ctx.logical(d) if jc.is_symbolic_dim(d) else int(d))
  return [out]


# --- pad ---------------------------------------------------------------------

def _dilated(size: int, interior: int) -> int:
  return size + (size - 1) * interior if size else 0


@register("pad")
def _pad(ctx: RuleContext, x: Any, padding_value: Any, *, padding_config: Any) -> list[Any]:
  aval = ctx.in_avals[0]
  out_aval, = ctx.out_avals
  x = _fill_tail(ctx, x, aval, padding_value)
  config, general = [], []
  for axis, (lo, _hi, interior) in enumerate(padding_config):
    out_size = ctx.padded(out_aval.shape[axis])
    if jc.is_symbolic_dim(lo) or jc.is_symbolic_dim(interior):
      config.append((0, 0, 0))
      general.append((axis, lo, interior, out_size))
    else:
      # The data keeps its static place; the high side absorbs the padding of
      # the operand (now pad values), whatever the sign or size of `hi`.
      lo, interior = int(lo), int(interior)
      config.append((lo, out_size - lo - _dilated(x.shape[axis], interior), interior))
  x = lax.pad(x, padding_value, config)
  for axis, lo, interior, out_size in general:
    x = _pad_by_gather(ctx, x, padding_value, axis, lo, interior, out_size)
  return [x]


def _pad_by_gather(ctx: RuleContext, x: Any, padding_value: Any, axis: Any, lo: Any, interior: Any,
                   out_size: Any) -> Any:
  """One axis of a pad with a size-dependent low or interior padding.

  Output entry j reads x[k / s] with k = j - lo and s = interior + 1 when k is
  a non-negative multiple of s inside `x` (whose padding holds pad values
  already), and is the pad value otherwise.
  """
  if x.shape[axis] == 0:  # nothing lands: every entry is the pad value
    shape = list(x.shape)
    shape[axis] = out_size
    return lax.broadcast(padding_value, shape)
  k = lax.iota(jc.dim_value_dtype(), out_size) - ctx.logical(lo)
  stride = ctx.logical(interior) + 1
  source = lax.div(k, stride)
  lands = (k >= 0) & (lax.rem(k, stride) == 0) & (source < x.shape[axis])
  out = _take(x, axis, source)
  lands = lax.broadcast_in_dim(lands, out.shape, (axis,))
  return lax.select(lands, out, lax.broadcast(padding_value, out.shape))


# --- slicing -----------------------------------------------------------------

@register("slice")
def _slice(ctx: RuleContext, x: Any, *, start_indices: Any, limit_indices: Any,
           strides: Any) -> list[Any]:
  out_aval, = ctx.out_avals
  strides = strides or (1,) * len(start_indices)
  starts, limits, steps = [], [], []
  for axis, (start, stride) in enumerate(zip(start_indices, strides, strict=True)):
    size = x.shape[axis]
    if jc.is_symbolic_dim(start):
      x = place(x, axis, -ctx.logical(start), size)
      start = 0
    out_size = ctx.padded(out_aval.shape[axis])
    if jc.is_symbolic_dim(stride):  # a gather of every stride-th entry
      index = lax.iota(jc.dim_value_dtype(), out_size) * ctx.logical(stride)
      x = _take(x, axis, index + int(start))
      start, stride = 0, 1
    limit = int(start) + (out_size - 1) * stride + 1 if out_size else int(start)
    if limit > x.shape[axis]:
      x = pad_high(x, axis, limit - x.shape[axis])
    starts.append(int(start))
    limits.append(limit)
    steps.append(stride)
  return [lax.slice(x, starts, limits, steps)]


@register("split")
def _split(ctx: RuleContext, x: Any, *, sizes: Any, axis: Any) -> list[Any]:
  aval, = ctx.in_avals
  if not jc.is_symbolic_dim(aval.shape[axis]) and not any(map(jc.is_symbolic_dim, sizes)):
    return ctx.bind(x, sizes=sizes, axis=axis)
  outs, offset = [], 0
  for d in sizes:  # piece j starts at the logical sum of the sizes before it
    outs.append(place(x, axis, -offset, ctx.padded(d)))
    offset = offset + (ctx.logical(d) if jc.is_symbolic_dim(d) else int(d))
  return outs


@register("tile")
def _tile(ctx: RuleContext, x: Any, *, reps: Any) -> list[Any]:
  """Static axes tile as they are (a longer tiling only adds padding); along
  a dynamic axis, entry j is entry j mod n."""
  aval, = ctx.in_avals
  out_aval, = ctx.out_avals
  dynamic = [a for a, d in enumerate(aval.shape) if jc.is_symbolic_dim(d)]
  x = ctx.bind(x, reps=tuple(1 if a in dynamic else r for a, r in enumerate(reps)))[0]
  for axis in dynamic:
    if reps[axis] != 1:
      out_size = ctx.padded(out_aval.shape[axis])
      index = lax.rem(lax.iota(jc.dim_value_dtype(), out_size),
                      ctx.logical(aval.shape[axis]))
      x = _take(x, axis, index)
  return [x]
