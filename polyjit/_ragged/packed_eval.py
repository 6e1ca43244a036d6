"""The packed interpreter: a per-example jaxpr evaluated on packed rows.

Design
------
`pj.vmap(fun)` over a `PackedRagged` traces `fun` once for one example with a
symbolic length `n` (as it does for a padded batch) and evaluates that jaxpr
on the whole packed batch at once. Every value is one of three kinds:

* SHARED: the same for every example (parameters, constants): as traced.
* EXAMPLE: one per example, stacked on a leading axis of `num_examples` (a
  sum over the tokens, the length as a value, a per-example argument).
* TOKEN: one per token: the array of the jaxpr's value with its `n` axis
  (the one axis whose size mentions `n`) replaced by every token of every
  row, `rows * row_length` of them. Its `dim` (`n`, `n - 1`, ...) says how
  many leading tokens of each example's slot are real: a shorter value
  (`x[1:]`) stays in its example's slot, and the rest of the slot counts as
  tail.

Ops then follow from the per-example jaxpr, primitive by primitive: elementwise
ops run on the tokens as they are (per-example values gathered onto their
tokens); an op with no `n` anywhere runs `jax.vmap`ped over the examples;
reductions over `n` become segment reductions with the token's example as
segment id; contractions whose contracted axes avoid `n` run straight on the
packed rows (`x @ w`); a contraction over `n` of two per-token values
(`softmax(scores) @ h`) sums each token's product per example, where that
product is no wider than a few tokens; `iota` along `n` is the position in the
example. An op that mixes positions along `n` and has no packed rule of its own
(`cumsum`, `rev`, slices and shifts other than a prefix, concatenation,
padding other than at the end within the slot, a contraction over `n`,
sorting, convolutions, gathers) runs through the *masking rule* of its
primitive (`_masking/rules/`, the same table `pj.mask` uses): its operands are
gathered into one padded row per example, the masking rule runs `jax.vmap`ped
over the examples with each example's length, and the result is gathered back
into the packed layout. Only ops that are linear or order based take that path,
so JAX's own derivative of the rule is exact there. Values with two axes along
the example (attention scores) are held per row (PAIR, `packed_pairs.py`), or,
where their sizes differ from the example's, one padded row per example
(UNPACKED). A `lax.scan` over the tokens runs once over the positions of all
rows, its carry restarted at each example (`_scan`; a step may read `x[i]`).
Anything else that touches `n` (a loop whose step reads the whole sequence
otherwise, a `custom_vjp`) raises `Unpackable`, and `pj.vmap` runs the call
unpacked with a warning.

The tail invariant
------------------
Every TOKEN value holds exactly 0 on the tail (tokens outside its dim), the
packed data included (zeroed on entry). Ops that keep zeros zero with
finite derivatives (`add`, `mul`, a contraction, a segment gather) need
nothing (a contraction with parameters selects its result: the tail's zeros
times an inf there are NaN); any other op selects its result on the valid
tokens, and its TOKEN operands too where its derivative there may not be
finite (the double select). The selects' transposes zero the tail's cotangent before it
reaches another op, so NaN and inf in the tail reach no value and no
gradient, and JAX differentiates the packed evaluation itself. An operand
made by such a select (`V.guarded`) needs no second one: its cotangent's
tail is zeroed where it was made, and the ops in between keep positions.
Only the selects an op needs are written (`packed_selects.py`): an op whose
derivative is bounded (`add`, `max`, ...) never selects its operands. A
traced scalar operand (`jnp` leaves `w / x`, `x ** p` unbroadcast) sums the
op's derivative over the tail into its cotangent: the double select
broadcasts and selects it too (`needs_guard`). A value that leaves the
interpreter as a bare array (a custom_jvp function's outputs, a loop's
carries) leaves its `loose` flag behind, so it is selected first.
"""

from __future__ import annotations

import contextvars
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking.core import (MaskEnv, RuleContext, _no_rule_error, eqn_is_symbolic,
                             masking_rules)
from .._masking.refusals import narrowed_output
from .._masking.rules.elementwise import ELEMENTWISE
from .packed_layout import (Layout, segment_arg, segment_extremum_over, segment_reduce,
                            segment_sum)
