"""`jax.checkpoint` (remat) on packed rows (a rule of `packed_eval.py`).

A checkpointed function (`jax.checkpoint`, Flax's `nn.remat`, a layer of a
model that rematerializes its blocks) is evaluated packed inside a
`jax.checkpoint` of its own, with the equation's policy and `prevent_cse`:
the packed evaluation is what JAX saves or recomputes, so the model keeps
both its packing and its memory plan (it ran unpacked with a warning: a
model with remat lost packing's savings whole). Values cross the boundary
as arrays, zero on the tail: the kinds go in and come out as static facts
read while JAX traces the function once (a loose value is selected first,
as for a `jax.custom_jvp` rule, so no flag needs to cross), and the rows'
layout arrays are arguments of the checkpointed function, rebuilt inside
(a value derived outside would be a residual the policy did not choose).
`remat2` is a call (`packed_eval._CALLS`): attention scores may cross its
boundary. `jax.checkpoint` traces its function at once, so an `Unpackable`
inside is raised while `pj.vmap` traces and the call runs unpacked.
`checkpoint_name` marks are elementwise (`_masking/rules/elementwise.py`).
"""

from __future__ import annotations

from typing import Any

import jax

from .packed_custom import rebuilt
from .packed_eval import _RULES, eval_packed
from .packed_layout import Layout
from .packed_pairs import tight
from .packed_values import Unpackable, V


def _remat(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  invals = [tight(layout, v) for v in invals]
  shapes = [(v.kind, v.axis, v.dim, v.axis2) for v in invals]
  kinds: list[tuple[str, int, Any, int]] = []

  def body(*arrays: Any) -> list[Any]:
    inner, vs = rebuilt(layout, shapes, arrays)
    outs = [tight(inner, o) for o in eval_packed(eqn.params["jaxpr"], (), vs, inner)]
    kinds[:] = [(o.kind, o.axis, o.dim, o.axis2) for o in outs]
    return [o.val for o in outs]

  checkpointed = jax.checkpoint(body, prevent_cse=eqn.params["prevent_cse"],
                                policy=eqn.params["policy"])
  try:
    vals = checkpointed(*layout.arrays, *[v.val for v in invals])
  except Unpackable as e:
    raise e.called_from(eqn) from None
  return [V(k, x, a, d, a2) for (k, a, d, a2), x in zip(kinds, vals, strict=True)]


_RULES["remat2"] = _remat
