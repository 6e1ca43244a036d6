"""`lax.scan` over the example's axis, on packed rows (a rule of `packed_eval.py`).

One scan runs over the positions of every row at once (`row_length` steps,
`rows` wide), the carry restarted from its initial value at each example's
first token (its last, in reverse), and each example's final carry is read
at its last token. A tail step is the first step of an example with tokens
(the initial carry and that example's first token, its last in reverse), a
step the example takes itself, so its derivatives are as finite as that
example's, and its outputs are discarded.

The step is the user's step and nothing more: the inputs stream in
time-major with the tail's source token already selected in (one pass per
input outside the loop, its transpose fused in), and the outputs' tail is
zeroed time-major after it, where a select in the step costs a select, a
stacked residual and its mask at every step. The source token is held off
the derivative (a tail step's cotangent is 0 times finite derivatives), so
the backward pass scatters nothing back onto the tokens.

A step may read a per-token value whole, one token at a time (`x[i]` in a
`fori_loop(0, n, ...)`, any index: `x[n - 1 - i]`, `x[i // 2]`), and use
the length as a value: each row's step is evaluated for its example
(`_eval_step`), `x[i]` reading that example's token from the packed rows
(a gather, its index clamped to the example's tokens as JAX clamps it).
Any other use of the whole value in a step (`jnp.max(x)`) raises
`Unpackable`.

A scan of a fixed number of steps whose carries or consts hold per-token
values (`jnp.searchsorted`'s bisection of every token at once) is a
`lax.scan` of the packed evaluation of its body (`_scan_of_fixed_length`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking.core import eqn_is_symbolic, jaxpr_is_symbolic
from .packed_eval import _RULES, eval_packed, is_read, tight_token
from .packed_values import EXAMPLE, SHARED, TOKEN, Unpackable, V
from .packed_layout import Layout


def _scan(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """`lax.scan` over the example's axis: one scan over the positions of every
  row at once, the carry restarted from its initial value at each example's
  first token (its last, in reverse), each example's final carry read at its
  last token. A step on the tail runs as the first step of an example with
  tokens (the same values that example's first step sees, so its derivative
  is as finite as the example's own), and its outputs are discarded."""
  p = eqn.params
  nc, nk = jc.scan_counts(p)   # (named in params up to JAX 0.11, in `ft_in` after)
  consts, init, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]
  body = p["jaxpr"]
  if not jc.is_symbolic_dim(p["length"]):
    return _scan_of_fixed_length(eqn, invals, layout)
  if not layout.is_base(p["length"]):
    raise Unpackable(eqn, "a scan whose length is not the example's")
  if any(v.kind not in (SHARED, EXAMPLE) for v in init) or any(
      v.kind not in (SHARED, EXAMPLE) and not (v.kind == TOKEN and v.axis == 0)
      for v in consts) or any(
      v.kind != TOKEN or v.axis != 0 or not layout.is_base(v.dim) for v in xs):
    raise Unpackable(eqn, "a scan that reads whole per-token values in each step")
  symbolic = jaxpr_is_symbolic(body.jaxpr)   # (it reads `x[i]`, or the length)
  if not xs:
    raise Unpackable(eqn, "a scan with no per-token inputs")
  rows, length, tokens = layout.rows, layout.row_length, layout.tokens
  valid = layout.valid(xs[0].dim)
  # a tail step runs as the first step of an example that has tokens (its
  # row's first one; in a row all tail, which the row count's bucket adds, the
  # first non-empty example): the initial carry and the inputs at that
  # example's first token (its last, in reverse), a step the example takes
  # itself, so that its derivatives are as finite as that example's. (Another
  # step, on the tail's zeros or on the first token in reverse, may have an
  # infinite derivative, `sqrt(|c + x|)` at 0, and 0 times it is NaN in the
  # shared parameters' gradient and in that token's.)
  row_first = jnp.arange(rows, dtype=np.int32) * length
  row_owner = layout.segments[row_first]   # (its first example starts there)
  row_real = row_owner < layout.examples
  donor = jnp.argmax(layout.lengths > 0)
  row_owner = jnp.where(row_real, row_owner, donor)
  owner_length = layout.lengths[row_owner]   # (rows,)
  if p["reverse"]:
    source = jnp.where(row_real, row_first, layout.starts[donor]) + owner_length - 1
  else:
    source = jnp.where(row_real, row_first, layout.starts[donor])
  source = jnp.clip(source, 0, tokens - 1)   # (every example empty: any token)
  if p["reverse"]:   # (a tail token restarts whatever its edge)
    own_length = jnp.take(layout.lengths, layout.segments, mode="fill", fill_value=0)
    edge = layout.positions == own_length - 1
  else:
    edge = layout.positions == 0
  restart = edge | ~valid

  def by_step(x: Any) -> Any:     # (tokens, ...) -> (row_length, rows, ...)
    return jnp.swapaxes(x.reshape(rows, length, *x.shape[1:]), 0, 1)

  def by_token(x: Any) -> Any:    # the inverse
    return jnp.swapaxes(x, 0, 1).reshape(tokens, *x.shape[2:])

  def pick(mask: Any, a: Any, b: Any) -> Any:   # `mask` on a's leading axes
    return lax.select(lax.broadcast_in_dim(mask, a.shape, tuple(range(mask.ndim))), a, b)

  # each token's example, a tail token its row's source example's (only where
  # a per-example value streams in, or a step reads `x[i]` or the length)
  owner = None
  if symbolic or any(v.kind == EXAMPLE for v in [*consts, *init]):
    owner = jnp.where(valid, layout.segments, jnp.broadcast_to(
        row_owner[:, None], (rows, length)).reshape(tokens))

  def per_token(v: V) -> Any:     # a per-example or shared value at each token
    # (a tail step may run as an empty example: with a non-empty one's values,
    # `Layout.off_empty`, and a NaN there reaches no derivative)
    if v.kind == EXAMPLE:
      assert owner is not None   # (built above whenever a value is per example)
      return jnp.take(layout.off_empty(v.val), owner, axis=0)
    return jnp.broadcast_to(layout.off_all_empty(v.val), (tokens, *np.shape(v.val)))

  # the inputs stream time-major with each row's source token on its tail:
  # selected there (one pass per input, the transpose fused in), where a
  # select in the step costs a select, a stacked residual and its mask at
  # every step. The source token takes no cotangent from the tail (the tail
  # step's outputs are discarded and the next step restarts the carry: 0
  # times its finite derivatives), so it is held off the derivative: no
  # scatter of zeros back onto it
  step_valid = by_step(valid)     # (row_length, rows)

  def streamed(x: Any) -> Any:
    at = lax.stop_gradient(jnp.take(x, source, axis=0))   # (rows, ...)
    return pick(step_valid, by_step(x), jnp.broadcast_to(at, (length, *at.shape)))

  step_consts = [per_token(v) for v in consts if v.kind == EXAMPLE]
  # a per-example initial carry streams in at each token; a shared one (the
  # usual zeros) is a constant of the step
  init_tokens = [per_token(v) for v in init if v.kind == EXAMPLE]
  init_shared = [layout.off_all_empty(v.val) for v in init if v.kind == SHARED]
  shared = [layout.off_all_empty(v.val) for v in consts if v.kind == SHARED]
  rows_read = [v for v in consts if v.kind == TOKEN]   # read whole: `x[i]`
  kinds = [v.kind for v in consts]
  # the final carries stack every step's carry (read at each example's last
  # token): only where the function uses them
  finals_used = any(is_read(v) for v in eqn.outvars[:nk])

  def run_body(c_shared: list[Any], c_example: list[Any], carry: list[Any],
               x: list[Any], who: Any) -> list[Any]:
    ex, sh, whole = iter(c_example), iter(c_shared), iter(rows_read)
    cs = [next(ex) if k == EXAMPLE else _Whole(next(whole), who) if k == TOKEN
          else next(sh) for k in kinds]
    if symbolic:
      return _eval_step(body.jaxpr, body.consts, [*cs, *carry, *x], layout.fresh(), who)
    args = [V(SHARED, a) for a in [*cs, *carry, *x]]
    return [o.val for o in eval_packed(body.jaxpr, body.consts, args, layout)]

  def step(carry: list[Any], inputs: Any) -> tuple[list[Any], Any]:
    flag, streamed, x, c_example, who = inputs
    streams, constants = iter(streamed), iter(init_shared)
    starts = [next(streams) if v.kind == EXAMPLE
              else jnp.broadcast_to(next(constants), c.shape) for v, c in
              zip(init, carry, strict=True)]
    carry = [pick(flag, s, c) for s, c in zip(starts, carry, strict=True)]
    outs = jax.vmap(run_body, in_axes=(None, 0, 0, 0, 0 if symbolic else None))(
        shared, c_example, carry, x, who)
    return outs[:nk], (outs[:nk] if finals_used else [], outs[nk:])

  # (a row all tail steps as a non-empty example does, `owner`: an empty
  # one's length 0 in a step that reads `x[i]` has no token to read)
  who = by_step(owner) if symbolic else None
  c0 = [jnp.zeros((rows, *np.shape(v.val)[1 if v.kind == EXAMPLE else 0:]),
                  jnp.result_type(v.val)) for v in init]
  _, (carries, ys) = lax.scan(
      step, c0, (by_step(restart), [by_step(i) for i in init_tokens],
                 [streamed(x.val) for x in xs], [by_step(c) for c in step_consts], who),
      reverse=p["reverse"])
  last = layout.starts if p["reverse"] else layout.starts + layout.lengths - 1
  finals = [V(EXAMPLE, None) for _ in init]   # (dropped: never read)
  if finals_used:
    lasts = [jnp.take(by_token(c), last, axis=0) for c in carries]
    if layout.may_be_empty:   # no step: the initial carry (as `fun` gives at size 0)
      empty = layout.empty()
      lasts = [lax.select(lax.broadcast_in_dim(empty, f.shape, (0,)),
                          jnp.broadcast_to(i.val, f.shape).astype(f.dtype), f)
               for f, i in zip(lasts, init, strict=True)]
    finals = [V(EXAMPLE, f) for f in lasts]
  # the outputs' tail set to 0 time-major, before the transpose back: its
  # transpose, the cotangent's, then ends in the select and streams in as
  # it is made (with the transpose last, XLA lays it out as a bitcast and
  # copies it again before the loop)
  outs = [V(TOKEN, by_token(pick(step_valid, y, lax.full_like(y, 0))), 0, xs[0].dim,
            guarded=True) for y in ys]
  return [*finals, *outs]


