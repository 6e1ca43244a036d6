"""Contractions and gathers on packed tokens (rules of `packed_eval.py`).

A contraction whose free axis is the tokens' (`x @ w`) runs straight on the
packed rows; two per-token values batched over the tokens (`q * k` summed
over features) too. A contraction over the tokens of two per-token values
(`softmax(scores) @ h`, a narrow `x.T @ y`) takes the tokens as a batch axis
and sums each token's product per example (a segment sum, as a reduction
over the tokens is); a wide one, where a token's product would be much
bigger than its operands, goes one padded row per example through the
masking rule (`_relayout`). A lookup per token (an embedding), a gather
along the other axes (`x[:, 0]`) and one batched over the tokens
(`jnp.take_along_axis(logp, targets[:, None], axis=-1)`) run straight.
Anything else relayouts.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax import lax

from .packed_eval import _RULES, _relayout
from .packed_values import EXAMPLE, SHARED, TOKEN, V, _bind, _token_axis
from .packed_layout import Layout, widened
from .packed_selects import finite_constant


def _dot_general(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  lhs, rhs = invals
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  out_axis = _token_axis(eqn.outvars[0].aval, eqn)
  if lhs.kind == TOKEN and rhs.kind == TOKEN and out_axis is not None:
    if lhs.axis in lb and rhs.axis in rb and list(lb).index(lhs.axis) == list(rb).index(rhs.axis):
      out, = _bind(eqn, [lhs.val, rhs.val], layout)
      return [V(TOKEN, out, out_axis, lhs.dim)]
  elif TOKEN in (lhs.kind, rhs.kind) and SHARED in (lhs.kind, rhs.kind):
    (tok, contracting), shared = ((lhs, lc), rhs) if lhs.kind == TOKEN else ((rhs, rc), lhs)
    if tok.axis not in contracting and out_axis is not None:   # the free axis: straight
      out, = _bind(eqn, [lhs.val, rhs.val], layout)
      # the tail's zeros times an inf or NaN in traced parameters are NaN: a
      # loose result, selected by the op that uses it (most often the bias's
      # add, which selects its result anyway)
      return [V(TOKEN, out, out_axis, tok.dim, loose=not finite_constant(shared.val))]
  if lhs.kind == TOKEN and rhs.kind == TOKEN and out_axis is None:
    summed = _token_contraction(eqn, lhs, rhs, layout)
    if summed is not None:
      return [summed]
  return _relayout(eqn, invals, layout)


def _token_contraction(eqn: Any, lhs: V, rhs: V, layout: Layout) -> V | None:
  """A contraction over the example's axis of two per-token values
  (`softmax(scores) @ h`, `x.T @ y`): each token's product summed per
  example, as a reduction over the tokens is, when a token's product is not
  much bigger than its operands (`x.T @ y` of wide `x` and `y` goes one
  padded row per example instead). Both are zero on the tail, so is their
  product, and the tail's segment is dropped."""
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  if (lhs.axis not in lc or rhs.axis not in rc or str(lhs.dim) != str(rhs.dim)
      or list(lc).index(lhs.axis) != list(rc).index(rhs.axis)):
    return None
  per_token = int(np.prod(eqn.outvars[0].aval.shape, dtype=np.int64))
  widest = max(int(np.prod(np.shape(x.val), dtype=np.int64)) // layout.tokens
               for x in (lhs, rhs))
  if per_token > 4 * max(widest, 1):
    return None
  at = list(lc).index(lhs.axis)
  dn = ((lc[:at] + lc[at + 1:], rc[:at] + rc[at + 1:]),
        ((lhs.axis, *lb), (rhs.axis, *rb)))   # the tokens a batch axis, in front
  params = dict(eqn.params, dimension_numbers=dn)
  dtype = eqn.outvars[0].aval.dtype
  if widened(np.zeros((), dtype)).dtype != dtype:
    # a narrow float (bfloat16): each token's product kept in float32 and
    # summed there, rounded once, as XLA's contraction accumulates (a sum in
    # the narrow type stops growing: 1,500 tokens of ones sum to 256)
    params["preferred_element_type"] = np.dtype(np.float32)
  out, = _bind(eqn, [lhs.val, rhs.val], layout, **params)
  out = jax.ops.segment_sum(widened(out), layout.segments, layout.examples)
  return V(EXAMPLE, lax.convert_element_type(out, dtype))


def _gather(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  operand, indices = invals
  out_axis = _token_axis(eqn.outvars[0].aval, eqn)
  if operand.kind == SHARED and indices.kind == TOKEN and out_axis is not None:
    # a lookup per token (an embedding): straight; the tail looked up index 0
    out, = _bind(eqn, [operand.val, indices.val], layout)
    return [V(TOKEN, layout.select(out, out_axis, indices.dim), out_axis, indices.dim, guarded=True)]
  if operand.kind == TOKEN and indices.kind == SHARED and out_axis is not None:
    # (`x[:, 0]`) indices along the other axes, every token taken whole: straight
    dn, sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
    a = operand.axis
    if (a not in (*dn.start_index_map, *dn.collapsed_slice_dims, *dn.operand_batching_dims)
        and str(sizes[a]) == str(operand.dim)):
      out, = _bind(eqn, [operand.val, indices.val], layout)
      if "FILL" in str(eqn.params.get("mode")):   # (an index out of range fills the tail too)
        return [V(TOKEN, layout.select(out, out_axis, operand.dim), out_axis, operand.dim,
                  guarded=True)]
      return [V(TOKEN, out, out_axis, operand.dim)]
  if operand.kind == TOKEN and indices.kind == TOKEN and out_axis is not None:
    # (`jnp.take_along_axis(x, i, axis=-1)` of per-token `x` and `i`: a
    # cross-entropy's target logits) the tokens a batch axis of both: each
    # token's indices read its own entries only, straight on the packed rows
    dn, sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
    ob, ib = tuple(dn.operand_batching_dims), tuple(dn.start_indices_batching_dims)
    if (operand.axis in ob and indices.axis in ib
        and ob.index(operand.axis) == ib.index(indices.axis)
        and str(operand.dim) == str(indices.dim) and int(sizes[operand.axis]) == 1):
      out, = _bind(eqn, [operand.val, indices.val], layout)
      # (the tail's indices are 0, in range where the operand has entries; a
      # fill value there, or a clamp to the tail's zeros, is selected away)
      return [V(TOKEN, layout.select(out, out_axis, operand.dim), out_axis, operand.dim,
                guarded=True)]
  return _relayout(eqn, invals, layout)


_RULES.update({"dot_general": _dot_general, "gather": _gather})
