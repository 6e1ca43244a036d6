"""Pairs of tokens on packed rows: attention scores as block-diagonal work per row.

A value with two axes along the example (`q @ k.T`, a causal mask from
`jnp.tril(jnp.ones((n, n)))`) is held per row (kind PAIR): its first such
axis (`axis`) holds every token, its second (`axis2`) the `row_length`
tokens of that token's row, so a batch's scores cost `rows * row_length^2`
(never `(rows * row_length)^2`). A pair is valid when both tokens belong to
the same example; every other entry, the tail's and the other examples' of
the row, is held at zero (the tail invariant of `packed_eval.py`, per pair).

Rules: a contraction of two per-token values over their other axes makes a
PAIR (then selected on the valid pairs); elementwise ops combine PAIRs with
per-token values broadcast along either axis (along the second, each row's
tokens are gathered); reductions along the second axis give per-token values
(over the valid pairs: a max fills the others with -inf, its derivative
counting valid ties); a contraction of a PAIR's second axis with a per-token
value (`softmax(scores) @ v`) is a batched product per row; `iota` along
either axis is the token's position in its example. Anything else on a PAIR
raises `Unpackable` (the call runs unpacked).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .._masking.rules.reductions import _extremum
from .packed_eval import (NoPairRule, PAIR, SHARED, TOKEN, Unpackable, V, _bind, _inexact,
                          _n_axes, _PAIR_RULES, _selects, _token_axis, _token_shape)
from .packed_layout import Layout
from .._masking.rules.elementwise import ELEMENTWISE


def _pair_axes(aval: Any) -> tuple[int, int]:
  from .. import _jax as jc
  axes = [a for a, d in enumerate(aval.shape) if jc.is_symbolic_dim(d)]
  if len(axes) != 2:
    raise NoPairRule()
  return axes[0], axes[1]


def _pair_shape(aval: Any, layout: Layout, axis: int, axis2: int) -> tuple[int, ...]:
  shape = list(_token_shape(aval, layout))
  shape[axis2] = layout.row_length
  return tuple(shape)


def _pair_valid(layout: Layout) -> Any:
  """`(tokens, row_length)`: token i and the c-th token of its row are in one example."""
  def make() -> Any:
    rows = layout.segments.reshape(layout.rows, layout.row_length)
    others = jnp.repeat(rows, layout.row_length, axis=0)
    return (layout.segments[:, None] < layout.examples) & (layout.segments[:, None] == others)
  return layout._cached(("pairs",), make)


def _valid_like(layout: Layout, shape: Any, axis: int, axis2: int) -> Any:
  valid = _pair_valid(layout)
  if axis2 < axis:
    valid = valid.T
  return lax.broadcast_in_dim(valid, tuple(shape), tuple(sorted((axis, axis2))))


def _select(layout: Layout, x: Any, axis: int, axis2: int) -> Any:
  return lax.select(_valid_like(layout, x.shape, axis, axis2), x, lax.full_like(x, 0))


def _row_tokens(layout: Layout, x: Any, token_axis: int, axis: int, axis2: int) -> Any:
  """Per-token `x` (size 1 at `axis`) laid along `axis2`: entry (i, c) holds
  the value of the c-th token of token i's row."""
  x = lax.squeeze(x, (axis,))
  t = token_axis - (1 if axis < token_axis else 0)
  x = jnp.moveaxis(x, t, 0)
  rest = x.shape[1:]
  x = x.reshape(layout.rows, layout.row_length, *rest)
  x = jnp.repeat(x, layout.row_length, axis=0)       # (tokens, row_length, *rest)
  return jnp.moveaxis(x, (0, 1), (axis, axis2))


def _same_dims(v: V, layout: Layout) -> None:
  if not layout.is_base(v.dim):
    raise NoPairRule()