def _scan_of_fixed_length(eqn: Any, invals: list[V], layout: Layout) -> list[V]:
  """A scan of a fixed number of steps whose carry or consts hold per-token
  values (`jnp.searchsorted`'s bisection of every token at once, inside
  `jnp.histogram`): `lax.scan` of the packed evaluation of its body, each
  step exact by the tail invariant. A carry that a step makes per-example or
  per-token (a shared initial value plus a token's) starts in that kind."""
  p = eqn.params
  nc, nk = jc.scan_counts(p)
  consts, init, xs = invals[:nc], list(invals[nc:nc + nk]), invals[nc + nk:]
  if any(v.kind not in (SHARED, EXAMPLE, TOKEN) for v in invals) or any(
      v.kind != SHARED for v in xs):
    raise Unpackable(eqn, "a scan of a fixed length over per-token or per-example inputs")
  body = p["jaxpr"]
  length = int(p["length"])

  def one_step(carry: list[V], x: list[Any]) -> list[V]:
    args = [*consts, *carry, *[V(SHARED, a) for a in x]]
    inner = layout.fresh()
    # a carry or output goes on as an array (its V's flags stay behind): a
    # loose one (`x @ w`, maybe not zero on the tail) is selected first
    return [tight_token(inner, o) for o in eval_packed(body.jaxpr, body.consts, args, inner)]

  def shape_of(v: V) -> tuple[Any, ...]:
    return (v.kind, v.axis, str(v.dim)) if v.kind == TOKEN else (v.kind,)

  x0 = [jax.tree.map(lambda a: a[0], v.val) for v in xs]
  for _ in range(3):   # the carries' kinds: widened until a step keeps them
    kinds = _kinds_of_step(one_step, init, x0)
    if [shape_of(v) for v in kinds] == [shape_of(v) for v in init]:
      break
    init = [_widened(v, k, layout) for v, k in zip(init, kinds, strict=True)]
  else:
    raise Unpackable(eqn, "a scan whose carry changes kind from step to step")
  meta = [(v.kind, v.axis, v.dim) for v in init]

  def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
    vs = [V(k, a, ax, d) for (k, ax, d), a in zip(meta, carry, strict=True)]
    outs = one_step(vs, x)
    if [shape_of(o) for o in outs[:nk]] != [shape_of(v) for v in init]:
      raise Unpackable(eqn, "a scan whose carry changes kind from step to step")
    ys_kinds[:] = [(o.kind, o.axis, o.dim) for o in outs[nk:]]
    return [o.val for o in outs[:nk]], [o.val for o in outs[nk:]]

  ys_kinds: list[tuple[str, int, Any]] = []
  finals, ys = lax.scan(step, [v.val for v in init], [v.val for v in xs], length=length,
                        reverse=p["reverse"])
  out = [V(k, a, ax, d) for (k, ax, d), a in zip(meta, finals, strict=True)]
  for (k, ax, d), y in zip(ys_kinds, ys, strict=True):
    if k == TOKEN:
      out.append(V(TOKEN, y, ax + 1, d))
    elif k == EXAMPLE:
      out.append(V(EXAMPLE, jnp.moveaxis(y, 1, 0)))
    else:
      out.append(V(SHARED, y))
  return out


