"""The values of the packed interpreter (`packed_eval.py`) and its refusal.

A value of a per-example jaxpr evaluated on packed rows is a `V`: its kind
(SHARED, EXAMPLE, TOKEN, PAIR or UNPACKED: `packed_eval.py`'s docstring says
what each holds), its array, and where its tokens are. `Unpackable` is how any
rule says that an equation cannot be evaluated exactly on the packed layout
(the call then runs unpacked, with a warning naming the primitive and the
user's line). The helpers here read an equation's shapes and bind it on the
packed arrays; they know nothing of the rules.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp

from .. import _jax as jc
from .packed_layout import Layout

TOKEN, EXAMPLE, SHARED, UNPACKED, PAIR = "token", "example", "shared", "unpacked", "pair"


class NoPairRule(Exception):
  """No per-row pair rule for this equation (its values with two axes along
  the example then go one padded row per example)."""


class Unpackable(Exception):
  """An equation the packed layout cannot evaluate exactly (the call then
  runs unpacked): says which primitive, where, and why."""

  def __init__(self, eqn: Any, why: str) -> None:
    self.primitive = eqn.primitive.name if eqn is not None else None
    self.source = jc.source_line(eqn) if eqn is not None else ""
    self.why = why
    super().__init__(_message(self.primitive, self.source, why))

  def called_from(self, call: Any) -> "Unpackable":
    """Where JAX kept no user frame for the equation (inside a library's
    `jax.jit`: `jnp.convolve`), the user's line of the call instead."""
    if self.source.startswith("at ") and self.source != "at an unknown location":
      return self
    outer = Unpackable(call, self.why)
    outer.primitive = self.primitive or outer.primitive
    outer.args = (_message(outer.primitive, outer.source, self.why),)
    return outer


def _message(primitive: str | None, source: str, why: str) -> str:
  """"'cumsum' at f.py:3: why"; without a primitive (a whole output, a
  scan's carry), the source and the reason only, not "'None'"."""
  if primitive is None:
    return f"{source}: {why}" if source else why
  return f"'{primitive}' {source}: {why}"


@dataclasses.dataclass
class V:
  kind: str
  val: Any
  axis: int = -1        # TOKEN: the axis that holds the tokens
  dim: Any = None       # TOKEN: the symbolic size of that axis
  axis2: int = -1       # PAIR: the axis that holds the tokens of each token's row
  # TOKEN/PAIR: made by a select on the valid tokens (pairs), so the tail of its
  # cotangent is zeroed there, whatever its consumers' derivatives on the tail:
  # an op that needs its operand's cotangent guarded skips its own select
  guarded: bool = False
  # PAIR: not zero off the block diagonal (a per-token or shared value
  # broadcast onto pairs, left unselected so that the select fuses into the op
  # that uses it); TOKEN: maybe not zero on the tail (`x @ w`: 0 times an inf
  # in `w` is NaN). Elementwise ops count it as loose as a shared value (their
  # selects make the result zero there), every other rule selects it first
  # (`tight_token`, `packed_pairs.tight`)
  loose: bool = False
  # PAIR, loose: softmax's steps along `axis2` (`packed_pairs._shift`): off the blocks "shifted"
  # (`s - max`) is -inf, "exp" 0, both NaN in rows with no finite maximum (a query's all -inf)
  softmax_step: str = ""


def _token_axis(aval: Any, eqn: Any) -> int | None:
  axes = [a for a, d in enumerate(aval.shape) if jc.is_symbolic_dim(d)]
  if len(axes) > 1:
    raise Unpackable(eqn, f"its result {aval.str_short()} has two axes that vary with "
                     "the example's length (pairs of tokens, such as attention scores), "
                     "which the packed layout does not hold")
  return axes[0] if axes else None


def _n_axes(aval: Any) -> int:
  return sum(jc.is_symbolic_dim(d) for d in getattr(aval, "shape", ()))


def _token_shape(aval: Any, layout: Layout) -> tuple[int, ...]:
  return tuple(layout.tokens if jc.is_symbolic_dim(d) else int(d) for d in aval.shape)


def _subst(value: Any, layout: Layout) -> Any:
  """A param with every symbolic size replaced by the token count."""
  if jc.is_symbolic_dim(value):
    return layout.tokens
  if isinstance(value, (tuple, list)):
    items = [_subst(x, layout) for x in value]
    return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
  return value


def _bind(eqn: Any, args: Sequence[Any], layout: Layout, **params: Any) -> list[Any]:
  prim = eqn.primitive
  params = {k: _subst(v, layout) for k, v in (params or eqn.params).items()}
  out = prim.bind(*args, **prim.get_bind_params(params))
  return list(out) if prim.multiple_results else [out]


def _inexact(x: Any) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.inexact)