def _dot_general(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  lhs, rhs = invals
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  out_aval = eqn.outvars[0].aval
  if lhs.kind == TOKEN and rhs.kind == TOKEN and _n_axes(out_aval) == 2:
    if lhs.axis in lc or lhs.axis in lb or rhs.axis in rc or rhs.axis in rb:
      raise NoPairRule()
    _same_dims(lhs, layout)
    _same_dims(rhs, layout)
    a, b = lhs.axis, rhs.axis
    l = _split_rows(lhs.val, a, layout)
    r = _split_rows(rhs.val, b, layout)
    dn = ((shift(lc, a), shift(rc, b)), ((a, *shift(lb, a)), (b, *shift(rb, b))))
    params = dict(eqn.params, dimension_numbers=dn)
    out, = _bind(eqn, [l, r], layout, **params)
    axis, axis2 = _pair_axes(out_aval)
    out = _merge_rows(out, axis, layout)
    return [V(PAIR, _select(layout, out, axis, axis2), axis, layout_dim(lhs), axis2)]
  pair, tok = (lhs, rhs) if lhs.kind == PAIR else (rhs, lhs)
  pc = lc if pair is lhs else rc
  pb = lb if pair is lhs else rb
  if (pair.kind == PAIR and tok.kind == SHARED and pair.axis < pair.axis2
      and not {pair.axis, pair.axis2} & {*pc, *pb}):
    out, = _bind(eqn, [lhs.val, rhs.val], layout)    # both pair axes free: straight
    axis, axis2 = _pair_axes(out_aval)
    return [V(PAIR, out, axis, pair.dim, axis2)]
  if pair.kind != PAIR or tok.kind != TOKEN:
    raise NoPairRule()
  pc, tc = (lc, rc) if pair is lhs else (rc, lc)
  pb, tb = (lb, rb) if pair is lhs else (rb, lb)
  if pair.axis2 not in pc or tok.axis not in tc or pair.axis in pc or pair.axis in pb:
    raise Unpackable(eqn, "a contraction of attention scores along their first axis")
  if list(pc).index(pair.axis2) != list(tc).index(tok.axis) or tok.axis in tb:
    raise NoPairRule()
  a, b = pair.axis, tok.axis
  p = _split_rows(pair.val, a, layout)
  t = _split_rows(tok.val, b, layout)
  pc2 = tuple(x + 1 if x == b else x for x in shift(tc, b))   # (the row's tokens: b + 1)
  pcs = shift(pc, a)
  pbs, tbs = (a, *shift(pb, a)), (b, *shift(tb, b))
  dn = ((pcs, pc2), (pbs, tbs)) if pair is lhs else ((pc2, pcs), (tbs, pbs))
  args = [p, t] if pair is lhs else [t, p]
  out, = _bind(eqn, args, layout, **dict(eqn.params, dimension_numbers=dn))
  out_axis = _token_axis(eqn.outvars[0].aval, eqn)
  if out_axis is None:
    raise NoPairRule()
  return [V(TOKEN, _merge_rows(out, out_axis, layout), out_axis, pair.dim)]


def shift(axes: Any, at: int) -> tuple[int, ...]:
  """Axes numbers after a new axis is inserted at `at + 1`."""
  return tuple(x + (1 if x > at else 0) for x in axes)


def layout_dim(v: V) -> Any:
  return v.dim


def _split_rows(x: Any, axis: int, layout: Layout) -> Any:
  """Tokens at `axis` as (rows, row_length) at `axis`, `axis + 1`."""
  return x.reshape(*x.shape[:axis], layout.rows, layout.row_length, *x.shape[axis + 1:])


def _merge_rows(out: Any, axis: int, layout: Layout) -> Any:
  """A product's leading rows batch axis merged back into its tokens at `axis`
  (where the row's own tokens are, at `axis + 1` after the leading rows)."""
  out = jnp.moveaxis(out, 0, axis)
  return out.reshape(*out.shape[:axis], layout.tokens, *out.shape[axis + 2:])


def _elementwise(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  out_aval = eqn.outvars[0].aval
  axis, axis2 = _pair_axes(out_aval)
  pairs = [v for v in invals if v.kind == PAIR]
  if any((v.axis, v.axis2) != (axis, axis2) for v in pairs):
    raise Unpackable(eqn, "attention scores whose axes were swapped")
  shape = _pair_shape(out_aval, layout, axis, axis2)
  args = []
  for v, var in zip(invals, eqn.invars, strict=True):
    if v.kind == PAIR:
      args.append(v.val)
    elif v.kind == SHARED and np.ndim(v.val) == 0:
      args.append(v.val)
    elif v.kind == TOKEN:
      _same_dims(v, layout)
      if v.axis == axis and var.aval.shape[axis2] == 1:
        args.append(v.val)                          # broadcast along the row
      elif v.axis == axis2 and var.aval.shape[axis] == 1:
        args.append(_row_tokens(layout, v.val, v.axis, axis, axis2))
      else:
        raise NoPairRule()
    else:
      raise NoPairRule()
  # pairs alone (and finite constants) are zero off the block diagonal, as
  # tokens are on the tail: the same refinement as there (`_selects`); a
  # token broadcast along a row is not, so both selects
  operands, result = ((True, True) if any(v.kind == TOKEN for v in invals)
                      else _selects(eqn, invals))
  if operands:
    args = [_select(layout, jnp.broadcast_to(x, shape), axis, axis2)
            if v.kind != SHARED and _inexact(x) else x
            for v, x in zip(invals, args, strict=True)]
  outs = _bind(eqn, args, layout)
  if result:
    outs = [_select(layout, o, axis, axis2) for o in outs]
  return [V(PAIR, o, axis, pairs[0].dim if pairs else invals[0].dim, axis2) for o in outs]


def _reduce(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  axes = tuple(eqn.params["axes"])
  name = eqn.primitive.name
  if x.kind != PAIR or axes != (x.axis2,) or name not in ("reduce_sum", "reduce_max",
                                                          "reduce_min"):
    raise Unpackable(eqn, "a reduction of attention scores other than along their "
                     "second axis")
  axis = x.axis - (1 if x.axis2 < x.axis else 0)
  if name == "reduce_sum":
    out, = _bind(eqn, [x.val], layout)
  else:
    kind = "max" if name == "reduce_max" else "min"
    if not _inexact(x.val):
      raise NoPairRule()
    valid = _valid_like(layout, x.val.shape, x.axis, x.axis2)
    identity = -np.inf if kind == "max" else np.inf
    out = _extremum(kind, axes, identity, x.val, valid)
    out = lax.select(layout.valid_like(out.shape, axis, x.dim), out, lax.full_like(out, 0))
  return [V(TOKEN, out, axis, x.dim)]


def _iota(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  aval = eqn.outvars[0].aval
  axis, axis2 = _pair_axes(aval)
  if str(aval.shape[axis]) != layout.name or str(aval.shape[axis2]) != layout.name:
    raise NoPairRule()
  shape = _pair_shape(aval, layout, axis, axis2)
  pos = layout.positions
  dim = eqn.params["dimension"]
  if dim == axis:
    out = lax.broadcast_in_dim(pos, shape, (axis,))
  elif dim == axis2:
    rows = jnp.repeat(pos.reshape(layout.rows, layout.row_length), layout.row_length, axis=0)
    out = lax.broadcast_in_dim(rows if axis < axis2 else rows.T, shape,
                               tuple(sorted((axis, axis2))))
  else:
    out = lax.broadcasted_iota(np.int32, shape, dim)
  out = lax.convert_element_type(out, aval.dtype)
  return [V(PAIR, _select(layout, out, axis, axis2), axis, aval.shape[axis], axis2)]


def _broadcast_in_dim(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  (x,), aval = invals, eqn.outvars[0].aval
  axis, axis2 = _pair_axes(aval)
  shape = _pair_shape(aval, layout, axis, axis2)
  dims = tuple(eqn.params["broadcast_dimensions"])
  if x.kind == SHARED:
    out = lax.broadcast_in_dim(x.val, shape, dims)
  elif x.kind == TOKEN:
    _same_dims(x, layout)
    to = dims[x.axis]
    if to == axis:
      out = lax.broadcast_in_dim(x.val, shape, dims)
    elif to == axis2:   # as a size-1 axis at `axis`, then each row's tokens
      one = list(shape)
      one[axis] = 1
      one[axis2] = layout.tokens
      y = lax.broadcast_in_dim(x.val, tuple(one), dims)
      out = jnp.broadcast_to(_row_tokens(layout, y, axis2, axis, axis2), shape)
    else:
      raise NoPairRule()
  else:
    raise NoPairRule()
  return [V(PAIR, _select(layout, out, axis, axis2), axis, aval.shape[axis], axis2)]


def _transpose(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  if x.kind != PAIR:
    raise NoPairRule()
  perm = list(eqn.params["permutation"])
  out = lax.transpose(x.val, tuple(perm))
  return [V(PAIR, out, perm.index(x.axis), x.dim, perm.index(x.axis2))]


_PAIR_RULES.update({name: _elementwise for name in ELEMENTWISE})
_PAIR_RULES.update({
    "dot_general": _dot_general, "reduce_sum": _reduce, "reduce_max": _reduce,
    "reduce_min": _reduce, "iota": _iota, "broadcast_in_dim": _broadcast_in_dim,
    "transpose": _transpose,
})