from .packed_selects import fill, foldable, selects
from .packed_values import (EXAMPLE, PAIR, SHARED, TOKEN, UNPACKED, NoPairRule, Unpackable, V,
                            _bind, _inexact, _n_axes, _token_axis, _token_shape)


#: Rules for values with two axes along the example held per row
#: (`packed_pairs.py` fills it: it builds on this module).
_PAIR_RULES: dict[str, Any] = {}


# --- the interpreter ------------------------------------------------------------

#: The variables of the jaxpr being evaluated that an equation or its outputs
#: read (a rule can skip work for an output nobody reads: a scan's final carry).
_LIVE: contextvars.ContextVar[frozenset[Any]] = contextvars.ContextVar("live", default=frozenset())


def is_read(v: Any) -> bool:
  return not jc.is_dropvar(v) and v in _LIVE.get()


#: The equation that made each variable of the jaxpr being evaluated (a rule
#: can recognise a pattern by its values' origins: softmax's `e / sum(e)`).
_PRODUCERS: contextvars.ContextVar[dict[Any, Any]] = contextvars.ContextVar("producers",
                                                                            default={})


def producer(v: Any) -> Any:
  """The equation of the jaxpr being evaluated that made `v` (None for an
  input, a constant or a literal)."""
  return None if isinstance(v, jc.Literal) else _PRODUCERS.get().get(v)


def eval_packed(jaxpr: Any, consts: Sequence[Any], args: Sequence[V], layout: Layout) -> list[V]:
  live = frozenset(v for v in [*(x for e in jaxpr.eqns for x in e.invars), *jaxpr.outvars]
                   if not isinstance(v, jc.Literal))
  token = _LIVE.set(live)
  made = _PRODUCERS.set({o: e for e in jaxpr.eqns for o in e.outvars})
  try:
    return _eval_packed(jaxpr, consts, args, layout)
  finally:
    _PRODUCERS.reset(made)
    _LIVE.reset(token)


def _eval_packed(jaxpr: Any, consts: Sequence[Any], args: Sequence[V], layout: Layout
                 ) -> list[V]:
  vals: dict[Any, V] = {}

  def read(v: Any) -> V:
    return V(SHARED, v.val) if isinstance(v, jc.Literal) else vals[v]

  for v, x in zip(jaxpr.constvars, consts, strict=True):
    vals[v] = V(SHARED, x)
  for v, x in zip(jaxpr.invars, args, strict=True):
    vals[v] = x
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    if _uncanonical_in_rule(eqn):
      raise Unpackable(eqn, "a float64 (or int64) value while jax_enable_x64 is off (an "
                       "array made under jax.enable_x64()): the packed rules compute in "
                       "float32 there, where jax.jit computes in float64")
    with jc.eqn_context(eqn):
      outs = _eval_eqn(eqn, invals, layout)
    narrowed = narrowed_output(eqn, [o.val for o in outs])
    if narrowed:   # (unpacked, the masking rule may keep the dtype)
      raise Unpackable(eqn, "its packed rule computes in {} where jax.jit computes in {} "
                       "(an array made under jax.enable_x64(), x64 off)".format(*narrowed))
    for v, o in zip(eqn.outvars, outs, strict=True):
      if not jc.is_dropvar(v):
        vals[v] = o
  return [read(v) for v in jaxpr.outvars]


def _uncanonical_in_rule(eqn: Any) -> bool:
  """Whether a packed rule that mixes positions (a segment sum, a relayout)
  would see a dtype that this x64 mode does not make (`jc.make_closed_jaxpr`
  traces a float64 `jax.Array` as it is, as jax.jit does): those rules build
  their values with JAX's functions, which make float32 there (and a
  float32 scatter of float64 tangents fails)."""
  name = eqn.primitive.name
  if name in _ELEMENTWISE or name in _CALLS or not eqn_is_symbolic(eqn):
    return False   # (bound as they are, or evaluated equation by equation)
  return any(jc.uncanonical(getattr(v.aval, "dtype", None))
             for v in (*eqn.invars, *eqn.outvars))


