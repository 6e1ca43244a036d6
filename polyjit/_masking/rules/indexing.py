"""Indexing: starts, bounds and clamping follow the logical sizes.

XLA bounds every start index by the operand's size: gathers and `clip`
scatters clamp it so the window fits, other scatters drop a window that does
not fit. On a padded operand that size is the *padded* one, so the unpadded
program's "clamp to the last valid window" would read padding, and its "out
of bounds, dropped" would write into it (or, for a window that straddles the
logical end, into valid data). So every start into a dynamic axis is first
clamped, or tested, against the logical bound `size - window`; an index past
the logical end is out of bounds, never a read of padding. Negative indices
need nothing: jnp wraps them with the logical size (`dim_as_value`) before
they get here. A clamped window can still overrun the padded axis when the
window is dynamic too; such operands get extra room (`_util.needs_room`).

Writes are the other half: a padded update carries garbage in its padding,
and the entries of a dropped window, of the padding of the indices, or of
the padding of a dynamic window must not land:

* combining scatters (add, mul, min, max) replace such entries with the
  combiner's identity (-0.0 for add, so that a valid -0.0 stays -0.0);
* a plain `scatter` (set, or `.at[].apply`) moves a dropped window's start
  out of bounds. When its windows are dynamic and smaller than the operand
  axis, their padding would overwrite valid data (of this window's neighbours
  too, so a mask of what one window writes cannot help): it becomes a scatter
  of single entries, in which every entry to drop gets an index out of bounds.

`dynamic_slice` and `dynamic_update_slice` follow the same bounds; the
latter keeps the operand where a dynamic update holds padding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax
import jax.numpy as jnp

from ... import _jax as jc
from ..core import Rule, RuleContext, register
from ._util import clamp_index, identity_value, needs_room, pad_high

_Mode = lax.GatherScatterMode


def _restore(x: Any, shape: Any) -> Any:
  """Slices `x` back to `shape` after `pad_high` gave it room."""
  if tuple(x.shape) == tuple(shape):
    return x
  return lax.slice(x, (0,) * x.ndim, shape)


@register("dynamic_slice")
def _dynamic_slice(ctx: RuleContext, operand: Any, *starts: Any, slice_sizes: Any) -> list[Any]:
  aval = ctx.in_avals[0]
  start_list = list(starts)
  for d, (op_d, size_d) in enumerate(zip(aval.shape, slice_sizes, strict=True)):
    if jc.is_symbolic_dim(op_d) or jc.is_symbolic_dim(size_d):
      start_list[d] = clamp_index(start_list[d], ctx.logical(op_d - size_d))
      if needs_room(op_d, size_d):
        operand = pad_high(operand, d, ctx.padded(size_d))
  return ctx.bind(operand, *start_list, slice_sizes=slice_sizes)


@register("dynamic_update_slice")
def _dynamic_update_slice(ctx: RuleContext, operand: Any, update: Any, *starts: Any) -> list[Any]:
  op_aval, upd_aval = ctx.in_avals[:2]
  shape = operand.shape
  start_list = list(starts)
  for d, (op_d, upd_d) in enumerate(zip(op_aval.shape, upd_aval.shape, strict=True)):
    if jc.is_symbolic_dim(op_d) or jc.is_symbolic_dim(upd_d):
      start_list[d] = clamp_index(start_list[d], ctx.logical(op_d - upd_d))
      if needs_room(op_d, upd_d):
        operand = pad_high(operand, d, ctx.padded(upd_d))
  mask = ctx.valid_mask(upd_aval)
  if mask is not None:  # keep the operand where the update is padding
    update = lax.select(mask, update, lax.dynamic_slice(operand, start_list, update.shape))
  return [_restore(lax.dynamic_update_slice(operand, update, start_list), shape)]


# --- start indices -----------------------------------------------------------

def _logical_starts(ctx: RuleContext, operand: Any, indices: Any, op_shape: Any, window: Any,
                    index_map: Any, clip: bool) -> Any:
  """Start indices bounded by the logical sizes.

  Returns the operand (with room where a dynamic window needs it), the indices
  (clamped into the logical bounds if `clip`) and a bool array over the index
  batch shape, False where a start is out of logical bounds (None if `clip`,
  or if no indexed axis is dynamic: then XLA's bounds are the logical ones).
  """
  dynamic = [d for d in index_map
             if jc.is_symbolic_dim(op_shape[d]) or jc.is_symbolic_dim(window[d])]
  if not dynamic:
    return operand, indices, None
  for d in dynamic:
    if needs_room(op_shape[d], window[d]):
      operand = pad_high(operand, d, ctx.padded(window[d]))
  indices = _wide(indices)
  upper = jnp.stack([jnp.asarray(ctx.logical(op_shape[d] - window[d]), indices.dtype)
                     for d in index_map])
  upper = lax.broadcast_in_dim(upper, indices.shape, (indices.ndim - 1,))
  if clip:
    return operand, lax.max(jnp.zeros((), indices.dtype), lax.min(indices, upper)), None
  in_bounds = jnp.all((indices >= 0) & (indices <= upper), axis=-1)
  return operand, indices, in_bounds


def _wide(indices: Any) -> Any:
  """Indices in a type that holds every padded size and -1 (int32 or wider)."""
  if np.dtype(indices.dtype).itemsize < 4:
    return lax.convert_element_type(indices, np.int32)
  return indices


def _keep_only(keep: Any, indices: Any) -> Any:
  """`indices` with the starts where `keep` is False moved out of bounds."""
  indices = _wide(indices)
  dtype = np.dtype(indices.dtype)
  far = np.asarray(np.iinfo(dtype).max if dtype.kind == "u" else -1, dtype)
  first = jnp.where(keep, indices[..., 0], far)
  return jnp.concatenate([first[..., None], indices[..., 1:]], axis=-1)


def _and(a: Any, b: Any) -> Any:
  return b if a is None else a if b is None else a & b


# --- gather ------------------------------------------------------------------

@register("gather")
def _gather(ctx: RuleContext, operand: Any, indices: Any, *, dimension_numbers: Any,
            slice_sizes: Any, mode: Any, **params: Any) -> list[Any]:
  op_aval = ctx.in_avals[0]
  mode = _Mode.from_any(mode)
  fill = mode == _Mode.FILL_OR_DROP
  operand, new_indices, in_bounds = _logical_starts(
      ctx, operand, indices, op_aval.shape, slice_sizes,
      dimension_numbers.start_index_map, clip=not fill)
  if in_bounds is not None:  # XLA fills what it finds out of bounds
    new_indices = _keep_only(in_bounds, new_indices)
  if new_indices is not indices:  # within the logical bounds, so XLA's hold too
    indices = new_indices
    params = dict(params, indices_are_sorted=False)
    mode = mode if fill else _Mode.CLIP
  return ctx.bind(operand, indices, dimension_numbers=dimension_numbers,
                  slice_sizes=slice_sizes, mode=mode, **params)


# --- scatter -----------------------------------------------------------------

_COMBINERS = {
    "scatter-add": "add", "scatter-sub": "sub", "scatter-mul": "mul",
    "scatter-min": "min", "scatter-max": "max",
}


def _identity(kind: str, dtype: Any) -> Any:
  value = identity_value("add" if kind == "sub" else kind, dtype)
  if kind == "add" and jnp.issubdtype(dtype, jnp.inexact):
    return -value  # x + -0.0 == x for every x, -0.0 included
  return value


def _window_sizes(op_aval: Any, upd_aval: Any, dn: Any) -> Any:
  sizes, pos = [], 0
  for i in range(len(op_aval.shape)):
    if i in dn.inserted_window_dims or i in dn.operand_batching_dims:
      sizes.append(1)
    else:
      sizes.append(upd_aval.shape[dn.update_window_dims[pos]])
      pos += 1
  return sizes


def _scatter_dims(updates: Any, dn: Any) -> Any:
  """The axes of `updates` that follow the index batch axes, in order."""
  return tuple(a for a in range(updates.ndim) if a not in dn.update_window_dims)


def _overwrites_data(op_shape: Any, window: Any) -> bool:
  """Whether a window's padding can land on valid entries of the operand:
  a dynamic window smaller than its axis (one as large as the axis starts at
  0, so its padding lands in the operand's padding)."""
  return any(jc.is_symbolic_dim(w) and w != d for w, d in zip(window, op_shape, strict=True))


def _element_indices(indices: Any, updates: Any, dn: Any) -> Any:
  """The operand index of every entry of `updates`: shape updates.shape + (rank,)."""
  dtype = indices.dtype
  scatter_dims = _scatter_dims(updates, dn)
  window_dims = iter(dn.update_window_dims)
  index_map = dn.scatter_dims_to_operand_dims
  rank = len(dn.inserted_window_dims) + len(dn.operand_batching_dims) + len(dn.update_window_dims)
  coords = []
  for i in range(rank):
    if i in dn.operand_batching_dims:  # the position along the paired index axis
      axis = dn.scatter_indices_batching_dims[dn.operand_batching_dims.index(i)]
      coords.append(lax.broadcasted_iota(dtype, updates.shape, scatter_dims[axis]))
      continue
    coord = jnp.zeros(updates.shape, dtype)
    if i not in dn.inserted_window_dims:
      coord = lax.broadcasted_iota(dtype, updates.shape, next(window_dims))
    if i in index_map:
      start = indices[..., index_map.index(i)]
      coord = coord + lax.broadcast_in_dim(start, updates.shape, scatter_dims)
    coords.append(coord)
  return jnp.stack(coords, axis=-1)


def _set_per_element(ctx: RuleContext, operand: Any, indices: Any, updates: Any, keep: Any,
                     dn: Any, mode: Any, params: Any) -> Any:
  """A set of windows as a set of single entries; entries not in `keep` drop."""
  element_indices = _keep_only(keep, _element_indices(indices, updates, dn))
  rank = operand.ndim
  element_dn = dn._replace(update_window_dims=(), inserted_window_dims=tuple(range(rank)),
                           scatter_dims_to_operand_dims=tuple(range(rank)),
                           operand_batching_dims=(), scatter_indices_batching_dims=())
  params = dict(params, indices_are_sorted=False, unique_indices=False)
  return ctx.bind(operand, element_indices, updates, dimension_numbers=element_dn,
                  mode=mode, **params)[0]


def _scatter(kind: str | None) -> Rule:
  def rule(ctx: RuleContext, operand: Any, indices: Any, updates: Any, *, dimension_numbers: Any,
           mode: Any, **params: Any) -> list[Any]:
    op_aval, idx_aval, upd_aval = ctx.in_avals
    dn = dimension_numbers
    shape = operand.shape
    window = _window_sizes(op_aval, upd_aval, dn)
    operand, new_indices, in_bounds = _logical_starts(
        ctx, operand, indices, op_aval.shape, window, dn.scatter_dims_to_operand_dims,
        clip=_Mode.from_any(mode) == _Mode.CLIP)
    if new_indices is not indices:
      indices = new_indices
      params = dict(params, indices_are_sorted=False)
    mode = _Mode.FILL_OR_DROP  # from here on, out of bounds means dropped
    # Update entries that must not land: padding (of the index batch or of a
    # window) and the entries of windows out of logical bounds.
    keep = _and(ctx.valid_mask(upd_aval), None if in_bounds is None else
                lax.broadcast_in_dim(in_bounds, updates.shape, _scatter_dims(updates, dn)))
    if keep is not None and kind is not None:
      identity = lax.full_like(updates, _identity(kind, upd_aval.dtype))
      updates = lax.select(keep, updates, identity)
    elif keep is not None:
      if _overwrites_data(op_aval.shape, window) or not dn.scatter_dims_to_operand_dims:
        if not operand.ndim:
          raise ctx.error("the padding of its updates has no index to drop it by.",
                          "scatter into an array, not a scalar.")
        out = _set_per_element(ctx, operand, indices, updates, keep, dn, mode, params)
        return [_restore(out, shape)]
      # The windows' padding lands in the operand's padding: drop whole windows.
      rows = _and(ctx.valid_mask(idx_aval.shape[:-1]), in_bounds)
      if rows is not None:
        indices = _keep_only(rows, indices)
        params = dict(params, indices_are_sorted=False)
    out = ctx.bind(operand, indices, updates, dimension_numbers=dn, mode=mode, **params)[0]
    return [_restore(out, shape)]
  return rule


for _name, _kind in _COMBINERS.items():
  register(_name)(_scatter(_kind))
register("scatter")(_scatter(None))
