"""`jax.checkpoint` (the `remat2` primitive) on packed rows.

The checkpointed function is evaluated packed inside a `jax.checkpoint` of
its own, with the equation's policy and `prevent_cse`, so that
rematerialisation keeps its meaning (what is saved for the backward pass
and what is recomputed) over the packed batch: the same values, and the
memory the user asked for. Its operands and the layout's arrays go in as
arguments (the layout is rebuilt inside, as `packed_custom.py` rebuilds it
for a derivative rule: a value derived outside would be a residual the
policy did not choose); values go in and out zero on the tail (a loose
value is selected: the values carry no flags across the call). An
`Unpackable` inside is raised while `pj.vmap` traces (`jax.checkpoint`
traces its function at once), so the call falls back to the unpacked run.
"""

from __future__ import annotations

from typing import Any

import jax

from .packed_eval import _RULES, eval_packed
from .packed_layout import Layout
from .packed_pairs import tight
from .packed_values import Unpackable, V


def _remat(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  invals = [tight(layout, v) for v in invals]
  shapes = [(v.kind, v.axis, v.dim, v.axis2) for v in invals]
  n_lay = len(layout.arrays)
  kinds: list[tuple[str, int, Any, int]] = []

  def packed(*arrays: Any) -> list[Any]:
    inner = Layout(layout.name, arrays[:n_lay], layout.rows, layout.row_length,
                   layout.may_be_empty)
    vs = [V(k, x, a, d, a2) for (k, a, d, a2), x in zip(shapes, arrays[n_lay:], strict=True)]
    outs = [tight(inner, o) for o in eval_packed(eqn.params["jaxpr"], (), vs, inner)]
    kinds[:] = [(o.kind, o.axis, o.dim, o.axis2) for o in outs]
    return [o.val for o in outs]

  run = jax.checkpoint(packed, prevent_cse=eqn.params["prevent_cse"],
                       policy=eqn.params["policy"])
  try:
    vals = run(*layout.arrays, *[v.val for v in invals])
  except Unpackable as e:
    raise e.called_from(eqn) from None
  return [V(k, x, a, d, a2) for (k, a, d, a2), x in zip(kinds, vals, strict=True)]


_RULES["remat2"] = _remat
