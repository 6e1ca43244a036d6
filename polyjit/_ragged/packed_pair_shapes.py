"""Pairs of tokens re-shaped, and looked up at (rules of `packed_pairs.py`).

A PAIR's array is the example's shape behind the rows, both axes along the
example `row_length` long (`packed_pairs.py`). A reshape that leaves those
two axes whole (it only splits, merges, adds or drops the other axes: the
heads of `jax.nn.dot_product_attention`'s grouped queries, `(1, h, n, n)` to
`(1, h, 1, n, n)`) and a squeeze of other axes act on the example's shape
alone: the stored array is reshaped behind the rows, each pair where it was,
flags kept; so does a slice or an index along the other axes (`bias[0]`,
`scores[:, :1]`). A lookup in a shared table at indices held as pairs (T5's
relative position buckets, `table[:, clip(j - i)]`, a bias `(h, n, n)`) runs
per row (`jax.vmap` over the rows); its pairs between two examples of a row
look up whatever their indices hold, so the result is loose, selected by the
op that uses it (as a shared value broadcast onto pairs is). Anything else
is no pair rule.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .. import _jax as jc
from .packed_eval import _PAIR_RULES
from .packed_values import NoPairRule, PAIR, SHARED, V
from .packed_layout import Layout
from .packed_pairs import _pair_axes, _pair_shape


def _segments(shape: Any, axes: tuple[int, int]) -> tuple[int, int, int]:
  """The sizes of the example's shape before, between and after the pair axes."""
  a, b = axes
  return _size(shape[:a]), _size(shape[a + 1:b]), _size(shape[b + 1:])


def _size(dims: Any) -> int:
  return int(np.prod([int(d) for d in dims], dtype=np.int64))


def _reshape(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  in_aval, out_aval = eqn.invars[0].aval, eqn.outvars[0].aval
  if x.kind != PAIR or eqn.params.get("dimensions") is not None:
    raise NoPairRule()
  axes = _pair_axes(out_aval)
  if (any(not layout.is_base(out_aval.shape[a]) for a in axes)
      or _segments(in_aval.shape, (x.axis, x.axis2)) != _segments(out_aval.shape, axes)):
    raise NoPairRule()   # (the pair axes split or merged: not a row's blocks any more)
  # row-major: each pair's entries before, between and after its axes stay
  # together, so the array behind the rows reshapes as the example's does
  out = x.val.reshape(_pair_shape(out_aval, layout))
  return [V(PAIR, out, axes[0], x.dim, axes[1], guarded=x.guarded, loose=x.loose)]


def _squeeze(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  if x.kind != PAIR:
    raise NoPairRule()
  axes = _pair_axes(eqn.outvars[0].aval)
  return [V(PAIR, x.val.reshape(_pair_shape(eqn.outvars[0].aval, layout)), axes[0], x.dim,
            axes[1], guarded=x.guarded, loose=x.loose)]


def _row_params(eqn: Any, layout: Layout) -> dict[str, Any]:
  """`eqn`'s params for one row: every size along the example `row_length`."""
  def sub(v: Any) -> Any:
    if jc.is_symbolic_dim(v):
      if not layout.is_base(v):
        raise NoPairRule()
      return layout.row_length
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
      return tuple(sub(d) for d in v)
    return v
  return {k: sub(v) for k, v in eqn.params.items()}


def _per_row(eqn: Any, args: list[Any], axes: list[int | None], layout: Layout) -> Any:
  """`eqn` as the example wrote it, on each row (`row_length` for `n`): the
  rows in front, where the pair layout holds them."""
  params = _row_params(eqn, layout)
  prim = eqn.primitive
  out = jax.vmap(lambda *xs: prim.bind(*xs, **prim.get_bind_params(params)),
                 in_axes=axes)(*args)
  if out.shape != _pair_shape(eqn.outvars[0].aval, layout):
    raise NoPairRule()
  return out


def _gather(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  operand, indices = invals
  axes = _pair_axes(eqn.outvars[0].aval)
  if operand.kind == SHARED and indices.kind == PAIR:
    # a lookup at indices held as pairs; loose: the pairs between two examples
    # (and the tail's) looked up at their own indices, selected by the op
    # that uses it (which zeroes their cotangents, that the gather's
    # transpose adds into the table)
    out = _per_row(eqn, [operand.val, indices.val], [None, 0], layout)
    return [V(PAIR, out, axes[0], indices.dim, axes[1], loose=True)]
  dn = eqn.params["dimension_numbers"]
  if (operand.kind == PAIR and indices.kind == SHARED
      and not {operand.axis, operand.axis2} & {*dn.start_index_map, *dn.collapsed_slice_dims,
                                               *dn.operand_batching_dims}):
    # (`bias[0]`) indices along the other axes, every pair taken whole: each
    # pair stays where it was (an index out of range may fill the others)
    out = _per_row(eqn, [operand.val, indices.val], [0, None], layout)
    return [V(PAIR, out, axes[0], operand.dim, axes[1], guarded=operand.guarded,
              loose=operand.loose or "FILL" in str(eqn.params.get("mode")))]
  raise NoPairRule()


def _slice(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  p = eqn.params
  whole = all(not jc.is_symbolic_dim(p["start_indices"][a]) and int(p["start_indices"][a]) == 0
              and layout.is_base(p["limit_indices"][a])
              and (p["strides"] is None or int(p["strides"][a]) == 1)
              for a in (x.axis, x.axis2)) if x.kind == PAIR else False
  if not whole:   # (`scores[:-1]`: not a row's blocks any more)
    raise NoPairRule()
  axes = _pair_axes(eqn.outvars[0].aval)   # (`scores[:1]`, heads sliced)
  out = _per_row(eqn, [x.val], [0], layout)
  return [V(PAIR, out, axes[0], x.dim, axes[1], guarded=x.guarded, loose=x.loose)]


_PAIR_RULES.update({"reshape": _reshape, "squeeze": _squeeze, "gather": _gather,
                    "slice": _slice})