def _eval_eqn(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  if not eqn_is_symbolic(eqn):
    if all(v.kind == SHARED for v in invals):
      args = [v.val for v in invals]
      if foldable(eqn, args):   # a constant stays one: `selects` reads its value
        with jax.ensure_compile_time_eval():
          return [V(SHARED, o) for o in _bind(eqn, args, layout)]
      return [V(SHARED, o) for o in _bind(eqn, args, layout)]
    axes = [0 if v.kind == EXAMPLE else None for v in invals]
    outs = jax.vmap(lambda *xs: _bind(eqn, xs, layout), in_axes=axes)(
        *[layout.off_empty(v.val) if v.kind == EXAMPLE else layout.off_all_empty(v.val)
          for v in invals])
    return [V(EXAMPLE, o) for o in outs]
  name = eqn.primitive.name
  if name not in _TAKES_LOOSE:   # (the elementwise rules select a loose token where needed)
    invals = [tight_token(layout, v) for v in invals]
  if name not in _CALLS:
    pairs_in = any(v.kind == PAIR for v in invals)
    if pairs_in or any(_n_axes(o.aval) > 1 for o in eqn.outvars):
      pair_rule = _PAIR_RULES.get(name)
      if pair_rule is not None and not any(v.kind == UNPACKED for v in invals):
        try:
          paired: list[V] = pair_rule(eqn, invals, layout)   # per row, block-diagonal
          return paired
        except NoPairRule:
          pass
      if pairs_in:
        raise Unpackable(eqn, "an op on pairs of tokens (attention scores) that has no "
                         "packed rule")
      return _relayout(eqn, invals, layout)   # one padded row per example
    if any(v.kind == UNPACKED for v in invals):
      return _relayout(eqn, invals, layout)
  rule = _RULES.get(name)
  if rule is not None:
    ruled: list[V] = rule(eqn, invals, layout)
    return ruled
  if name in _RELAYOUT:
    return _relayout(eqn, invals, layout)
  if masking_rules.get(eqn.primitive) is None:   # unpacked it is refused too: say so now
    raise _no_rule_error(eqn)
  if any(jc.is_symbolic_dim(d) for v in eqn.invars for d in getattr(v.aval, "shape", ())):
    why = "it has no packed rule and mixes positions along the example's axis"
  else:
    why = "it has no packed rule"
  raise Unpackable(eqn, why)


def tight_token(layout: Layout, v: V) -> V:
  """`v` zero on the tail (a loose TOKEN selected)."""
  if v.kind != TOKEN or not v.loose:
    return v
  return V(TOKEN, layout.select(v.val, v.axis, v.dim), v.axis, v.dim, guarded=True)


# --- rules ----------------------------------------------------------------------

def _elementwise(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  out_aval = eqn.outvars[0].aval
  axis = _token_axis(out_aval, eqn)
  tokens = [v for v in invals if v.kind == TOKEN]
  if axis is None or not tokens:   # (sizes only in params: not elementwise data)
    raise Unpackable(eqn, "an elementwise op with no operand on the example's axis")
  dim = tokens[0].dim
  if any(v.axis != axis or str(v.dim) != str(dim) for v in tokens):
    raise Unpackable(eqn, "operands whose example axes differ")
  shape = _token_shape(out_aval, layout)
  loose = [v.kind == SHARED or v.loose for v in invals]
  select_in, select_out = selects(eqn, invals, loose)
  args = []
  for v in invals:
    if v.kind == TOKEN:
      x = v.val
    elif v.kind == EXAMPLE:   # a scalar, or size 1 on the token axis: onto the tokens
      g = layout.onto_tokens(v.val, dim)
      if g.ndim == 1:
        x = lax.broadcast_in_dim(g, shape, (axis,))
      else:
        x = jnp.moveaxis(lax.squeeze(g, (axis + 1,)), 0, axis)
    else:
      x = v.val
    args.append(x)
  filled = fill(eqn, loose) if select_in else None
  if filled is not None and invals[filled[0]].kind != SHARED and _inexact(args[filled[0]]):
    i, value = filled   # one select in place of the double select
    args[i] = lax.select(layout.valid_like(args[i].shape, axis, dim), args[i],
                         lax.full_like(args[i], value))
    # (one operand: its select guards the result's cotangent too)
    return [V(TOKEN, o, axis, dim, guarded=len(args) == 1) for o in _bind(eqn, args, layout)]
  if select_in:   # the double select: no NaN derivative on the tail reaches anything
    args = [layout.select(jnp.broadcast_to(x, shape), axis, dim)
            if needs_guard(v, x, eqn.primitive.name, i) else x
            for i, (v, x) in enumerate(zip(invals, args, strict=True))]
  outs = _bind(eqn, args, layout)
  if select_out:
    outs = [layout.select(o, axis, dim) for o in outs]
  return [V(TOKEN, o, axis, dim, guarded=select_out) for o in outs]


def needs_guard(v: V, x: Any, name: str, at: int) -> bool:
  """Whether operand `v` (as `x`) takes the operand select of the double
  select: an inexact per-token value whose cotangent no select guards yet,
  or a traced shared scalar (`jnp` leaves `g / x`, `x ** g` unbroadcast),
  whose cotangent sums the op's derivative over every token, the tail's
  too, where it may not be finite (`d(g / x)/dg` at x = 0); not where that
  derivative is another operand, zero there (`g * x`), or `-x / g**2`,
  finite at any `g` where each example's own is."""
  if v.kind == SHARED:
    return (isinstance(v.val, jc.Tracer) and _inexact(x)
            and not (name == "mul" or (name == "div" and at == 1)))
  return not v.guarded and _inexact(x)


def _broadcast_in_dim(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  (x,), aval = invals, eqn.outvars[0].aval
  axis = _token_axis(aval, eqn)
  if axis is None:
    raise Unpackable(eqn, "a broadcast with sizes in its parameters only")
  dim, shape = aval.shape[axis], _token_shape(aval, layout)
  if x.kind != TOKEN and not layout.fits(dim):   # `jnp.ones(n + 1)`: longer than the slot
    return _relayout(eqn, invals, layout)
  dims = tuple(eqn.params["broadcast_dimensions"])
  if x.kind == TOKEN:
    out, = _bind(eqn, [x.val], layout)
    return [V(TOKEN, out, axis, dim)]
  if x.kind == SHARED:
    out, = _bind(eqn, [x.val], layout)
    return [V(TOKEN, layout.select(out, axis, dim), axis, dim, guarded=True)]
  val = x.val
  if axis in dims:   # a size-1 operand axis stretched along the tokens (jnp.where's)
    at = dims.index(axis)
    val, dims = lax.squeeze(val, (at + 1,)), dims[:at] + dims[at + 1:]
  g = layout.onto_tokens(val, dim)              # (tokens, *operand shape)
  where = [axis, *dims]
  order = sorted(range(len(where)), key=lambda i: where[i])
  g = lax.transpose(g, tuple(order))
  return [V(TOKEN, lax.broadcast_in_dim(g, shape, tuple(sorted(where))), axis, dim)]


def _iota(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  aval = eqn.outvars[0].aval
  axis = _token_axis(aval, eqn)
  if axis is None:
    raise Unpackable(eqn, "an iota with sizes in its parameters only")
  dim, shape = aval.shape[axis], _token_shape(aval, layout)
  if not layout.fits(dim):   # `jnp.arange(n + 1)`: no slot in the row holds it
    return _relayout(eqn, invals, layout)
  if eqn.params["dimension"] == axis:   # positions within the example
    pos = lax.convert_element_type(layout.positions, aval.dtype)
    out = lax.broadcast_in_dim(pos, shape, (axis,))
    return [V(TOKEN, out if layout.is_base(dim) else layout.select(out, axis, dim), axis, dim)]
  out, = _bind(eqn, [], layout)
  return [V(TOKEN, layout.select(out, axis, dim), axis, dim, guarded=True)]


def _dim_as_value(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  dtype = eqn.outvars[0].aval.dtype
  return [V(EXAMPLE, lax.convert_element_type(layout.value(eqn.params["dim"]), dtype))]


def _position_only(eqn: Any, invals: list[V], layout: Layout, new_axis: Any) -> list[V]:
  """An op on one TOKEN operand that keeps the token axis whole: bound as is
  (each result, where it has several: `unstack`)."""
  x, = invals
  if x.kind != TOKEN:
    raise Unpackable(eqn, "a per-example operand")
  axis = new_axis(x.axis)
  if axis is None:
    raise Unpackable(eqn, "it moves data along the example's axis")
  return [V(TOKEN, out, axis, x.dim) for out in _bind(eqn, [x.val], layout)]


def _transpose(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  perm = list(eqn.params["permutation"])
  return _position_only(eqn, invals, layout, perm.index)


def _squeeze(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  gone = eqn.params["dimensions"]
  return _position_only(eqn, invals, layout,
                        lambda a: None if a in gone else a - sum(d < a for d in gone))


def _reshape(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  in_aval, out_aval = eqn.invars[0].aval, eqn.outvars[0].aval
  out_axis = _token_axis(out_aval, eqn)

  def keeps(a: int) -> int | None:
    if out_axis is None or str(out_aval.shape[out_axis]) != str(in_aval.shape[a]):
      return None
    before_in = int(np.prod([int(d) for d in in_aval.shape[:a]]))
    before_out = int(np.prod([int(d) for d in out_aval.shape[:out_axis]]))
    return out_axis if before_in == before_out and eqn.params.get("dimensions") is None else None
  return _position_only(eqn, invals, layout, keeps)


def _slice(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  p = eqn.params
  if x.kind == TOKEN:
    a = x.axis
    whole = (not jc.is_symbolic_dim(p["start_indices"][a]) and int(p["start_indices"][a]) == 0
             and str(p["limit_indices"][a]) == str(x.dim)
             and (p["strides"] is None or int(p["strides"][a]) == 1))
    if whole:
      out, = _bind(eqn, [x.val], layout)
      return [V(TOKEN, out, a, x.dim)]
    start, stride, limit = p["start_indices"][a], p["strides"], p["limit_indices"][a]
    if (not jc.is_symbolic_dim(start) and int(start) == 0 and jc.is_symbolic_dim(limit)
        and (stride is None or int(stride[a]) == 1) and layout.fits(limit)):
      # a prefix (`x[:n - 1]`, JAX proved it no longer than `x`; `x[:2]` has
      # no token axis): the same tokens from each slot's start, the rest of
      # the slot selected to zero
      out, = _bind(eqn, [x.val], layout)
      return [V(TOKEN, layout.select(out, a, limit), a, limit, guarded=True)]
  return _relayout(eqn, invals, layout)


def _pad(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """Padding at the end of the tokens (`n - 1` -> `n`), where the result
  fits each example's slot: the slot's next positions take the padding
  value, the tokens stay where they are (other axes padded as bound)."""
  x, value = invals
  config = [tuple(c) for c in eqn.params["padding_config"]]
  out_aval = eqn.outvars[0].aval
  if (x.kind == TOKEN and value.kind == SHARED and _token_axis(out_aval, eqn) == x.axis
      and not any(jc.is_symbolic_dim(c) for cs in config for c in cs)):
    lo, hi, interior = (int(c) for c in config[x.axis])
    dim = out_aval.shape[x.axis]
    if lo == 0 and interior == 0 and hi >= 0 and layout.fits(dim):
      config[x.axis] = (0, 0, 0)
      out, = _bind(eqn, [x.val, value.val], layout,
                  **dict(eqn.params, padding_config=tuple(config)))
      fill = lax.broadcast_in_dim(value.val, out.shape, ())
      out = lax.select(layout.valid_like(out.shape, x.axis, x.dim), out,
                       layout.select(fill, x.axis, dim))
      return [V(TOKEN, out, x.axis, dim, guarded=True)]
  return _relayout(eqn, invals, layout)


_SEGMENT = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min",
            "argmax": "argmax", "argmin": "argmin"}


def _reduce(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  x, = invals
  axes = tuple(eqn.params["axes"])
  if x.kind != TOKEN:
    raise Unpackable(eqn, "a per-example operand")
  if x.axis not in axes:   # over other axes: per token, and zeros stay zeros
    out, = _bind(eqn, [x.val], layout)
    return [V(TOKEN, out, x.axis - sum(a < x.axis for a in axes), x.dim)]
  kind = _SEGMENT[eqn.primitive.name]
  rest = tuple(a for a in axes if a != x.axis)
  val = x.val
  if kind in ("max", "min") and _inexact(val):   # ties share over the tokens and `rest` at once
    moved = jnp.moveaxis(val, x.axis, 0)
    valid = lax.broadcast_in_dim(layout.valid(x.dim), moved.shape, (0,))
    over = tuple(a + (a < x.axis) for a in rest)
    out = segment_extremum_over(kind, layout.examples, over, moved, valid, layout.segments)
    return [V(EXAMPLE, lax.convert_element_type(out, eqn.outvars[0].aval.dtype))]
  if rest:
    reduce = {"sum": lax.reduce_sum_p, "max": lax.reduce_max_p, "min": lax.reduce_min_p}
    if kind not in reduce:
      raise Unpackable(eqn, "an arg-reduction over several axes")
    params = {k: v for k, v in eqn.params.items() if k != "axes"}
    val = reduce[kind].bind(val, axes=rest, **params)
  axis = x.axis - sum(a < x.axis for a in rest)
  val = jnp.moveaxis(val, axis, 0)
  valid = layout.valid(x.dim)
  valid = lax.broadcast_in_dim(valid, val.shape, (0,))
  if kind == "sum":
    out = segment_sum(val, layout.segments, layout.examples)
  elif kind in ("max", "min"):   # (integers and bools: no derivative)
    out = segment_reduce(kind, val, layout.segments, layout.examples, valid)
  else:
    out = segment_arg(kind, layout, val, valid, eqn.params["index_dtype"])
  return [V(EXAMPLE, lax.convert_element_type(out, eqn.outvars[0].aval.dtype))]


def _call(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  closed = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
  if not hasattr(closed, "consts"):
    closed = jc.ClosedJaxpr(closed, ())
  try:
    return eval_packed(closed.jaxpr, closed.consts, invals, layout)
  except Unpackable as e:
    raise e.called_from(eqn) from None


def _custom_vjp(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  raise Unpackable(eqn, "a jax.custom_vjp function whose operands vary with the length: "
                   "its backward rule is written for one example")


# --- through the masking rules ----------------------------------------------------

#: Ops that mix positions along the example's axis, evaluated one example per
#: padded row with their masking rule: linear or order based (or selects and
#: elementwise ops, run with the double select below), so that JAX's
#: derivative of the rule, on zeros past each example, is the exact one
#: (`fft`: Bluestein's at the padded size, `_masking/rules/fft.py`).
_RELAYOUT = frozenset({
    "cumsum", "cummax", "cummin", "cumprod", "cumlogsumexp", "rev", "slice", "pad",
    "concatenate", "dynamic_slice", "dynamic_update_slice", "gather", "dot_general",
    "reduce_prod", "reduce_and", "reduce_or", "reduce_xor", "sort", "top_k", "split",
    "conv_general_dilated", "reduce_window_sum", "select_and_gather_add",
    "reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin", "broadcast_in_dim",
    "iota", "transpose", "squeeze", "reshape", "dim_as_value", "one_minus_square",
    "polynomial", "fft", "scatter-add", "stack", "unstack", *ELEMENTWISE,
})
_ELEMENTWISE = frozenset({*ELEMENTWISE, "one_minus_square", "polynomial"})
#: Rules that take a loose TOKEN as it is: the elementwise ones (which select it
#: where the op needs), and calls of a jaxpr (whose equations do).
_TAKES_LOOSE = frozenset({*_ELEMENTWISE, "jit", "closed_call", "eval_jaxpr", "call"})
_CALLS = frozenset({"jit", "closed_call", "eval_jaxpr", "call", "custom_jvp_call",
                    "custom_vjp_call", "remat2"})


def _relayout(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """`eqn` run by its masking rule, one padded row per example (`jax.vmap`ped
  over the examples with each one's length). Values with two axes along the
  example (attention scores) stay in that form (UNPACKED, zeros past the
  example); the others go back to the packed layout. Every result's padding
  is selected to zero, and an elementwise op selects its operands too, so a
  NaN derivative in the padding reaches nothing."""
  rule = masking_rules.get(eqn.primitive)
  if rule is None or eqn.primitive.name not in _RELAYOUT:
    raise Unpackable(eqn, "it has no packed rule")
  vals: list[Any] = []
  axes: list[int | None] = []
  for v in invals:
    if v.kind == PAIR:
      raise Unpackable(eqn, "an op on pairs of tokens (attention scores) with no packed rule")
    if v.kind == TOKEN:
      vals.append(layout.unpack(v.val, v.axis, v.dim)); axes.append(0)
    else:
      shared = v.kind == SHARED
      vals.append(layout.off_all_empty(v.val) if shared else layout.off_empty(v.val))
      axes.append(None if shared else 0)
  out_axes = [_token_axis(o.aval, eqn) if _n_axes(o.aval) == 1 else None
              for o in eqn.outvars]
  elementwise = eqn.primitive.name in _ELEMENTWISE
  # a scalar operand (shared, or one per example) next to padded ones: its
  # cotangent sums the op's derivative over the padding too (`w / x` at 0),
  # so it is broadcast and its padding filled as theirs is (`needs_guard`)
  spread = [elementwise and v.kind in (SHARED, EXAMPLE) and not eqn.invars[i].aval.shape
            and needs_guard(v, v.val, eqn.primitive.name, i) for i, v in enumerate(invals)]

  def one(n: Any, *xs: Any) -> list[Any]:
    env = MaskEnv((layout.name,), {layout.name: layout.row_length}, [n])
    ctx = RuleContext(env, eqn)
    if elementwise:
      out = ctx.out_avals[0]
      shape = next((np.shape(x) for x in xs if np.ndim(x)), ())
      xs = tuple(ctx.fill_padding(jnp.broadcast_to(x, shape), out, 0) if wide
                 else ctx.fill_padding(x, aval, 0) if _inexact(x) else x
                 for x, aval, wide in zip(xs, ctx.in_avals, spread, strict=True))
    outs = rule(ctx, *xs, **eqn.params)
    return [ctx.fill_padding(o, aval, 0) for o, aval in zip(outs, ctx.out_avals, strict=True)]

  outs = jax.vmap(one, in_axes=(0, *axes))(layout.lengths, *vals)
  result = []
  for o, a, y in zip(eqn.outvars, out_axes, outs, strict=True):
    if _n_axes(o.aval) > 1:
      result.append(V(UNPACKED, y))
    elif a is not None and not layout.fits(o.aval.shape[a]):
      # longer than the example (`jnp.pad`, a full convolution): no slot in the
      # row holds it, so it stays one padded row per example (its axis moved
      # behind the examples' by `unpack`'s convention)
      result.append(V(UNPACKED, y, a, o.aval.shape[a]))
    elif a is None:
      result.append(V(EXAMPLE, y))
    else:
      d = o.aval.shape[a]
      result.append(V(TOKEN, layout.repack(y, a, d), a, d))
  return result


_RULES: dict[str, Any] = {name: _elementwise for name in ELEMENTWISE}
_RULES.update({
    "one_minus_square": _elementwise, "polynomial": _elementwise,
    "broadcast_in_dim": _broadcast_in_dim, "iota": _iota, "dim_as_value": _dim_as_value,
    "transpose": _transpose, "squeeze": _squeeze, "reshape": _reshape, "slice": _slice,
    "pad": _pad,
    "jit": _call, "closed_call": _call, "eval_jaxpr": _call, "call": _call,
    "custom_vjp_call": _custom_vjp,
    # dot_general, gather: packed_contractions.py; custom_jvp_call: packed_custom.py
    **{name: _reduce for name in _SEGMENT},
})


def _concatenate(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  first = invals[0]
  if (all(v.kind == TOKEN and v.axis == first.axis and str(v.dim) == str(first.dim)
          for v in invals) and eqn.params["dimension"] != first.axis):
    out, = _bind(eqn, [v.val for v in invals], layout)    # along another axis: straight
    return [V(TOKEN, out, first.axis, first.dim)]
  return _relayout(eqn, invals, layout)


_RULES["concatenate"] = _concatenate


def _stack(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """`jnp.stack` of per-token values along a new axis: the token axis is
  untouched wherever the new axis goes (before the tokens it only moves the
  token axis one place on, `(2, tokens, d)`, as a transpose does), so the
  op binds on the packed rows as it is; the tails' zeros stay zeros."""
  first, k = invals[0], eqn.params["axis"]
  if not all(v.kind == TOKEN and v.axis == first.axis and str(v.dim) == str(first.dim)
             for v in invals):
    return _relayout(eqn, invals, layout)
  out, = _bind(eqn, [v.val for v in invals], layout)
  return [V(TOKEN, out, first.axis + (k <= first.axis), first.dim)]


def _unstack(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """`unstack` along an axis other than the tokens' (JAX cannot unstack
  along a symbolic size): each piece keeps every token."""
  k = eqn.params["axis"]
  return _position_only(eqn, invals, layout, lambda a: None if a == k else a - (k < a))


_RULES.update({"stack": _stack, "unstack": _unstack})
