"""Pairs of tokens on packed rows: attention scores as block-diagonal work per row.

A value with two axes along the example (`q @ k.T`, a causal mask from
`jnp.tril(jnp.ones((n, n)))`) is held per row (kind PAIR): its array is the
example's shape with both such axes `row_length` long, behind a leading axis
of the rows, so entry `(r, ..., i, ..., c, ...)` pairs the i-th and the c-th
token of row r (`axis` holds the i, `axis2` the c, both numbered in the
example's shape). A batch's scores cost `rows * row_length^2` (never
`(rows * row_length)^2`), and the rows lead as the batch axis of the
contractions that make and consume them (`q @ k.T` comes out of its
`dot_general` in this layout, `softmax(scores) @ v` goes into one as it is), so
no pair value is transposed but where the function transposes it; a per-token
value goes in and out by a reshape where its tokens are its first axis. A pair
is valid when both tokens belong to the same example; every other entry, the
tail's and the other examples' of the row, is held at zero (the tail
invariant of `packed_eval.py`, per pair). Validity is symmetric in the two
axes, both `row_length` long, so neither axis is special: `axis` is the first
of the two in the example's shape, `axis2` the second, and a transpose
(`scores.T`, `jnp.swapaxes`, einsum's `hkq`) is a transpose of the stored
axes behind the rows.

Rules: a contraction of two per-token values over their other axes makes a
PAIR (then selected on the valid pairs); elementwise ops combine PAIRs with
per-token values broadcast along either axis, per-example and shared values
of size 1 along both (`scores / n`, a bias per head `(h, 1, 1)`); a pair broadcast over other axes
(`mask[None]`) stays a pair; reductions along either axis
give per-token values (over the valid pairs: a max fills the others with
-inf, its derivative counting valid ties), sums over both axes per-example
values, reductions over other axes (the heads) pairs; a contraction of either axis of a PAIR with a per-token value
(`softmax(scores) @ v`, `scores.T @ v`) is a batched product per row (it and
the product that makes a PAIR are `packed_block_dot.block_dot`: one
example's inf or NaN, times the zero pairs of two examples, would be NaN in
its row neighbours, in the value or the derivative products); `iota`
along either axis is the token's position in its example.
Anything else on a PAIR raises `Unpackable` (the call runs unpacked).

Softmax along the second axis (`jax.nn.softmax`'s steps) is recognised in
the jaxpr, so that it costs no more passes over the scores than on a batch
of padded rows: its max shift selects the scores once, for the maximum and
the `exp` both, which XLA then fuses (`_shift`); and the quotient `e / sum(e)`
keeps its denominator per token (`_normalize`). Its product with the values
is a block product like any other, and JAX differentiates the quotient:
the denominator's derivative sums `e * g` over each row (`g` the quotient's
cotangent), as JAX's softmax sums `p * g`. (Not `ct . (p @ v)` per token, the
same sum rounded another way: where the softmax saturates, JAX's derivative
is exactly 0, the one `p` that is 1 taking the same `g` twice, and that
rounding, times the keys in `q @ k.T`'s derivative, was 8% of the gradient
at scores of 1e5: tests/test_packing_saturated_softmax_gradient.py.)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking.rules.reductions import _extremum
from .packed_block_dot import block_dot
from .packed_eval import _PAIR_RULES, needs_guard, producer, tight_token
from .packed_values import (EXAMPLE, NoPairRule, PAIR, SHARED, TOKEN, Unpackable, V, _bind,
                            _inexact, _n_axes, _token_axis)
from .packed_selects import BOUNDED_DERIVATIVE, finite_constant, fill, selects
from .packed_layout import Layout, identity as _identity, segment_sum, widened
from .._masking.rules.elementwise import ELEMENTWISE


def _pair_axes(aval: Any) -> tuple[int, int]:
  axes = [a for a, d in enumerate(aval.shape) if jc.is_symbolic_dim(d)]
  if len(axes) != 2:
    raise NoPairRule()
  return axes[0], axes[1]


def _pair_shape(aval: Any, layout: Layout) -> tuple[int, ...]:
  """A PAIR's array shape: the rows, then the example's shape with every axis
  along the example `row_length` long."""
  return (layout.rows, *(layout.row_length if jc.is_symbolic_dim(d) else int(d)
                         for d in aval.shape))


def _pair_valid(layout: Layout) -> Any:
  """`(rows, row_length, row_length)`: tokens i and c of a row are in one
  example (symmetric: a tail token is in none).

  One comparison per pair: the tail's ids (`examples` and up) compared with
  the keys' ids with their tail's set to -1 (no example's), so a tail token
  is in no pair, where `inside_i & (id_i == id_c)` took two ops per pair in
  every loop that reads the mask."""
  def make() -> Any:
    rows = layout.segments.reshape(layout.rows, layout.row_length)
    keys = jnp.where(rows < layout.examples, rows, -1)
    return rows[:, :, None] == keys[:, None, :]
  return layout._cached(("pairs",), make)


def _valid_like(layout: Layout, shape: Any, axis: int, axis2: int) -> Any:
  return layout._cached(("pairs like", tuple(shape), axis, axis2), lambda: lax.broadcast_in_dim(
      _pair_valid(layout), tuple(shape), (0, *sorted((axis + 1, axis2 + 1)))))


def _select(layout: Layout, x: Any, axis: int, axis2: int) -> Any:
  return lax.select(_valid_like(layout, x.shape, axis, axis2), x, lax.full_like(x, 0))


def tight(layout: Layout, v: V) -> V:
  """`v` zero off the block diagonal (a loose PAIR selected), or on the tail
  (a loose TOKEN selected): a value that leaves the flags behind (a custom
  derivative rule's, a loop's carry) must hold that invariant itself."""
  if v.kind == TOKEN:
    return tight_token(layout, v)
  if v.kind != PAIR or not v.loose:
    return v
  return V(PAIR, _select(layout, v.val, v.axis, v.axis2), v.axis, v.dim, v.axis2,
           guarded=True)


def _to_rows(x: Any, axis: int, layout: Layout) -> Any:
  """A per-token array (tokens at `axis`) in the PAIR layout: the rows in
  front, each row's tokens at `axis + 1` (a reshape where `axis` is 0)."""
  x = x.reshape(*x.shape[:axis], layout.rows, layout.row_length, *x.shape[axis + 1:])
  return jnp.moveaxis(x, axis, 0)


def _from_rows(x: Any, axis: int, layout: Layout) -> Any:
  """The inverse of `_to_rows`: rows in front and each row's tokens at
  `axis + 1`, back to per-token with the tokens at `axis`."""
  x = jnp.moveaxis(x, 0, axis)
  return x.reshape(*x.shape[:axis], layout.tokens, *x.shape[axis + 2:])


def _same_dims(v: V, layout: Layout) -> None:
  if not layout.is_base(v.dim):
    raise NoPairRule()


def _dot_general(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  lhs, rhs = [tight(layout, v) for v in invals]
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  out_aval = eqn.outvars[0].aval
  if lhs.kind == TOKEN and rhs.kind == TOKEN and _n_axes(out_aval) == 2:
    if lhs.axis in lc or lhs.axis in lb or rhs.axis in rc or rhs.axis in rb:
      raise NoPairRule()
    _same_dims(lhs, layout)
    _same_dims(rhs, layout)
    # the rows a batch axis in front: the product comes out in the PAIR layout
    l, r = _to_rows(lhs.val, lhs.axis, layout), _to_rows(rhs.val, rhs.axis, layout)
    dn = ((_up(lc), _up(rc)), ((0, *_up(lb)), (0, *_up(rb))))
    # (its transposes sum over the tokens of a row: guarded, `packed_block_dot.py`)
    out = _block(eqn, [l, r], layout, dn, (0, lhs.axis + 1), (1, rhs.axis + 1))
    axis, axis2 = _pair_axes(out_aval)
    # loose: pairs of two examples' tokens hold their product, selected by the
    # op that uses them (a softmax's max reads the valid pairs alone)
    return [V(PAIR, out, axis, lhs.dim, axis2, loose=True)]
  pair, tok = (lhs, rhs) if lhs.kind == PAIR else (rhs, lhs)
  pc, tc = (lc, rc) if pair is lhs else (rc, lc)
  pb, tb = (lb, rb) if pair is lhs else (rb, lb)
  if (pair.kind == PAIR and tok.kind == SHARED
      and not {pair.axis, pair.axis2} & {*pc, *pb}):   # both pair axes free: straight
    dn = ((_up(lc), rc), (_up(lb), rb)) if pair is lhs else ((lc, _up(rc)), (lb, _up(rb)))
    out, = _bind(eqn, [pair.val, tok.val] if pair is lhs else [tok.val, pair.val], layout,
                 **dict(eqn.params, dimension_numbers=dn))
    # the rows: the pair operand's first free axis, after the batch axes (and
    # the other operand's free axes where the pair is on the right)
    at = len(pb) + (0 if pair is lhs else np.ndim(tok.val) - len(tc) - len(tb))
    axis, axis2 = _pair_axes(out_aval)
    out = jnp.moveaxis(out, at, 0)
    if finite_constant(tok.val):
      return [V(PAIR, out, axis, pair.dim, axis2)]
    # zeros off the blocks times an inf or NaN in the parameters are NaN: selected
    return [V(PAIR, _select(layout, out, axis, axis2), axis, pair.dim, axis2, guarded=True)]
  if pair.kind != PAIR or tok.kind != TOKEN:
    raise NoPairRule()
  # either axis of the pair (the layout is symmetric: `scores.T @ v`, einsum's
  # `hkq,khd->qhd`) with the tokens of the other operand; the other one free
  contracted = [a for a in (pair.axis, pair.axis2) if a in pc]
  if len(contracted) != 1 or tok.axis not in tc:
    raise Unpackable(eqn, "a contraction of attention scores along both their axes, or "
                     "with another axis than the tokens' of the other operand")
  free = pair.axis2 if contracted[0] == pair.axis else pair.axis
  if (free in pb or list(pc).index(contracted[0]) != list(tc).index(tok.axis)
      or tok.axis in tb):
    raise NoPairRule()
  _same_dims(tok, layout)
  t = _to_rows(tok.val, tok.axis, layout)   # each row's tokens contracted with the pair's
  pdn, tdn = (_up(pc), (0, *_up(pb))), (_up(tc), (0, *_up(tb)))
  dn = ((pdn[0], tdn[0]), (pdn[1], tdn[1])) if pair is lhs else \
      ((tdn[0], pdn[0]), (tdn[1], pdn[1]))
  # (each token `free` of a row meets the other tokens of the row: guarded)
  i, masked = ((0, free + 1), (1, tok.axis + 1)) if pair is lhs else \
      ((1, free + 1), (0, tok.axis + 1))
  out_axis = _token_axis(out_aval, eqn)
  if out_axis is None:
    raise NoPairRule()
  args = [pair.val, t] if pair is lhs else [t, pair.val]
  out = _block(eqn, args, layout, dn, i, masked)
  return [V(TOKEN, _from_rows(out, out_axis, layout), out_axis, pair.dim)]


def _block(eqn: Any, args: list[Any], layout: Layout, dn: Any, i: tuple[int, int],
           masked: tuple[int, int]) -> Any:
  """`eqn`'s product of two operands in the PAIR layout (`dn`, the rows a
  batch axis in front), token `i` meeting token `masked` in a valid pair
  only: exact per example where one example's values or cotangents are inf
  or NaN (`packed_block_dot.py`)."""
  return block_dot(args[0], args[1], _pair_valid(layout), dn, i=i, masked=masked,
                   precision=eqn.params.get("precision"),
                   preferred_element_type=eqn.params.get("preferred_element_type"))


def _one(d: Any) -> bool:
  return not jc.is_symbolic_dim(d) and int(d) == 1


def _up(axes: Any) -> tuple[int, ...]:
  """Axis numbers of the example's shape in an array with the rows in front."""
  return tuple(a + 1 for a in axes)


def _elementwise(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  out_aval = eqn.outvars[0].aval
  axis, axis2 = _pair_axes(out_aval)
  pairs = [v for v in invals if v.kind == PAIR]
  if any((v.axis, v.axis2) != (axis, axis2) for v in pairs):
    raise Unpackable(eqn, "attention scores whose axes were swapped")
  shape = _pair_shape(out_aval, layout)
  dim = next((v.dim for v in invals if v.kind in (PAIR, TOKEN)), None)
  if dim is None:
    raise NoPairRule()
  args = []
  for v, var in zip(invals, eqn.invars, strict=True):
    if v.kind == PAIR or (v.kind == SHARED and np.ndim(v.val) == 0):
      args.append(v.val)
    elif v.kind == SHARED and _one(var.aval.shape[axis]) and _one(var.aval.shape[axis2]):
      args.append(jnp.expand_dims(v.val, 0))   # a bias per head `(h, 1, 1)`: every row
    elif v.kind == TOKEN and _one(var.aval.shape[axis2 if v.axis == axis else axis]):
      _same_dims(v, layout)
      args.append(_to_rows(v.val, v.axis, layout))   # broadcast along the other axis
    elif v.kind == EXAMPLE and (np.ndim(v.val) == 1 or (_one(var.aval.shape[axis])
                                                        and _one(var.aval.shape[axis2]))):
      args.append(_example_on_rows(v.val, len(out_aval.shape), axis, dim, layout))
    else:
      raise NoPairRule()
  name = eqn.primitive.name
  if name == "div" and _normalizes(eqn, invals, axis):
    return _normalize(eqn, invals, layout, axis, axis2)
  if name == "sub" and _shifts(eqn, invals, shape):
    return [_shift(invals[0], layout)]
  if name == "exp" and invals[0].softmax_step == "shifted":
    # (no select: off the blocks `exp(-inf)`, 0, but in the rows `_shift` names)
    return [V(PAIR, lax.exp(args[0]), axis, dim, axis2, guarded=True, loose=True,
              softmax_step="exp")]
  # pairs are zero off the block diagonal, as tokens are on the tail: the same
  # refinement as there (`selects`); a loose pair, a token or a per-example
  # value broadcast along a row (its own value on the other examples' pairs of
  # the row) and a shared value are not, and their cotangents are never guarded
  loose = [v.kind in (SHARED, TOKEN, EXAMPLE) or v.loose for v in invals]
  operands, result = selects(eqn, invals, loose)
  filled = fill(eqn, loose) if operands else None
  if filled is not None and invals[filled[0]].kind != SHARED and _inexact(args[filled[0]]):
    # (`exp(scores - max)`, `e / sum`) one select off the block diagonal, to a
    # value where the op is 0: no select of the result
    i, value = filled
    x = jnp.broadcast_to(args[i], shape)
    args[i] = lax.select(_valid_like(layout, shape, axis, axis2), x, lax.full_like(x, value))
    outs = _bind(eqn, [jnp.broadcast_to(x, shape) if np.ndim(x) else x for x in args], layout)
    return [V(PAIR, o, axis, dim, axis2, guarded=len(args) == 1) for o in outs]
  if operands:   # (a traced shared scalar as on tokens: `needs_guard`)
    args = [_select(layout, jnp.broadcast_to(x, shape), axis, axis2)
            if ((v.kind in (TOKEN, EXAMPLE) or (v.kind == PAIR and not v.guarded))
                and _inexact(x))
            or (v.kind == SHARED and needs_guard(v, x, name, i)) else x
            for i, (v, x) in enumerate(zip(invals, args, strict=True))]
  outs = _bind(eqn, [jnp.broadcast_to(x, shape) if np.ndim(x) else x for x in args], layout)
  if result and name in BOUNDED_DERIVATIVE:
    # (`scores - max`: no derivative to guard) a loose result, selected where
    # it is used, in the same loop as that op
    return [V(PAIR, o, axis, dim, axis2, loose=True) for o in outs]
  if result:
    outs = [_select(layout, o, axis, axis2) for o in outs]
  return [V(PAIR, o, axis, dim, axis2, guarded=result) for o in outs]


def _only_adds_ones(eqn: Any) -> bool:
  """A `broadcast_in_dim` or `reshape` that only inserts axes of size 1 (a
  `keepdims`)."""
  if eqn.primitive.name not in ("broadcast_in_dim", "reshape"):
    return False
  def squeezed(aval: Any) -> list[str]:
    return [str(d) for d in aval.shape if not _one(d)]
  return squeezed(eqn.invars[0].aval) == squeezed(eqn.outvars[0].aval)


def _normalizes(eqn: Any, invals: list[V], axis: int) -> bool:
  """`e / sum(e, axis2, keepdims=True)` with `e = exp(...)` held zero off the
  blocks by the select its `exp` took, or by `_shift`'s but in rows NaN on
  their block too (softmax's last step). Its denominator is
  then a sum of non-negative terms over the valid pairs: 0 only where every
  valid `e` of the row is 0 (0 / 0: NaN there for the example alone too), so
  the pairs off the blocks need no guard of their own (`_normalize`)."""
  num, den = invals
  if not (num.kind == PAIR and num.guarded and (not num.loose or num.softmax_step == "exp")
          and den.kind == TOKEN and den.axis == axis):
    return False
  made = producer(eqn.invars[0])
  if made is None or made.primitive.name not in ("exp", "exp2"):
    return False
  src = producer(eqn.invars[1])
  while src is not None and _only_adds_ones(src):
    src = producer(src.invars[0])
  # (the sum along the row: over the second axis, whose pairs share a token of
  # the first, the denominator's)
  return (src is not None and src.primitive.name == "reduce_sum"
          and src.invars[0] is eqn.invars[0] and tuple(src.params["axes"]) == (num.axis2,))


def _normalize(eqn: Any, invals: list[V], layout: Layout, axis: int, axis2: int) -> list[V]:
  """Softmax's `e / sum(e)` (`_normalizes`) with the denominator kept per token
  and its result selected on the valid pairs, in the division's own loop.
  The general rule selects the broadcast denominator to 1 off the blocks, a
  pair-sized array that the division's derivative keeps (with its -2 power)
  for the backward pass: two more passes over every score tensor. Here off
  the blocks `e` is exactly 0, so `0 / z` there is 0 but where `z` is 0 or NaN
  (or `e` NaN, `_shift`'s), rows that the example alone makes NaN too; the
  result's select hides them and zeroes the cotangent there, and the NaN
  that `0 / z` gives `e`'s cotangent off the blocks stops at the select
  `e`'s `exp` (or `_shift`) took. A tail token's `z` (a sum over no pair: 0)
  is divided as 1, on the tokens."""
  num, den = invals
  _same_dims(den, layout)
  z = lax.select(layout.valid_like(den.val.shape, den.axis, den.dim), den.val,
                 lax.full_like(den.val, 1))
  # (the size-1 axis broadcast by the division itself, as in the jaxpr: the
  # derivative's `z ** -2` stays per token)
  zr = _to_rows(z, den.axis, layout)
  out, = _bind(eqn, [num.val, zr], layout)
  # (a select of value and derivative both: off the blocks the quotient's
  # tangent is NaN in a row whose `z` is 0 or NaN, which a contraction along
  # the first axis, `P.T @ v`, would carry to the other examples of the row;
  # and a cotangent there that overflows, `dy_i . v_c` of two examples' large
  # finite numbers, times `e == 0` would be NaN in the token's own `z`)
  return [V(PAIR, _select(layout, out, axis, axis2), axis, num.dim, axis2, guarded=True)]


def _shifts(eqn: Any, invals: list[V], shape: tuple[int, ...]) -> bool:
  """`s - stop_gradient(max(s, axis2, keepdims=True))`: softmax's first step
  (`jax.nn.softmax`'s, `jnp.max`'s `initial=-inf` included), along the
  second axis of the scores, whose maximum has no derivative."""
  s, top = invals
  if not (s.kind == PAIR and top.kind == TOKEN and top.axis == s.axis
          and np.shape(s.val) == shape and _inexact(s.val)):
    return False
  stopped, src = False, producer(eqn.invars[1])
  while src is not None and src.primitive.name != "reduce_max":
    name = src.primitive.name
    if name == "stop_gradient":
      stopped = True
    elif not (_only_adds_ones(src) or (name == "max" and any(
        isinstance(v, jc.Literal) and np.all(np.asarray(v.val) == -np.inf)
        for v in src.invars))):
      return False
    src = producer(next(v for v in src.invars if not isinstance(v, jc.Literal)))
  return (stopped and src is not None and src.invars[0] is eqn.invars[0]
          and tuple(src.params["axes"]) == (s.axis2,))


def _shift(s: V, layout: Layout) -> V:
  """`s - max(s)` along the second axis (`_shifts`) with the scores off the
  blocks -inf before the maximum and the difference both, the maximum a
  plain reduction: XLA reads the scores once for the maximum and `exp`
  (one loop, as for softmax on a batch), where `max` as a reduction on pairs
  (`_reduce`) selects the tail's maximum and `exp` its operand, a loop each.
  Off the blocks the difference is -inf (its `exp` 0) but in the rows whose
  maximum is -inf or NaN, NaN: the tail's (summed along the row, its `z` is
  selected as a token's) and a query's whose scores are all -inf or one NaN
  (its row NaN on its block too, for the example alone as well). Its
  cotangent off the blocks stops at the select of the scores; the maximum
  has none."""
  x = lax.select(_valid_like(layout, s.val.shape, s.axis, s.axis2), s.val,
                 lax.full_like(s.val, -np.inf))
  top = lax.stop_gradient(jnp.max(x, axis=s.axis2 + 1, keepdims=True))
  return V(PAIR, x - top, s.axis, s.dim, s.axis2, guarded=True, loose=True,
           softmax_step="shifted")


def _example_on_rows(x: Any, rank: int, axis: int, dim: Any, layout: Layout) -> Any:
  """A per-example value `(examples, ...)` of size 1 along both pair axes
  (`scores / n`), or a scalar, on its tokens along `axis` of the rows: zero on
  the tail, its own value on the other examples' pairs of the row (loose)."""
  if np.ndim(x) == 1:
    x = x.reshape(x.shape[0], *([1] * rank))
  g = lax.squeeze(layout.onto_tokens(x, dim), (axis + 1,))   # (tokens, ...)
  return jnp.moveaxis(_to_rows(g, 0, layout), 1, axis + 1)


def _reduce(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  axes = tuple(eqn.params["axes"])
  name = eqn.primitive.name
  if x.kind != PAIR or name not in ("reduce_sum", "reduce_max", "reduce_min"):
    raise NoPairRule()
  paired = [a for a in (x.axis, x.axis2) if a in axes]
  if not paired:   # over the heads (a loose pair selected: its zeros off the blocks stay)
    y = tight(layout, x)
    out, = _bind(eqn, [y.val], layout, **dict(eqn.params, axes=_up(axes)))
    kept = [a - sum(b < a for b in axes) for a in (x.axis, x.axis2)]
    # (the cotangent goes back to the same pairs: a select that made `y` guards it)
    return [V(PAIR, out, kept[0], x.dim, kept[1], guarded=y.guarded)]
  if len(paired) != 1:
    return _total(eqn, x, axes, layout)
  # along either axis (the layout is symmetric), the other one left: per token
  left = x.axis2 if paired[0] == x.axis else x.axis
  axis = left - sum(a < left for a in axes)
  # (softmax's `sum(e)` along the second axis: its rows NaN off the blocks
  # are the tail's, selected below, and queries NaN on their block too)
  summed = name == "reduce_sum" and x.softmax_step == "exp" and axes == (x.axis2,)
  if name == "reduce_sum":   # (a max reads the valid pairs alone: a loose one as it is)
    y = x if summed else tight(layout, x)
    out, = _bind(eqn, [y.val], layout, **dict(eqn.params, axes=_up(axes)))
  else:
    kind = "max" if name == "reduce_max" else "min"
    valid = _valid_like(layout, x.val.shape, x.axis, x.axis2)
    if _inexact(x.val):
      identity = -np.inf if kind == "max" else np.inf
      out = _extremum(kind, _up(axes), identity, x.val, valid)
    else:   # (integers and bools: no derivative)
      filled = lax.select(valid, x.val, lax.full_like(x.val, _identity(kind, x.val.dtype)))
      out, = _bind(eqn, [filled], layout, **dict(eqn.params, axes=_up(axes)))
  out = _from_rows(out, axis, layout)
  if name != "reduce_sum" or summed:   # (a tail token's maximum over no pair: -inf)
    out = layout.select(out, axis, x.dim)
  return [V(TOKEN, out, axis, x.dim, guarded=name != "reduce_sum" or summed)]


def _total(eqn: Any, x: V, axes: tuple[int, ...], layout: Layout) -> list[V]:
  """A sum over both axes of a pair (`jnp.mean(scores)`, an entropy): per
  token along the second, then per example along the first, as a sum over
  the tokens is. (A max over both would divide its derivative among ties
  row by row, not among all of them as JAX's: it runs unpacked.)"""
  if eqn.primitive.name != "reduce_sum":
    raise Unpackable(eqn, "a maximum or minimum of attention scores over both their axes "
                     "at once")
  rest = tuple(a for a in axes if a != x.axis)
  at = x.axis - sum(a < x.axis for a in rest)
  # a narrow float (bfloat16 scores) is summed in float32 along the row and
  # over the tokens both, rounded once: each token's sum rounded to bfloat16,
  # then a segment sum in bfloat16, stopped growing (700 tokens: 3.1e6 for 4.9e6)
  out, = _bind(eqn, [widened(tight(layout, x).val)], layout,
               **dict(eqn.params, axes=_up(rest)))
  out = jnp.moveaxis(_from_rows(out, at, layout), at, 0)   # (tokens, ...)
  out = segment_sum(out, layout.segments, layout.examples)
  return [V(EXAMPLE, lax.convert_element_type(out, eqn.outvars[0].aval.dtype))]


def _iota(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  aval = eqn.outvars[0].aval
  axis, axis2 = _pair_axes(aval)
  if str(aval.shape[axis]) != layout.name or str(aval.shape[axis2]) != layout.name:
    raise NoPairRule()
  shape = _pair_shape(aval, layout)
  dim = eqn.params["dimension"]
  if dim in (axis, axis2):   # the token's position in its example
    pos = layout.positions.reshape(layout.rows, layout.row_length)
    out = lax.broadcast_in_dim(pos, shape, (0, dim + 1))
  else:
    out = lax.broadcasted_iota(np.int32, shape, dim + 1)
  out = lax.convert_element_type(out, aval.dtype)
  return [V(PAIR, _select(layout, out, axis, axis2), axis, aval.shape[axis], axis2,
            guarded=True)]


def _broadcast_in_dim(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  (x,), aval = invals, eqn.outvars[0].aval
  axis, axis2 = _pair_axes(aval)
  if not (layout.is_base(aval.shape[axis]) and layout.is_base(aval.shape[axis2])):
    raise NoPairRule()   # (n, n - 1), (n, 2n): the valid pairs are not a row's blocks
  shape = _pair_shape(aval, layout)
  dims = tuple(eqn.params["broadcast_dimensions"])
  if x.kind == SHARED:
    out = lax.broadcast_in_dim(x.val, shape, _up(dims))
  elif x.kind == TOKEN and dims[x.axis] in (axis, axis2):
    _same_dims(x, layout)
    out = lax.broadcast_in_dim(_to_rows(x.val, x.axis, layout), shape, (0, *_up(dims)))
  elif x.kind == PAIR:   # over the heads (`mask[None]`): the pairs stay where they are
    out = lax.broadcast_in_dim(x.val, shape, (0, *_up(dims)))
    # (its cotangent, summed over the new axes, reaches the same pairs: the
    # select that made `x` guards it)
    return [V(PAIR, out, axis, x.dim, axis2, guarded=x.guarded, loose=x.loose)]
  else:
    raise NoPairRule()
  return [V(PAIR, out, axis, aval.shape[axis], axis2, loose=True)]


def _transpose(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  if x.kind != PAIR:
    raise NoPairRule()
  perm = list(eqn.params["permutation"])
  out = lax.transpose(x.val, (0, *_up(perm)))
  # the trailing axes moved as the example's are (`scores.T`, `jnp.swapaxes`):
  # the valid pairs are symmetric, so the result is a pair like any other
  axis, axis2 = sorted((perm.index(x.axis), perm.index(x.axis2)))
  return [V(PAIR, out, axis, x.dim, axis2, guarded=x.guarded, loose=x.loose)]


_PAIR_RULES.update({name: _elementwise for name in ELEMENTWISE})
_PAIR_RULES.update({
    "dot_general": _dot_general, "reduce_sum": _reduce, "reduce_max": _reduce,
    "reduce_min": _reduce, "iota": _iota, "broadcast_in_dim": _broadcast_in_dim,
    "transpose": _transpose,
})