def _kinds_of_step(one_step: Any, init: list[V], x0: list[Any]) -> list[V]:
  """The kinds of a step's carries (traced abstractly: nothing is computed)."""
  found: list[V] = []

  def trace(c: list[Any]) -> list[Any]:
    outs = one_step([V(v.kind, a, v.axis, v.dim) for v, a in zip(init, c, strict=True)], x0)
    found[:] = outs[:len(init)]
    return [o.val for o in found]

  jax.eval_shape(trace, [v.val for v in init])
  return found


def _widened(v: V, like: V, layout: Layout) -> V:
  """Carry `v` in the kind a step gives it (`like`): a shared value per
  example, or a shared or per-example value on each token."""
  if v.kind == like.kind:
    return v
  if like.kind == EXAMPLE and v.kind == SHARED:
    return V(EXAMPLE, jnp.broadcast_to(v.val, (layout.examples, *jnp.shape(v.val))))
  if like.kind == TOKEN and v.kind in (SHARED, EXAMPLE) and like.axis == 0:
    val = v.val if v.kind == EXAMPLE else jnp.broadcast_to(
        v.val, (layout.examples, *jnp.shape(v.val)))
    return V(TOKEN, layout.onto_tokens(val, like.dim), 0, like.dim)
  raise Unpackable(None, "a scan whose carry changes kind from step to step")


