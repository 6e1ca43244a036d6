"""`lax.scan` over the example's axis, on packed rows (a rule of `packed_eval.py`).

One scan runs over the positions of every row at once (`row_length` steps,
`rows` wide), the carry restarted from its initial value at each example's
first token (its last, in reverse), and each example's final carry is read
at its last token. Tail steps see the inputs of their row's first step, so
their derivatives are as finite as a real step's, and their outputs are
discarded.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking.core import jaxpr_is_symbolic
from .packed_eval import EXAMPLE, SHARED, TOKEN, Unpackable, V, _RULES, eval_packed, is_read
from .packed_layout import Layout


def _scan(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """`lax.scan` over the example's axis: one scan over the positions of every
  row at once, the carry restarted from its initial value at each example's
  first token (its last, in reverse), each example's final carry read at its
  last token. A step on the tail runs on the inputs of its row's first step
  (the same values a real step sees, so its derivative is as finite as the
  example's own), and its outputs are discarded."""
  p = eqn.params
  nc, nk = jc.scan_counts(p)   # (named in params up to JAX 0.11, in `ft_in` after)
  consts, init, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]
  body = p["jaxpr"]
  if not layout.is_base(p["length"]) or jaxpr_is_symbolic(body.jaxpr):
    raise Unpackable(eqn, "a scan whose length is not the example's, or whose step "
                     "depends on the length")
  if any(v.kind not in (SHARED, EXAMPLE) for v in [*consts, *init]) or any(
      v.kind != TOKEN or v.axis != 0 or not layout.is_base(v.dim) for v in xs):
    raise Unpackable(eqn, "a scan that reads whole per-token values in each step")
  if not xs:
    raise Unpackable(eqn, "a scan with no per-token inputs")
  rows, length, tokens = layout.rows, layout.row_length, layout.tokens
  valid = layout.valid(xs[0].dim)
  first = (jnp.arange(tokens, dtype=np.int32) // length) * length   # its row's first token
  owner = jnp.where(valid, layout.segments, layout.segments[first])
  # a row all tail (the row count's bucket adds them) steps as example 0 does:
  # an out-of-range take would fill its carry with NaN, and NaN times the zero
  # cotangent there is NaN in the shared parameters' gradient
  owner = jnp.where(owner < layout.examples, owner, 0)
  own_length = jnp.take(layout.lengths, owner)
  edge = (layout.positions == 0) if not p["reverse"] else (layout.positions == own_length - 1)
  restart = edge | ~valid

  def per_token(v: V) -> Any:     # a per-example or shared value at each token
    if v.kind == EXAMPLE:
      return jnp.take(v.val, owner, axis=0)
    return jnp.broadcast_to(v.val, (tokens, *np.shape(v.val)))

  def pick(mask: Any, a: Any, b: Any) -> Any:
    return lax.select(lax.broadcast_in_dim(mask, a.shape, (0,)), a, b)

  safe_xs = [pick(valid, x.val, jnp.take(x.val, first, axis=0)) for x in xs]
  step_consts = [per_token(v) for v in consts if v.kind == EXAMPLE]
  # a per-example initial carry streams in at each token; a shared one (the
  # usual zeros) is a constant of the step
  init_tokens = [per_token(v) for v in init if v.kind == EXAMPLE]
  init_shared = [v.val for v in init if v.kind == SHARED]
  shared = [v.val for v in consts if v.kind == SHARED]
  kinds = [v.kind for v in consts]
  # the final carries stack every step's carry (read at each example's last
  # token): only where the function uses them
  finals_used = any(is_read(v) for v in eqn.outvars[:nk])

  def by_step(x: Any) -> Any:     # (tokens, ...) -> (row_length, rows, ...)
    return jnp.swapaxes(x.reshape(rows, length, *x.shape[1:]), 0, 1)

  def by_token(x: Any) -> Any:    # the inverse
    return jnp.swapaxes(x, 0, 1).reshape(tokens, *x.shape[2:])

  def run_body(c_shared: list[Any], c_example: list[Any], carry: list[Any],
               x: list[Any]) -> list[Any]:
    ex, sh = iter(c_example), iter(c_shared)
    cs = [next(ex) if k == EXAMPLE else next(sh) for k in kinds]
    args = [V(SHARED, a) for a in [*cs, *carry, *x]]
    return [o.val for o in eval_packed(body.jaxpr, body.consts, args, layout)]

  def step(carry: list[Any], inputs: Any) -> tuple[list[Any], Any]:
    flag, streamed, x, c_example = inputs
    streams, constants = iter(streamed), iter(init_shared)
    starts = [next(streams) if v.kind == EXAMPLE
              else jnp.broadcast_to(next(constants), c.shape) for v, c in
              zip(init, carry, strict=True)]
    carry = [pick(flag, s, c) for s, c in zip(starts, carry, strict=True)]
    outs = jax.vmap(run_body, in_axes=(None, 0, 0, 0))(shared, c_example, carry, x)
    return outs[:nk], (outs[:nk] if finals_used else [], outs[nk:])

  c0 = [jnp.zeros((rows, *np.shape(v.val)[1 if v.kind == EXAMPLE else 0:]),
                  jnp.result_type(v.val)) for v in init]
  _, (carries, ys) = lax.scan(
      step, c0, (by_step(restart), [by_step(i) for i in init_tokens],
                 [by_step(x) for x in safe_xs], [by_step(c) for c in step_consts]),
      reverse=p["reverse"])
  last = layout.starts if p["reverse"] else layout.starts + layout.lengths - 1
  finals = ([V(EXAMPLE, jnp.take(by_token(c), last, axis=0)) for c in carries]
            if finals_used else [V(EXAMPLE, None) for _ in init])   # (dropped: never read)
  outs = [V(TOKEN, layout.select(by_token(y), 0, xs[0].dim), 0, xs[0].dim, guarded=True)
          for y in ys]
  return [*finals, *outs]


_RULES["scan"] = _scan
