"""Windowed ops along dynamic axes: convolutions and window reductions.

Why they need rules
-------------------
A window near the logical end of a dynamic axis must see what the unpadded op
sees there: the op's own padding (zeros for a convolution, the init value for
a window reduction), not the garbage after the data. And when the low padding
is a size expression (SAME padding with strides, the transposed convolutions
of gradients), the padded program would put the data at the wrong offset.

How
---
The operand's padding is first filled with the op's padding value. Then, per
spatial axis (operand size L, window size K, low padding lo):

* native: K and lo are fixed. Binding with padded sizes is exact: a valid
  output has the same window as in the unpadded op, and wherever that window
  passes the logical end it reads the padding value, as the unpadded op does
  in its high padding. Valid outputs never read further, so a symbolic high
  padding is replaced by any that gives the padded number of outputs.
* re-anchored: lo is a size expression. The axis is rebuilt as the op sees it
  after low padding and dilation (`_anchor`): data dilated explicitly, placed
  at the traced logical lo (`_util.place`), the padding value elsewhere; the
  op then runs with no low padding and no base dilation.
* unfolded (convolution only): K is dynamic, as in the weight gradient, whose
  kernel is the output cotangent. Zero taps would multiply valid inputs, and
  0 * inf = NaN where the unpadded convolution has no term at all. So the
  windows are gathered (`_unfold`), their taps past the logical K are set to
  zero with `select`, and the output positions are folded into the batch: the
  convolution then has one output position per such axis and no padded tap
  ever meets an input value. The price is memory: one copy of the input per
  output position along the axis (for a weight gradient, the kernel size).

Window reductions whose window size is dynamic are refused with a
MaskingError: they are rare, and unfolding them would append init values to
short windows, which is exact only when the init value is an identity of the
reduction (true of sum/max/min, unknowable for `lax.reduce_window`).

`select_and_scatter_add` (the transpose of max pooling) and
`select_and_gather_add` (its JVP) fill the operand's padding with the value
that never wins (-inf for max); XLA pads them with that same value, so a
window sees the same elements, in the same order, as the unpadded op sees.

Derivatives at symbolic sizes
-----------------------------
JAX's transposes of `conv_general_dilated` compute their padding from the
shapes and pass it through `lax.conv_general_dilated`, which rejects symbolic
padding (`operator.index`), so the gradient of a strided or dilated
convolution along a dynamic axis fails to trace. At symbolic sizes (only
there) this module supplies both transposes, binding the primitive directly:
the input's is the cotangent convolved with the reversed kernel (strides and
input dilation swapped), the kernel's is the input correlated with the
cotangent (batch and feature axes swapped). The windowed reductions' own
transposes trace fine (`reduce_window_sum`'s emits a `pad` with interior and
size-dependent padding, masked by `pad`'s rule).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _jax as jc
from ..core import Rule, RuleContext, register
from ._util import identity_value, place

_is_dyn = jc.is_symbolic_dim


def _zero(dtype: Any) -> Any:
  return np.zeros((), dtype)[()]


def _dilated(size: Any, dilation: Any) -> Any:
  """The size of an axis of `size` >= 1 entries dilated by `dilation`."""
  return (size - 1) * dilation + 1


def _anchor(ctx: RuleContext, x: Any, axis: Any, size: Any, dilation: Any, lo: Any, length: Any,
            fill: Any) -> Any:
  """`x` along `axis` as an op sees it after its base dilation and low padding.

  The `size` (symbolic) entries of data are dilated by `dilation` and start at
  the logical `lo`; `length` entries in all, `fill` everywhere else.
  """
  fill = lax.convert_element_type(fill, x.dtype)
  if dilation > 1:
    config = [(0, 0, 0)] * x.ndim
    config[axis] = (0, 0, dilation - 1)
    x = lax.pad(x, fill, config)
  if _is_dyn(lo):
    lo = ctx.logical(lo)
    offset = lax.clamp(np.asarray(-x.shape[axis], lo.dtype), lo,
                       np.asarray(length, lo.dtype))
  else:  # `place` takes offsets in [-x.shape[axis], length]; the mask does the rest
    lo = int(lo)
    offset = min(max(lo, -x.shape[axis]), length)
  y = place(x, axis, offset, length)
  iota = lax.broadcasted_iota(jc.dim_value_dtype(), y.shape, axis)
  end = lo + _dilated(ctx.logical(size), dilation)
  return lax.select((iota >= lo) & (iota < end), y, lax.full_like(y, fill))


# --- window reductions ---------------------------------------------------------

def _refuse_dynamic_windows(ctx: RuleContext, window_dimensions: Any, what: Any) -> None:
  for axis, w in enumerate(window_dimensions):
    if _is_dyn(w):
      raise ctx.error(
          f"its window size along axis {axis} ({w}) depends on a dimension.",
          f"use a {what} window of fixed size, or declare the dimension fixed "
          "(\"_\" in the spec).")


def _high(hi: Any, out: int, stride: int, window: int, size: int, lo: int) -> int:
  """The high padding to bind with, for `out` windows (padded, dilated sizes).

  A fixed `hi` is kept. A symbolic one is never evaluated (it need not grow
  with the sizes): only the windows of valid outputs matter, and they lie
  within the first `out`, so any high padding giving `out` windows will do;
  the smallest non-negative one if there is one (XLA's CPU lowering of
  `select_and_scatter_add` cannot crop).
  """
  if not _is_dyn(hi):
    return int(hi)
  least = (out - 1) * stride + window - size - lo
  return max(least, min(0, least + stride - 1))


def _reanchor_windows(ctx: RuleContext, operands_fills: Any, in_shape: Any, out_shape: Any,
                      params: Any) -> Any:
  """The operands, and the window params to bind them with.

  `operands_fills` pairs each operand with its padding value; `params` are
  the op's window params. Axes with a symbolic low padding are re-anchored,
  on every operand; the others get the high padding that fits the padded
  output exactly.
  """
  operands = [x for x, _ in operands_fills]
  ones = (1,) * len(in_shape)
  strides = params["window_strides"]
  base_dilation = list(params.get("base_dilation", ones))
  window_dilation = params.get("window_dilation", ones)
  padding = list(params["padding"])
  for axis, (lo, hi) in enumerate(padding):
    out = ctx.padded(out_shape[axis])
    window = _dilated(params["window_dimensions"][axis], window_dilation[axis])
    if _is_dyn(lo):
      length = (out - 1) * strides[axis] + window
      operands = [_anchor(ctx, x, axis, in_shape[axis], base_dilation[axis], lo, length, fill)
                  for x, (_, fill) in zip(operands, operands_fills, strict=True)]
      padding[axis], base_dilation[axis] = (0, 0), 1
    else:
      size = _dilated(operands[0].shape[axis], base_dilation[axis])
      padding[axis] = (lo, _high(hi, out, strides[axis], window, size, lo))
  params = dict(params, padding=tuple(padding))
  if "base_dilation" in params:
    params["base_dilation"] = tuple(base_dilation)
  return operands, params


def _monoid_window(kind: str) -> Rule:
  def rule(ctx: RuleContext, x: Any, **params: Any) -> list[Any]:
    aval, = ctx.in_avals
    out_aval, = ctx.out_avals
    _refuse_dynamic_windows(ctx, params["window_dimensions"], "pooling")
    fill = identity_value(kind, aval.dtype)
    x = ctx.fill_padding(x, aval, fill)
    (x,), params = _reanchor_windows(ctx, [(x, fill)], aval.shape, out_aval.shape, params)
    return ctx.bind(x, **params)
  return rule


for _name, _kind in (("reduce_window_sum", "add"), ("reduce_window_max", "max"),
                     ("reduce_window_min", "min")):
  register(_name)(_monoid_window(_kind))


@register("reduce_window")
def _reduce_window(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
  """The generic form: XLA pads with the init values, so padding gets them too."""
  n = len(args) // 2
  operands, inits = args[:n], args[n:]
  avals, out_avals = ctx.in_avals[:n], ctx.out_avals
  _refuse_dynamic_windows(ctx, params["window_dimensions"], "lax.reduce_window")
  filled = [(ctx.fill_padding(x, aval, init), init)
            for x, init, aval in zip(operands, inits, avals, strict=True)]
  operands, params = _reanchor_windows(ctx, filled, avals[0].shape, out_avals[0].shape,
                                       params)
  return ctx.bind(*operands, *inits, **params)


def _never_selected(select_prim: Any, dtype: Any) -> Any:
  """The value that loses every comparison of `select_prim` (ge: max, le: min)."""
  return identity_value("max" if select_prim is lax.ge_p else "min", dtype)


@register("select_and_gather_add")
def _select_and_gather_add(ctx: RuleContext, tangents: Any, operand: Any, *, select_prim: Any,
                           **params: Any) -> list[Any]:
  """Per window, the tangent at the selected operand entry (max pooling's JVP)."""
  t_aval, aval = ctx.in_avals
  out_aval, = ctx.out_avals
  _refuse_dynamic_windows(ctx, params["window_dimensions"], "pooling")
  loser, zero = _never_selected(select_prim, aval.dtype), _zero(t_aval.dtype)
  operand = ctx.fill_padding(operand, aval, loser)
  tangents = ctx.fill_padding(tangents, t_aval, zero)
  (tangents, operand), params = _reanchor_windows(
      ctx, [(tangents, zero), (operand, loser)], aval.shape, out_aval.shape, params)
  return ctx.bind(tangents, operand, select_prim=select_prim, **params)


@register("select_and_scatter_add")
def _select_and_scatter_add(ctx: RuleContext, source: Any, operand: Any, *, select_prim: Any,
                            **params: Any) -> list[Any]:
  """Adds each window's source value at its selected entry (max pooling's VJP).

  A re-anchored axis runs on the rebuilt operand, whose result is moved back:
  entry i of the operand is entry lo + i of the rebuilt axis.
  """
  s_aval, aval = ctx.in_avals
  _refuse_dynamic_windows(ctx, params["window_dimensions"], "pooling")
  loser = _never_selected(select_prim, aval.dtype)
  operand = ctx.fill_padding(operand, aval, loser)
  source = ctx.fill_padding(source, s_aval, _zero(s_aval.dtype))
  (operand,), bind_params = _reanchor_windows(ctx, [(operand, loser)], aval.shape,
                                              s_aval.shape, params)
  out, = ctx.bind(source, operand, select_prim=select_prim, **bind_params)
  for axis, (lo, _) in enumerate(params["padding"]):
    if _is_dyn(lo):
      out = _unanchor(ctx, out, axis, ctx.padded(aval.shape[axis]), lo)
  return [out]


def _unanchor(ctx: RuleContext, y: Any, axis: Any, size: Any, lo: Any) -> Any:
  """Entries [lo, lo + size) of `y` along `axis`; 0 where that leaves `y`."""
  lo = ctx.logical(lo)
  length = y.shape[axis]
  offset = lax.clamp(np.asarray(-length, lo.dtype), -lo, np.asarray(size, lo.dtype))
  x = place(y, axis, offset, size)
  src = lax.broadcasted_iota(jc.dim_value_dtype(), x.shape, axis) + lo
  return lax.select((src >= 0) & (src < length), x, lax.full_like(x, 0))


# --- convolution -----------------------------------------------------------------

def _permute(shape: Any, spec: Any) -> Any:
  return tuple(shape[a] for a in spec)


def _canonical_dn(ndim: int) -> Any:
  spec = tuple(range(ndim))
  return lax.ConvDimensionNumbers(spec, spec, spec)


def _check_conv_groups(ctx: RuleContext, lhs_shape: Any, rhs_shape: Any, feature_group_count: Any,
                       batch_group_count: Any) -> None:
  """Grouped axes interleave groups with padding: refuse dynamic ones."""
  grouped = []
  if feature_group_count > 1:
    grouped += [("input feature", lhs_shape[1]), ("output feature", rhs_shape[0])]
  if batch_group_count > 1:
    grouped += [("batch", lhs_shape[0]), ("output feature", rhs_shape[0])]
  for what, d in grouped:
    if _is_dyn(d):
      raise ctx.error(
          f"its {what} dimension ({d}) is dynamic and split into groups "
          f"(feature_group_count={feature_group_count}, "
          f"batch_group_count={batch_group_count}), which would interleave "
          "the groups with padding.",
          "keep grouped feature and batch dimensions fixed (\"_\" in the spec); "
          "dynamic spatial dimensions are fine.")


@register("conv_general_dilated")
def _conv(ctx: RuleContext, lhs: Any, rhs: Any, *, dimension_numbers: Any,
          **params: Any) -> list[Any]:
  """Works in the canonical layout (N, C, spatial...), (O, I, spatial...)."""
  dn = dimension_numbers
  lhs_aval, rhs_aval = ctx.in_avals
  out_aval, = ctx.out_avals
  lhs_shape = _permute(lhs_aval.shape, dn.lhs_spec)
  rhs_shape = _permute(rhs_aval.shape, dn.rhs_spec)
  out_shape = ctx.padded_shape(_permute(out_aval.shape, dn.out_spec))
  _check_conv_groups(ctx, lhs_shape, rhs_shape, params["feature_group_count"],
                     params["batch_group_count"])
  if 0 in out_shape:
    return [jnp.zeros(ctx.padded_shape(out_aval.shape), out_aval.dtype)]
  ndim = lhs.ndim
  lhs = lax.transpose(lhs, dn.lhs_spec)
  rhs = lax.transpose(rhs, dn.rhs_spec)
  # Contracted axes (features, spatial) read zeros where the data ends.
  lhs = ctx.fill_padding(lhs, lhs_shape, _zero(lhs.dtype), axes=range(1, ndim))
  rhs = ctx.fill_padding(rhs, rhs_shape, _zero(rhs.dtype), axes=range(1, ndim))
  lhs, params, unfolded = _conv_spatial_axes(ctx, lhs, lhs_shape, rhs_shape, out_shape,
                                             params)
  out, = ctx.bind(lhs, rhs, dimension_numbers=_canonical_dn(ndim), **params)
  if unfolded:
    out = _refold(out, unfolded, [out_shape[2 + i] for i in unfolded])
  return [lax.transpose(out, tuple(np.argsort(dn.out_spec)))]


def _conv_spatial_axes(ctx: RuleContext, lhs: Any, lhs_shape: Any, rhs_shape: Any, out_shape: Any,
                       params: Any) -> Any:
  """Per spatial axis: native, re-anchored or unfolded (see the module doc).

  Returns the canonical lhs, the params to bind with, and the unfolded axes.
  """
  strides, pads = list(params["window_strides"]), list(params["padding"])
  lhs_dil, rhs_dil = list(params["lhs_dilation"]), list(params["rhs_dilation"])
  unfolded = []
  for i, (lo, hi) in enumerate(params["padding"]):
    axis, kernel = 2 + i, rhs_shape[2 + i]
    window = _dilated(ctx.padded(kernel), rhs_dil[i])
    if not (_is_dyn(kernel) or _is_dyn(lo)):
      size = _dilated(lhs.shape[axis], lhs_dil[i])
      pads[i] = (lo, _high(hi, out_shape[axis], strides[i], window, size, lo))
      continue
    length = (out_shape[axis] - 1) * strides[i] + window
    lhs = _anchor(ctx, lhs, axis, lhs_shape[axis], lhs_dil[i], lo, length, _zero(lhs.dtype))
    pads[i], lhs_dil[i] = (0, 0), 1
    if _is_dyn(kernel):
      lhs = _unfold(ctx, lhs, axis, out_shape[axis], strides[i], rhs_dil[i], kernel)
      strides[i], rhs_dil[i] = 1, 1
      unfolded.append(i)
  params = dict(params, window_strides=tuple(strides), padding=tuple(pads),
                lhs_dilation=tuple(lhs_dil), rhs_dilation=tuple(rhs_dil))
  return lhs, params, unfolded


def _unfold(ctx: RuleContext, x: Any, axis: Any, out_size: Any, stride: Any, dilation: Any,
            kernel: Any) -> Any:
  """The windows along `axis`, taps past the logical kernel size zeroed, with
  the `out_size` output positions folded into the batch (axis 0, minor)."""
  k = ctx.padded(kernel)
  index = np.arange(out_size)[:, None] * stride + np.arange(k)[None, :] * dilation
  windows = jnp.take(x, index, axis=axis, mode="clip")  # (..., out, k, ...)
  tap = lax.broadcasted_iota(jc.dim_value_dtype(), windows.shape, axis + 1)
  windows = lax.select(tap < ctx.logical(kernel), windows,
                       lax.full_like(windows, _zero(x.dtype)))
  windows = jnp.moveaxis(windows, axis, 1)
  return windows.reshape((-1,) + windows.shape[2:])


def _refold(out: Any, unfolded: Any, sizes: Any) -> Any:
  """Moves the output positions folded into the batch back to their axes."""
  m, spatial = len(unfolded), out.ndim - 2
  out = out.reshape((-1, *sizes) + out.shape[1:])  # (N, o_1..o_m, O, spatial...)
  perm = [0, m + 1] + [1 + unfolded.index(i) if i in unfolded else m + 2 + i
                       for i in range(spatial)]
  perm += [m + 2 + i for i in unfolded]  # their size-1 spatial axes, dropped below
  out = lax.transpose(out, perm)
  return out.reshape(out.shape[:2 + spatial])


# --- derivatives at symbolic sizes ---------------------------------------------

def _any_symbolic(*values: Any) -> bool:
  return any(_is_dyn(d) for d in jax.tree.leaves(values))


def _lhs_transpose_padding(lhs: Any, rhs: Any, out: Any, padding: Any, strides: Any, lhs_dil: Any,
                           rhs_dil: Any) -> Any:
  """Per spatial axis, the padding of the input's transposed convolution.

  It correlates the cotangent, dilated by the strides, with the reversed
  kernel (dilated size k): low padding k - 1 - lo, and the high padding that
  leaves exactly the dilated input's entries.
  """
  pads = []
  for l, r, o, (lo, _), s, a, b in zip(lhs, rhs, out, padding, strides, lhs_dil, rhs_dil, strict=True):
    low = _dilated(r, b) - 1 - lo
    pads.append((low, _dilated(l, a) + _dilated(r, b) - 1 - _dilated(o, s) - low))
  return tuple(pads)


def _rhs_transpose_padding(lhs: Any, rhs: Any, out: Any, padding: Any, strides: Any, lhs_dil: Any,
                           rhs_dil: Any) -> Any:
  """Per spatial axis, the padding of the kernel's transposed convolution.

  It correlates the padded input with the cotangent dilated by the strides:
  the same low padding, and the high padding that leaves exactly the
  kernel's entries.
  """
  return tuple((lo, _dilated(r, b) - 1 + _dilated(o, s) - _dilated(l, a) - lo)
               for l, r, o, (lo, _), s, a, b in zip(lhs, rhs, out, padding, strides,
                                                    lhs_dil, rhs_dil, strict=True))


def _conv_transpose_lhs(ct: Any, lhs_aval: Any, rhs: Any, *, window_strides: Any, padding: Any,
                        lhs_dilation: Any,
                        rhs_dilation: Any, dimension_numbers: Any, feature_group_count: Any,
                        batch_group_count: Any, **params: Any) -> Any:
  """d lhs: the cotangent convolved with the reversed kernel, features swapped.

  With g groups (feature or batch), output feature group j of the forward op
  came from input group j, so the kernel (g*O', I) becomes (g*I, O') with
  the group factor moved from O to I.
  """
  dn = dimension_numbers
  ndim = len(lhs_aval.shape)
  groups = max(feature_group_count, batch_group_count)
  w = lax.transpose(rhs, dn.rhs_spec)
  o, i = w.shape[:2]
  w = w.reshape((groups, o // groups, i) + w.shape[2:])
  w = lax.transpose(w, (0, 2, 1, *range(3, ndim + 1)))
  w = lax.rev(w.reshape((groups * i, o // groups) + w.shape[3:]), tuple(range(2, ndim)))
  g = lax.transpose(ct, dn.out_spec)
  w = w.astype(g.dtype)
  lhs_shape = _permute(lhs_aval.shape, dn.lhs_spec)
  pads = _lhs_transpose_padding(lhs_shape[2:], w.shape[2:], g.shape[2:], padding,
                                window_strides, lhs_dilation, rhs_dilation)
  out = jc.primitive("conv_general_dilated").bind(  # type: ignore[union-attr]  # always registered by JAX
      g, w, window_strides=tuple(lhs_dilation), padding=pads,
      lhs_dilation=tuple(window_strides), rhs_dilation=tuple(rhs_dilation),
      dimension_numbers=_canonical_dn(ndim), feature_group_count=groups,
      batch_group_count=1, **dict(params, out_sharding=None))
  if batch_group_count > 1:  # (N/B, B*C) -> (B*N/B, C): the groups were batch blocks
    n, c = out.shape[:2]
    b = batch_group_count
    out = out.reshape((n, b, c // b) + out.shape[2:])
    out = lax.transpose(out, (1, 0, *range(2, ndim + 1)))
    out = out.reshape((n * b, c // b) + out.shape[3:])
  out = lax.transpose(out, tuple(np.argsort(dn.lhs_spec)))
  return out.astype(lhs_aval.dtype)


def _conv_transpose_rhs(ct: Any, lhs: Any, rhs_aval: Any, *, window_strides: Any, padding: Any,
                        lhs_dilation: Any,
                        rhs_dilation: Any, dimension_numbers: Any, feature_group_count: Any,
                        batch_group_count: Any, **params: Any) -> Any:
  """d rhs: the input correlated with the cotangent, batch and features swapped.

  The input's batch becomes the contracted feature axis and its features the
  batch; feature groups become batch groups and vice versa.
  """
  dn = dimension_numbers
  ndim = len(rhs_aval.shape)
  g = lax.transpose(ct, dn.out_spec)
  x = lax.transpose(lhs, dn.lhs_spec).astype(g.dtype)
  rhs_shape = _permute(rhs_aval.shape, dn.rhs_spec)
  pads = _rhs_transpose_padding(x.shape[2:], rhs_shape[2:], g.shape[2:], padding,
                                window_strides, lhs_dilation, rhs_dilation)
  swap = (1, 0, *range(2, ndim))
  out = jc.primitive("conv_general_dilated").bind(  # type: ignore[union-attr]  # always registered by JAX
      x, g, window_strides=tuple(rhs_dilation), padding=pads,
      lhs_dilation=tuple(lhs_dilation), rhs_dilation=tuple(window_strides),
      dimension_numbers=lax.ConvDimensionNumbers(swap, swap, swap),
      feature_group_count=batch_group_count, batch_group_count=feature_group_count,
      **dict(params, out_sharding=None))
  out = lax.transpose(out, tuple(np.argsort(dn.rhs_spec)))
  return out.astype(rhs_aval.dtype)


def conv_transpose_rule(i: int, original: Callable[..., Any]) -> Callable[..., Any]:
  """Operand i's transpose (0: lhs, 1: rhs): JAX's, or polyjit's at symbolic sizes."""
  def rule(ct: Any, lhs: Any, rhs: Any, **params: Any) -> Any:
    lhs_shape = lhs.aval.shape if i == 0 else lhs.shape
    rhs_shape = rhs.shape if i == 0 else rhs.aval.shape
    if not _any_symbolic(ct.shape, lhs_shape, rhs_shape, params["padding"]):
      return original(ct, lhs, rhs, **params)
    if i == 0:
      return _conv_transpose_lhs(ct, lhs.aval, rhs, **params)
    return _conv_transpose_rhs(ct, lhs, rhs.aval, **params)
  return rule