class _Whole:
  """A per-token value that a step reads whole (`x[i]`): the example's
  tokens of the step's example `who`, read one at a time."""

  def __init__(self, v: V, who: Any) -> None:
    self.v, self.who = v, who


def _eval_step(jaxpr: Any, consts: Any, args: list[Any], layout: Layout, who: Any
               ) -> list[Any]:
  """One step of a scan whose body reads a per-token value whole, for the
  step's example `who` (under `jax.vmap` over the rows): `x[i]` (a
  `dynamic_slice` of one token, its start clamped to the example's tokens, as
  JAX clamps it) reads that token of the packed value, and the length is the
  example's; any other use of the whole value, or of the length, raises
  `Unpackable`. The read is a gather of the tokens, exact in JAX's derivative."""
  env: dict[Any, Any] = {}

  def read(v: Any) -> Any:
    return v.val if isinstance(v, jc.Literal) else env[v]

  for v, x in zip(jaxpr.constvars, consts, strict=True):
    env[v] = x
  for v, x in zip(jaxpr.invars, args, strict=True):
    env[v] = x
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    with jc.eqn_context(eqn):
      if any(isinstance(x, _Whole) for x in ins):
        outs = [_read_token(eqn, ins, layout)]
      elif name == "dim_as_value":
        value = jnp.take(layout.value(eqn.params["dim"]), who)
        outs = [lax.convert_element_type(value, eqn.outvars[0].aval.dtype)]
      elif eqn_is_symbolic(eqn):
        raise Unpackable(eqn, "a scan step that uses the example's length other than "
                         "as a value or by reading one token (x[i])")
      else:
        prim = eqn.primitive
        out = prim.bind(*ins, **prim.get_bind_params(eqn.params))
        outs = list(out) if prim.multiple_results else [out]
    for v, o in zip(eqn.outvars, outs, strict=True):
      if not jc.is_dropvar(v):
        env[v] = o
  outs = [read(v) for v in jaxpr.outvars]
  if any(isinstance(o, _Whole) for o in outs):
    raise Unpackable(None, "a scan step that outputs a whole per-token value")
  return outs


def _read_token(eqn: Any, ins: list[Any], layout: Layout) -> Any:
  """`x[i]` of a value read whole: one token of the step's example."""
  whole, *starts = ins
  sizes = eqn.params.get("slice_sizes")
  if (eqn.primitive.name != "dynamic_slice" or not isinstance(whole, _Whole)
      or any(isinstance(x, _Whole) for x in starts) or int(sizes[0]) != 1
      or len(starts) != len(sizes)):
    raise Unpackable(eqn, "a scan step that uses a whole per-token value other than "
                     "by reading one token (x[i])")
  v, who = whole.v, whole.who
  size = jnp.take(layout.size(v.dim), who)
  at = jnp.clip(starts[0].astype(np.int32), 0, jnp.maximum(size - 1, 0))
  token = jnp.take(layout.starts, who) + at
  rest = [s.astype(np.int32) for s in starts[1:]]
  return lax.dynamic_slice(v.val, [token, *rest], [1, *[int(z) for z in sizes[1:]]])


_RULES["scan"] = _scan
