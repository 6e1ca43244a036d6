"""`jax.checkpoint` (remat) on packed rows (a rule of `packed_eval.py`).

A checkpointed function (`jax.checkpoint`, Flax's `nn.remat`, a layer of a
model that rematerializes its blocks) is evaluated packed inside a
`jax.checkpoint` of its own policy and `prevent_cse`: the packed evaluation
is what JAX saves or recomputes, so the model keeps both its packing and its
memory plan. (It ran unpacked with a warning before: a model with remat lost
packing's savings whole.) Values cross the boundary as arrays: the kinds go
in and come out as static facts read while JAX traces the function once
(loose values are selected first, as for `jax.custom_jvp`, so no flag needs
to cross), and the rows' layout arrays are arguments of the checkpointed
function, rematerialized with it. `checkpoint_name` marks (the `name`
primitive, for `save_only_these_names` policies) keep the value's kind.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from .packed_eval import _PAIR_RULES, _RULES, eval_packed
from .packed_values import V, _bind
from .packed_pairs import tight
from .packed_layout import Layout


def _remat(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  invals = [tight(layout, v) for v in invals]
  n_lay = len(layout.arrays)
  shapes = [(v.kind, v.axis, v.dim, v.axis2) for v in invals]
  kinds: list[tuple[str, int, Any, int]] = []

  def body(*arrays: Any) -> list[Any]:
    inner = Layout(layout.name, arrays[:n_lay], layout.rows, layout.row_length,
                   layout.may_be_empty)
    vs = [V(k, x, a, d, a2) for (k, a, d, a2), x in zip(shapes, arrays[n_lay:], strict=True)]
    outs = [tight(inner, o) for o in eval_packed(eqn.params["jaxpr"], (), vs, inner)]
    kinds[:] = [(o.kind, o.axis, o.dim, o.axis2) for o in outs]
    return [o.val for o in outs]

  checkpointed = jax.checkpoint(body, prevent_cse=eqn.params["prevent_cse"],
                                policy=eqn.params["policy"])
  vals = checkpointed(*layout.arrays, *[v.val for v in invals])
  return [V(k, x, a, d, a2) for (k, a, d, a2), x in zip(kinds, vals, strict=True)]


def _name(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  (v,) = invals
  out, = _bind(eqn, [v.val], layout)
  return [dataclasses.replace(v, val=out)]


# (in both tables: a checkpoint whose operands or results are attention scores
# too, evaluated by the same rule)
for _table in (_RULES, _PAIR_RULES):
  _table.update({"remat2": _remat, "name": _name})
