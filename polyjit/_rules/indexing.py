"""Indexing: starts, bounds and clamping follow the logical sizes.

XLA clamps a slice start so the slice fits the operand; on a padded operand it
would fit the *padded* size and read padding where the unpadded program reads
the last valid entries. So every index into a dynamic axis is first clamped
(or, for out-of-bounds-drops modes, tested) against the logical size, and the
operand gets extra room when a clamped window could still overrun the padded
axis (see `_util.needs_room`).

Writes are the other half: a padded update carries garbage in its padding,
and an update entry that lies in the padding of the indices must not land at
all. Scatters drop such entries (their index is moved out of bounds) and fill
the padding of update windows with the combiner's identity; a plain `scatter`
(set) with a dynamic window keeps the operand's values outside the valid part
of the window.
"""

from __future__ import annotations

import numpy as np
from jax import lax
import jax.numpy as jnp

from .. import _jax_compat as jc
from .._core import identity_value, register
from ._util import clamp_index, needs_room, pad_high


def _restore(x, shape):
  """Slices `x` back to `shape` after `pad_high` gave it room."""
  if tuple(x.shape) == tuple(shape):
    return x
  return lax.slice(x, (0,) * x.ndim, shape)


@register("dynamic_slice")
def _dynamic_slice(ctx, operand, *starts, slice_sizes):
  aval = ctx.in_avals[0]
  starts = list(starts)
  for d, (op_d, size_d) in enumerate(zip(aval.shape, slice_sizes)):
    if jc.is_symbolic_dim(op_d) or jc.is_symbolic_dim(size_d):
      starts[d] = clamp_index(starts[d], ctx.logical(op_d - size_d))
      if needs_room(op_d, size_d):
        operand = pad_high(operand, d, ctx.padded(size_d))
  return ctx.bind(operand, *starts, slice_sizes=slice_sizes)


@register("dynamic_update_slice")
def _dynamic_update_slice(ctx, operand, update, *starts):
  op_aval, upd_aval = ctx.in_avals[:2]
  shape = operand.shape
  starts = list(starts)
  for d, (op_d, upd_d) in enumerate(zip(op_aval.shape, upd_aval.shape)):
    if jc.is_symbolic_dim(op_d) or jc.is_symbolic_dim(upd_d):
      starts[d] = clamp_index(starts[d], ctx.logical(op_d - upd_d))
      if needs_room(op_d, upd_d):
        operand = pad_high(operand, d, ctx.padded(upd_d))
  mask = ctx.valid_mask(upd_aval)
  if mask is not None:  # keep the operand where the update is padding
    update = lax.select(mask, update, lax.dynamic_slice(operand, starts, update.shape))
  return [_restore(lax.dynamic_update_slice(operand, update, starts), shape)]


# --- gather ------------------------------------------------------------------

def _upper_bounds(ctx, op_shape, window, index_map, dtype):
  """Per index component: the largest logical start, as a (k,) vector."""
  bounds = [jnp.asarray(ctx.logical(op_shape[d] - window[d]), dtype) for d in index_map]
  return jnp.stack(bounds) if bounds else jnp.zeros((0,), dtype)


def _gather_fill_value(dtype, fill_value):
  if fill_value is not None:
    return fill_value
  return identity_value("max", dtype) if jnp.issubdtype(dtype, jnp.integer) else np.nan


@register("gather")
def _gather(ctx, operand, indices, *, dimension_numbers, slice_sizes, mode,
            fill_value, **params):
  op_aval, _ = ctx.in_avals
  out_aval, = ctx.out_avals
  dn = dimension_numbers
  index_map = dn.start_index_map
  dynamic = [d for d in index_map
             if jc.is_symbolic_dim(op_aval.shape[d]) or jc.is_symbolic_dim(slice_sizes[d])]
  if not dynamic:  # padding only in batch or whole-axis dims: lands in padding
    return ctx.bind(operand, indices, dimension_numbers=dn, slice_sizes=slice_sizes,
                    mode=mode, fill_value=fill_value, **params)
  for d in dynamic:
    if needs_room(op_aval.shape[d], slice_sizes[d]):
      operand = pad_high(operand, d, ctx.padded(slice_sizes[d]))
  upper = _upper_bounds(ctx, op_aval.shape, slice_sizes, index_map, indices.dtype)
  upper = lax.broadcast_in_dim(upper, indices.shape, (indices.ndim - 1,))
  clamped = lax.max(jnp.zeros((), indices.dtype), lax.min(indices, upper))
  mode = lax.GatherScatterMode.from_any(mode)
  out = ctx.bind(operand, clamped, dimension_numbers=dn, slice_sizes=slice_sizes,
                 mode=lax.GatherScatterMode.CLIP, fill_value=None, **params)[0]
  if mode == lax.GatherScatterMode.FILL_OR_DROP:
    in_bounds = jnp.all((indices >= 0) & (indices <= upper), axis=-1)
    batch_dims = [a for a in range(out.ndim) if a not in dn.offset_dims]
    in_bounds = lax.broadcast_in_dim(in_bounds, out.shape, batch_dims)
    fill = _gather_fill_value(out_aval.dtype, fill_value)
    out = lax.select(in_bounds, out, lax.full_like(out, fill))
  return [out]


