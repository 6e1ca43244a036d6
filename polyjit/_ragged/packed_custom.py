"""`jax.custom_jvp` functions on packed rows (a rule of `packed_eval.py`).

The function is evaluated packed, and its custom derivative rule is packed
too (as `_masking/rules/control_flow.py` does for masking), so `jax.nn.relu`'s
derivative at 0 stays the rule's. Tangents of per-token operands are zeroed
on the tail before the rule sees them (of pairs, off each example's block);
a tangent the rule computes in a narrower kind (a per-example or shared
value) is brought to its primal's. Values go in and out zero off the blocks
(a loose pair is selected: the values carry no flags across the call). JAX
runs the rule only when it differentiates, past `pj.vmap`'s choice of the
packed path, so where an operand is a pair, or the rule holds a primitive
with neither a packed rule nor a masking rule to run it one padded row per
example (a loop over the tokens), the rule is run once while tracing too
(its values unused: dead code): an `Unpackable` it raises then falls back to
the unpacked run. A rule that refuses only when JAX runs it raises a
`MaskingError` that says so, never the packed evaluation's internal refusal.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from .. import _jax as jc
from .._masking import native as _native
from .._masking.errors import MaskingError
from .packed_eval import _RELAYOUT, _RULES, eval_packed
from .packed_values import EXAMPLE, PAIR, SHARED, TOKEN, UNPACKED, Unpackable, V
from .packed_pairs import _select as _select_pairs, tight
from .packed_layout import Layout


#: The rules being tried (`_custom_jvp_call`), innermost last.
_trying: list[Any] = []


def _custom_jvp_call(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """The function packed, with its custom derivative rule packed too (as
  `_masking/rules/control_flow.py` does for masking), so `jax.nn.relu`'s
  derivative at 0 stays the rule's."""
  invals = [tight(layout, v) for v in invals]   # (the inner rules see kinds, not flags)
  call_jaxpr = eqn.params["call_jaxpr"]
  rule, out_zeros = _native.custom_jvp_rule(eqn)
  n_consts = eqn.params["num_consts"]
  n_out = len(eqn.outvars)
  n_lay = len(layout.arrays)
  diff_in = [i for i, v in enumerate(eqn.invars[n_consts:]) if _native.inexact(v.aval)]
  shapes = [(v.kind, v.axis, v.dim, v.axis2) for v in invals]
  kinds: list[tuple[str, int, Any, int]] = []

  def rebuild(arrays: Sequence[Any]) -> tuple[Layout, list[V]]:
    return rebuilt(layout, shapes, arrays)

  def forward(*arrays: Any) -> list[Any]:
    inner, vs = rebuild(arrays)
    # (a loose pair or token out, `x @ w` inside: selected, the V made of it
    # below holds no flags)
    outs = [tight(inner, o) for o in eval_packed(call_jaxpr.jaxpr, call_jaxpr.consts, vs, inner)]
    kinds[:] = [(o.kind, o.axis, o.dim, o.axis2) for o in outs]
    return [o.val for o in outs]

  def packed_jvp(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
    if _trying:
      return rule_jvp(primals, tangents)
    try:
      return rule_jvp(primals, tangents)
    except Unpackable as e:   # (JAX differentiates: too late to run unpacked)
      raise MaskingError(
          f"pj.vmap over a packed batch cannot run the derivative rule of the "
          f"jax.custom_jvp function {jc.source_line(eqn)}: in it, {e}. JAX runs the rule "
          "only when it differentiates, after pj.vmap has chosen the packed path.\n"
          "What to do: pass the batch unpacked (no packing=), or write the rule with "
          "ops that have packed rules (docs/guide/packing.md lists them).",
          primitive=e.primitive, source=e.source) from e

  def rule_jvp(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
    inner, vs = rebuild(primals)
    ts = []
    for i in diff_in:
      v, t = vs[n_consts + i], tangents[n_lay + n_consts + i]
      if v.kind == UNPACKED:
        raise Unpackable(eqn, "a custom derivative rule on values with two axes along the "
                         "example held one padded row per example")
      if v.kind == PAIR:
        t = _select_pairs(inner, t, v.axis, v.axis2)
      elif v.kind == TOKEN:
        t = inner.select(t, v.axis, v.dim)
      ts.append(V(v.kind, t, v.axis, v.dim, v.axis2))
    both = [tight(inner, o) for o in eval_packed(rule.jaxpr, rule.consts,
                                                 [*vs[n_consts:], *ts], inner)]
    outs, nz = both[:n_out], iter(both[n_out:])
    if [(o.kind, o.axis, o.dim, o.axis2) for o in outs] != kinds:
      raise Unpackable(eqn, "a custom derivative rule whose values take another layout "
                       "than the function's")
    touts = []
    for o, z in zip(outs, out_zeros, strict=True):
      touts.append(jnp.zeros_like(o.val) if z else _as_kind(next(nz), o, inner).val)
    return [o.val for o in outs], touts

  arrays = [*layout.arrays, *[v.val for v in invals]]
  if not _trying and diff_in and (
      any(invals[n_consts + i].kind in (PAIR, UNPACKED) for i in diff_in)
      or _may_refuse(rule.jaxpr)):
    # JAX runs the rule when it differentiates, after `pj.vmap` has chosen the
    # packed path: an `Unpackable` there (a pair rule missing) would reach the
    # user. Run it once now (its values unused: dead code) so that it falls
    # back to the unpacked run, and before the call is bound (a call left dead
    # in the trace by the fallback is still differentiated); not again for the
    # rule's own calls of the function (`relu`'s calls `relu`). (On tokens
    # alone not: that tripled the first trace of a model of `relu`s, each
    # call's jaxpr its own: only where the rule holds a primitive that no
    # packed rule and no relayout covers, a loop over the tokens, `_may_refuse`.)
    _trying.append(eqn)
    try:
      forward(*arrays)
      packed_jvp(arrays, arrays)
    finally:
      _trying.pop()
  packed = jax.custom_jvp(forward)
  packed.defjvp(packed_jvp)
  vals = packed(*arrays)
  return [V(k, x, a, d, a2) for (k, a, d, a2), x in zip(kinds, vals, strict=True)]


def rebuilt(layout: Layout, shapes: Sequence[tuple[str, int, Any, int]],
            arrays: Sequence[Any]) -> tuple[Layout, list[V]]:
  """Inside a function of arrays (a custom rule's, a checkpoint's): the
  layout from its leading arrays (`layout.arrays`' count of them) and the
  values from the rest, of the kinds `shapes` held outside."""
  n_lay = len(layout.arrays)
  inner = Layout(layout.name, arrays[:n_lay], layout.rows, layout.row_length,
                 layout.may_be_empty)
  return inner, [V(k, x, a, d, a2)
                 for (k, a, d, a2), x in zip(shapes, arrays[n_lay:], strict=True)]


def _may_refuse(jaxpr: Any) -> bool:
  """Whether `jaxpr` (its sub-jaxprs too) holds a primitive that neither a
  packed rule nor a masking rule one padded row per example covers (a
  `while` loop over the tokens): its packed evaluation may refuse it, and is
  tried while tracing. Rules of elementwise ops, reductions and products
  (`relu`'s, `logsumexp`'s) are not: each trial traces the rule once more."""
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name not in _RULES and name not in _RELAYOUT:
      return True
    if any(_may_refuse(sub) for sub in jc.subjaxprs_in_params(eqn.params)):
      return True
  return False


def _as_kind(v: V, like: V, layout: Layout) -> V:
  """`v` in `like`'s kind (a tangent the rule computed in a narrower one)."""
  if v.kind == like.kind:
    return v
  if {v.kind, like.kind} & {UNPACKED, PAIR}:
    raise Unpackable(None, "a custom derivative rule on values with two axes along the example")
  target = like.val.shape
  if like.kind == EXAMPLE:
    val = jnp.broadcast_to(v.val, target)
  elif v.kind == SHARED:
    val = layout.select(jnp.broadcast_to(v.val, target), like.axis, like.dim)
  else:   # EXAMPLE onto TOKEN
    g = layout.onto_tokens(jnp.broadcast_to(v.val, (layout.examples,)), like.dim)
    val = lax.broadcast_in_dim(g, target, (like.axis,))
  return V(like.kind, val, like.axis, like.dim)


_RULES["custom_jvp_call"] = _custom_jvp_call