# --- scatter -----------------------------------------------------------------

_SCATTER_IDENTITY = {
    "scatter-add": "add", "scatter-sub": "add", "scatter-mul": "mul",
    "scatter-min": "min", "scatter-max": "max", "scatter": None,
}


def _window_sizes(op_aval, upd_aval, dn):
  sizes, pos = [], 0
  for i in range(len(op_aval.shape)):
    if i in dn.inserted_window_dims or i in dn.operand_batching_dims:
      sizes.append(1)
    else:
      sizes.append(upd_aval.shape[dn.update_window_dims[pos]])
      pos += 1
  return sizes


def _scatter(kind):
  def rule(ctx, operand, indices, updates, *, dimension_numbers, mode, **params):
    op_aval, idx_aval, upd_aval = ctx.in_avals
    dn = dimension_numbers
    index_map = dn.scatter_dims_to_operand_dims
    window = _window_sizes(op_aval, upd_aval, dn)
    shape = operand.shape
    mode = lax.GatherScatterMode.from_any(mode)

    # Entries whose index lies in the padding of the indices never land.
    drop = ctx.valid_mask(idx_aval.shape[:-1])
    drop = None if drop is None else jnp.logical_not(drop)
    dynamic = [d for d in index_map
               if jc.is_symbolic_dim(op_aval.shape[d]) or jc.is_symbolic_dim(window[d])]
    if dynamic or drop is not None:
      if not index_map:
        raise ctx.error("its updates have padded entries but no index selects them.",
                        "scatter along an axis with a fixed size.")
      for d in dynamic:
        if needs_room(op_aval.shape[d], window[d]):
          operand = pad_high(operand, d, ctx.padded(window[d]))
      upper = _upper_bounds(ctx, op_aval.shape, window, index_map, indices.dtype)
      upper = lax.broadcast_in_dim(upper, indices.shape, (indices.ndim - 1,))
      if mode == lax.GatherScatterMode.CLIP:
        indices = lax.max(jnp.zeros((), indices.dtype), lax.min(indices, upper))
      else:  # out of logical bounds: dropped, as XLA drops them unpadded
        oob = jnp.any((indices < 0) | (indices > upper), axis=-1)
        drop = oob if drop is None else drop | oob
      if drop is not None:
        # Any start past the padded operand is out of bounds for XLA too.
        far = np.asarray(operand.shape[index_map[0]], indices.dtype)
        first = jnp.where(drop, far, indices[..., 0])
        indices = jnp.concatenate([first[..., None], indices[..., 1:]], axis=-1)
      mode = lax.GatherScatterMode.FILL_OR_DROP

    upd_mask = ctx.valid_mask(upd_aval, dn.update_window_dims)
    if upd_mask is not None and kind is not None:
      updates = lax.select(upd_mask, updates,
                           lax.full_like(updates, identity_value(kind, upd_aval.dtype)))
      upd_mask = None
    out = ctx.bind(operand, indices, updates, dimension_numbers=dn, mode=mode, **params)[0]
    if upd_mask is not None:  # a set with a dynamic window: keep what it must not touch
      if int(np.prod(indices.shape[:-1])) != 1:
        raise ctx.error(
            "it sets windows of dynamic size at several indices; their padding "
            "could overwrite each other's data.",
            "set one window at a time, or use a window of fixed size.")
      written = ctx.bind(jnp.zeros(operand.shape, bool), indices, upd_mask,
                         dimension_numbers=dn, mode=mode, **params)[0]
      out = lax.select(written, out, operand)
    return [_restore(out, shape)]
  return rule


for _name, _kind in _SCATTER_IDENTITY.items():
  register(_name)(_scatter(_kind))
