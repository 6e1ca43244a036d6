"""Native differentiation of the masked evaluation: the gate and the tangent masks.

The masked evaluation of a function is made differentiable by JAX itself
(`jax.jvp` of the evaluation; reverse mode transposes it) where that is proven
NaN-safe, so that under `jax.vmap` JAX's batching sees the whole batch before
transposing and a shared parameter's cotangent is accumulated once (one
scatter-add, one contraction over batch and time), as for `jax.grad` of a
`jax.vmap`. Elsewhere the symbolic-derivative path of `calls.py` runs.

Why plain AD of the masked program is unsafe: transposes sum over padding
(of a broadcast into a dynamic axis, of `dot_general`'s free axes, of a
gather), and there a zero cotangent meets a garbage local derivative:
0 * NaN = NaN. In *native mode* (`MaskEnv.native`) the interpreter prevents
both halves of that product for every equation with a dynamic axis:

* LINEAR equations (data movement, sums, selects: their tangent map is the
  same op on tangents, with no coefficient taken from padding) get their
  dynamic inexact outputs wrapped as `select(valid, y, stop_gradient(y))`:
  the value is unchanged (XLA folds `select(p, y, y)`), the tangent is zero in
  the padding, and in reverse the cotangent is zeroed in the padding before
  the producing op's transpose reads it. A transpose then sums finite values
  only, and valid inputs receive exactly the valid outputs' cotangents.
* FILL equations (`dot_general`: its transpose multiplies by the *other
  operand*, whose free-axis padding is garbage) also get their dynamic
  inexact inputs filled with zeros (value and tangent), so that the
  coefficient in the padding is 0, finite. Not where the padding is known
  to be exactly zero already (`native_zeros.py`: zeros, x[i], segment_sum,
  relu/tanh/sums of those); then only the tangent is masked. `x @ w` with a
  shared weight is bound so that its batch is one flat contraction
  (`native_dot.py`), as a hand-flattened batch is.
* ELEMENTWISE equations need nothing: their transposes map padding to
  padding, and the next wrap or fill zeroes it. An operand broadcast into the
  output (`mul x s` with a scalar `s`; JAX's elementwise ops broadcast rank 0
  and size-1 axes) is broadcast explicitly first and wrapped like a LINEAR
  output, so its cotangent sums cleaned values only.
* A gather that promises to be in bounds (`x[i]`) on a dynamic axis: out of
  bounds JAX's JVP of it clamps and its transpose drops, which no single
  linear map does, so it is bound as a linear call (`_Linear`) whose value
  and JVP are the masked gather and whose transpose drops the cotangents of
  starts out of logical bounds (its value and tangent zero in the rows of
  padded indices, so that a dot reading it need not fill them). Such a
  scatter-add is refused.
* Calls (`jit`, `closed_call`) are evaluated inline in native mode; `scan`,
  `remat2` (`jax.checkpoint`: bound again over its body masked in native
  mode, so the gradient program keeps its policy and recomputes what it does
  not save) and `custom_jvp_call` have native forms in `rules/control_flow.py` (the
  scan's steps past the logical length run on a real step's inputs; a custom
  rule is re-emitted as a `jax.custom_jvp` of the masked evaluations). In
  the rule's evaluation a value may be a tangent, which JAX transposes, so
  `wrap` there is `select(valid, t, 0)` (`stop_gradient` has no transpose).
* The function's inputs and outputs are wrapped too: gradients with respect
  to padded inputs are zero in their padding.

A wrap is needed only where the cotangent reaching a value may be nonzero in
the padding; elsewhere its transpose, a select on a cotangent already zero
there, is an identity that still costs a pass over the array (and XLA
computes each masked variant of one cotangent once per consumer). `wrap_plan`
finds, per jaxpr, by one backward pass, which cotangents are *clean* (zero in
the padding): those whose every consumer is a fill (`dot_general`'s operands:
the transpose of `select(valid, x, 0)` is clean), a LINEAR equation (its
outputs are clean, wrapped or not, and a masking rule's valid outputs never
depend on padding, so its transpose sends nothing from them into the padding
of its inputs), or an elementwise equation whose output cotangent is clean and
whose derivative cannot turn 0 into NaN (`add`, `select_n`, `max`: a select or
a finite coefficient; a `custom_jvp` function whose rule is such, as
jax.nn.relu's). Only LINEAR/FILL outputs and broadcast operands whose
cotangent is not clean are wrapped. A sub-jaxpr's outputs are assumed
unclean, and so are the inputs of anything else (calls, scans, checkpoints, `mul`, `exp`,
and a max/min over fixed axes only: JAX's own derivative of it divides by a
count of maxima, 0 in a padding row of NaN).

The gate (`refusal`) admits a traced function when every equation with a
dynamic axis, recursively through calls, scan and checkpoint bodies and custom_jvp rules, is
of one of those kinds, it creates no data-dependent sizes and it calls no
`custom_vjp` function. It returns the reason otherwise, and the symbolic path
runs unchanged.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from . import native_dot as _native_dot
from . import native_zeros as _zeros
from . import scopes as _scopes
from .call_nodes import NodeShell
from .core import eqn_is_symbolic
from .rules.elementwise import ELEMENTWISE

#: Elementwise: padding maps to padding; broadcast operands are made explicit.
_ELEMENTWISE = frozenset(ELEMENTWISE) - {"optimization_barrier", "bitcast_convert_type"}
#: Tangent map = the same data movement, sums or selects on tangents.
_LINEAR = frozenset({
    "broadcast_in_dim", "squeeze", "transpose", "reshape", "expand_dims", "rev",
    "concatenate", "pad", "slice", "dynamic_slice", "dynamic_update_slice", "gather",
    "scatter-add", "scatter_add", "reduce_sum", "cumsum", "iota", "dim_as_value",
    "reduce_max", "reduce_min", "argmax", "argmin", "split", "scan", "remat2",
    "custom_jvp_call", "stack", "unstack"})
#: Transposes multiply by an operand: its padding is zeroed first.
_FILL = frozenset({"dot_general"})
#: Evaluated inline, each equation of theirs wrapped on its own.
_INLINE = frozenset({"jit", "pjit", "closed_call", "eval_jaxpr", "core_call"})
#: Bound again over their body masked in native mode (`jax.checkpoint`'s
#: `remat2` keeps its policy): judged by their body; their inputs unclean.
_BODIES = frozenset({"scan", "remat2"})

_ALL = _ELEMENTWISE | _LINEAR | _FILL | _INLINE

#: What `refusal` found per jaxpr (None: admitted).
_verdicts: "weakref.WeakKeyDictionary[jc.Jaxpr, str | None]" = weakref.WeakKeyDictionary()
_verdicts_no_rules: "weakref.WeakKeyDictionary[jc.Jaxpr, str | None]" = weakref.WeakKeyDictionary()


def inexact(aval: Any) -> bool:
  return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


def tangent_dtype(x: Any) -> Any:
  return x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jax.dtypes.float0


def is_dynamic(aval: Any) -> bool:
  return any(jc.is_symbolic_dim(d) for d in getattr(aval, "shape", ()))


def refusal(traced: Any) -> str | None:
  """Why the native path may not differentiate `traced`, or None if it may."""
  if traced.size_names or getattr(traced, "assumptions", ()):
    return "it creates data-dependent sizes"
  return jaxpr_refusal(traced.jaxpr)


def jaxpr_refusal(jaxpr: jc.Jaxpr, rules: bool = True) -> str | None:
  """Why `jaxpr` may not be evaluated in native mode (None: it may).

  `rules`: also trace and judge the custom_jvp rules in it. A rule's own
  custom_jvp calls (jax.nn.relu's rule calls relu) are judged without theirs:
  those are only traced when a second derivative reaches them, and `step`
  refuses anything unjudged then.
  """
  verdicts = _verdicts if rules else _verdicts_no_rules
  try:
    return verdicts[jaxpr]
  except KeyError:
    pass
  verdict: str | None = None
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "custom_vjp_call":
      verdict = "it calls a jax.custom_vjp function"
    elif name in _INLINE or name in _BODIES:
      verdict = next((r for r in (jaxpr_refusal(j, rules)
                                  for j in jc.subjaxprs_in_params(eqn.params))
                      if r is not None), None)
    elif not eqn_is_symbolic(eqn):
      continue
    elif name == "custom_jvp_call":
      verdict = _custom_jvp_refusal(eqn, rules)
    elif name not in _ELEMENTWISE | _LINEAR | _FILL:
      verdict = f"'{name}' has no native-safe masking rule"
    elif name in ("scatter-add", "scatter_add") and _promises_in_bounds(eqn):
      verdict = (f"a '{name}' in mode PROMISE_IN_BOUNDS indexes a dynamic axis: out "
                 "of bounds, JAX's own derivatives of it drop in forward mode and "
                 "clamp in reverse mode (mode='drop' or mode='clip' is admitted)")
    if verdict is not None:
      break
  verdicts[jaxpr] = verdict
  return verdict


def _promises_in_bounds(eqn: jc.JaxprEqn) -> bool:
  params = eqn.params
  if "PROMISE_IN_BOUNDS" not in str(params.get("mode")):
    return False
  dn = params["dimension_numbers"]
  shape: Any = getattr(eqn.invars[0].aval, "shape")
  if eqn.primitive.name == "gather":
    axes = [*dn.start_index_map, *[d for d, s in enumerate(params["slice_sizes"])
                                   if jc.is_symbolic_dim(s)]]
  else:
    axes = list(dn.scatter_dims_to_operand_dims)
  return any(jc.is_symbolic_dim(shape[d]) for d in axes)


# --- custom_jvp rules, traced symbolically -----------------------------------

_custom_rules: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _custom_jvp_refusal(eqn: jc.JaxprEqn, rules: bool) -> str | None:
  if eqn.params.get("symbolic_zeros"):
    return "it calls a jax.custom_jvp function with symbolic_zeros=True"
  inner = jaxpr_refusal(eqn.params["call_jaxpr"].jaxpr, rules)
  if inner is not None or not rules:
    return inner
  try:
    rule = custom_jvp_rule(eqn)
  except Exception as e:  # (a rule that cannot be traced with symbolic shapes)
    return f"the rule of a jax.custom_jvp function could not be traced: {e}"
  return jaxpr_refusal(rule[0].jaxpr, rules=False)


def custom_jvp_rule(eqn: jc.JaxprEqn) -> tuple[jc.ClosedJaxpr, list[bool]]:
  """The JVP of a `custom_jvp_call` equation with its custom rule, at the
  equation's symbolic avals: (inputs after the consts, tangents of the
  inexact ones) -> (outputs, tangents of those not in the returned zeros)."""
  key = eqn.params["call_jaxpr"]
  hit = _custom_rules.get(key)
  if hit is not None:
    cached: tuple[jc.ClosedJaxpr, list[bool]] = hit
    return cached
  n_consts = eqn.params["num_consts"]
  zeros = [not inexact(v.aval) for v in eqn.invars[n_consts:]]
  # (a size question in the rule is refused, never answered: JAX alone would
  # answer `==` False where it cannot prove sizes equal; refused, the gate
  # sends the function to the symbolic path, which says what it does)
  with _scopes.refusing_questions(True):
    rule = jc.custom_jvp_rule_jaxpr(eqn, zeros)
  _custom_rules[key] = rule
  return rule


# --- where a wrap is needed ---------------------------------------------------

#: Elementwise primitives whose derivative maps a zero tangent to zero whatever
#: their operands hold (a select, a sum, a finite coefficient, or none at all).
_ZERO_PRESERVING = frozenset({
    "add", "add_any", "sub", "neg", "select_n", "max", "min", "clamp", "convert_element_type",
    "copy", "reduce_precision", "real", "imag", "conj", "sign", "floor", "ceil", "round",
    "stop_gradient", "name"})

#: Per equation (by id; the jaxpr keeps it alive): the outputs to wrap
#: (LINEAR, FILL) or the broadcast operands to wrap (ELEMENTWISE).
Plan = dict[int, tuple[bool, ...]]
_plans: "weakref.WeakKeyDictionary[jc.Jaxpr, Plan]" = weakref.WeakKeyDictionary()


def _padded_inexact(v: Any) -> bool:
  return not isinstance(v, jc.Literal) and inexact(v.aval) and is_dynamic(v.aval)


def _broadcast_operand(eqn: jc.JaxprEqn, v: Any) -> bool:
  out_shape: Any = getattr(eqn.outvars[0].aval, "shape")
  return (tuple(v.aval.shape) != tuple(out_shape)
          and not isinstance(v, jc.Literal) and inexact(v.aval))


def _finite_literal(v: Any) -> bool:
  return _zeros.numeric_literal(v) and bool(np.all(np.isfinite(_zeros.literal_value(v))))


def _zero_preserving(eqn: jc.JaxprEqn) -> bool:
  name = eqn.primitive.name
  if name in _ZERO_PRESERVING:
    return True
  if name == "mul":  # by a finite constant
    return sum(not isinstance(v, jc.Literal) for v in eqn.invars) == 1 and any(
        _finite_literal(v) for v in eqn.invars)
  if name == "div":  # by a finite constant, normal (a subnormal may be flushed to 0)
    d = eqn.invars[1]
    return (not isinstance(eqn.invars[0], jc.Literal) and _finite_literal(d)
            and bool(np.all(np.abs(_zeros.literal_value(d)) >= _zeros.smallest_normal(d))))
  if name == "custom_jvp_call":
    return _rule_zero_preserving(eqn)
  return False


def _rule_zero_preserving(eqn: jc.JaxprEqn) -> bool:
  """Whether a custom_jvp function's rule maps zero tangents to zero tangents
  by zero-preserving equations only (jax.nn.relu's select)."""
  try:
    rule, _ = custom_jvp_rule(eqn)
  except Exception:  # (judged by the gate; here only a missed saving)
    return False
  jaxpr = rule.jaxpr
  n_in = len(eqn.invars) - eqn.params["num_consts"]
  tangent = set(jaxpr.invars[n_in:])
  for e in jaxpr.eqns:
    if not any(v in tangent for v in e.invars if not isinstance(v, jc.Literal)):
      continue
    if e.primitive.name == "broadcast_in_dim" or _zero_preserving(e):
      tangent.update(e.outvars)
    else:
      return False
  return True


def _plain_extremum(eqn: jc.JaxprEqn) -> bool:
  """A `reduce_max`/`reduce_min` over fixed axes only: its rule binds JAX's own,
  whose transpose divides by the count of positions equal to the extremum, 0
  in a padding row holding NaN (0/0 = NaN there, and the producer's transpose,
  a broadcast's sum, carries it into a parameter's gradient). Over a dynamic
  axis the rule's own derivative (`rules/reductions.py`) counts valid
  positions only and leaves the padding clean."""
  if eqn.primitive.name not in ("reduce_max", "reduce_min"):
    return False
  shape: Any = getattr(eqn.invars[0].aval, "shape")
  return not any(jc.is_symbolic_dim(shape[a]) for a in eqn.params["axes"])


def wrap_plan(jaxpr: jc.Jaxpr) -> Plan:
  """Which outputs and broadcast operands of `jaxpr`'s symbolic equations
  need a wrap (see the module docstring): one backward pass over `jaxpr`."""
  plan = _plans.get(jaxpr)
  if plan is not None:
    return plan
  plan = {}
  unclean = {v for v in jaxpr.outvars if _padded_inexact(v)}
  for eqn in reversed(jaxpr.eqns):
    if not eqn_is_symbolic(eqn):
      continue  # (no padded value in or out)
    name = eqn.primitive.name
    outs_unclean = any(v in unclean for v in eqn.outvars)
    if name in _ELEMENTWISE:
      passes_unclean = outs_unclean or not _zero_preserving(eqn)
      plan[id(eqn)] = tuple(passes_unclean and _broadcast_operand(eqn, v) for v in eqn.invars)
      if passes_unclean:
        unclean.update(v for v in eqn.invars
                       if _padded_inexact(v) and not _broadcast_operand(eqn, v))
    elif name in _LINEAR or name in _FILL:
      plan[id(eqn)] = tuple(v in unclean for v in eqn.outvars)
      if (name in _BODIES or (name == "custom_jvp_call" and not _rule_zero_preserving(eqn))
          or _plain_extremum(eqn)):
        unclean.update(v for v in eqn.invars if _padded_inexact(v))
    else:  # calls evaluated inline, and anything unjudged
      unclean.update(v for v in eqn.invars if _padded_inexact(v))
  _plans[jaxpr] = plan
  return plan


# --- the masks ---------------------------------------------------------------

def _clean(env: Any) -> dict[int, Any]:
  """The values of this evaluation whose tangent is already zero in the
  padding (outputs of `wrap` and of a fill), by id (the entry keeps the value
  alive, so its id is not reused)."""
  clean: dict[int, Any] | None = getattr(env, "_native_clean", None)
  if clean is None:
    clean = env._native_clean = {}
  return clean


def _mark_clean(env: Any, y: Any) -> Any:
  _clean(env)[id(y)] = y
  return y


def wrap(env: Any, y: Any, aval: Any) -> Any:
  """`y` with its tangent (and cotangent) zeroed in the padding; value unchanged.

  Once per value: wrapping a wrapped or filled value again would give each
  consumer its own masked copy of one cotangent, which XLA then computes
  once per consumer (each a pass over the array)."""
  if not (inexact(aval) and is_dynamic(aval)):
    return y
  if _clean(env).get(id(y)) is y:
    return y
  mask = env.valid_mask(aval)
  if env.native_linear:
    # (in a custom_jvp rule's evaluation `y` may be a tangent, which JAX
    # transposes: `stop_gradient` has no transpose, a select of zeros does,
    # into the cotangent zeroed in the padding; the padding's value is free)
    out = lax.select(mask, y, lax.full_like(y, 0))
    return _zeros.mark(env, _mark_clean(env, out))
  out = _mark_clean(env, lax.select(mask, y, lax.stop_gradient(y)))
  return _zeros.mark(env, out) if _zeros.known(env, y) else out


def step(ctx: Any, rule: Callable[..., list[Any]], invals: Sequence[Any], jaxpr: jc.Jaxpr
         ) -> list[Any]:
  """One symbolic equation of `jaxpr` in native mode: its rule, with the masks
  above where `wrap_plan` says so."""
  eqn, env = ctx.eqn, ctx.env
  name = eqn.primitive.name
  if name not in _ALL:  # (only a second derivative of an unjudged rule gets here)
    raise ctx.error("it has no native-safe masking rule, and a derivative of a "
                    "jax.custom_jvp rule that calls it was taken",
                    "take that derivative outside the masked function, or inside it "
                    "(pj.mask(jax.hessian(f), ...))")
  if name in _INLINE:
    return rule(ctx, *invals, **eqn.params)
  flags = wrap_plan(jaxpr)[id(eqn)]
  if name in _ELEMENTWISE:
    out_aval = eqn.outvars[0].aval
    args = list(invals)
    for i, (v, x, flag) in enumerate(zip(eqn.invars, invals, flags, strict=True)):
      if flag:
        # (an operand broadcast over positions: its cotangent sums them)
        b = jnp.broadcast_to(x, env.padded_shape(out_aval.shape, eqn))
        args[i] = wrap(env, b, jc.shaped(out_aval.shape, v.aval.dtype))
    outs = rule(ctx, *args, **eqn.params)
    if _zeros.outputs(eqn, [_zeros.known(env, x) for x in invals])[0]:
      _zeros.mark(env, outs[0])
    return outs
  if name in _FILL:
    invals = [_operand(env, x, v.aval, eqn) if inexact(v.aval) and is_dynamic(v.aval) else x
              for v, x in zip(eqn.invars, invals, strict=True)]
  promised = name == "gather" and _promises_in_bounds(eqn) and inexact(eqn.invars[0].aval)
  if promised:
    outs = [_promised_gather(ctx, rule, *invals)]
  elif name in _FILL and _native_dot.applies(eqn):  # (its padding zeroed above)
    outs = [_native_dot.bind(eqn, *invals)]
  else:
    outs = rule(ctx, *invals, **eqn.params)
  zero = _zeros.outputs(eqn, [_zeros.known(env, x) for x in invals])
  if promised:  # (`_promised_gather` zeroed its padding, value and tangent)
    zero = [_mark_clean(env, outs[0]) is not None]
  for y, z in zip(outs, zero, strict=True):
    if z:
      _zeros.mark(env, y)
  if name == "concatenate":
    _zeros.record_parts(env, outs[0], invals, eqn)
  return [wrap(env, y, v.aval) if flag else y
          for y, v, flag in zip(outs, eqn.outvars, flags, strict=True)]


def _operand(env: Any, x: Any, aval: Any, eqn: jc.JaxprEqn) -> Any:
  """A dynamic operand of a FILL equation: its padding zeroed, value and
  tangent. Where its padding is known to be zero already (`native_zeros`)
  only the tangent is masked (`wrap`: XLA folds its value away, and in
  reverse its select fuses into the cotangent's consumer), saving a pass.
  A concatenation along a static axis of parts some of which are known
  zero-padded is rebuilt from its parts, only the others filled (XLA does
  not fuse a select into a dot, nor a concatenate into its producers)."""
  if _zeros.known(env, x):
    return wrap(env, x, aval)
  parts = _zeros.parts(env, x)
  if parts is not None and any(_zeros.known(env, p) for p in parts[0]):
    xs, avals, dimension = parts
    out = lax.concatenate([_operand(env, p, a, eqn)
                           for p, a in zip(xs, avals, strict=True)], dimension)
    return _zeros.mark(env, _mark_clean(env, out))
  filled = env.fill_padding(x, aval, np.zeros((), aval.dtype)[()], None, eqn)
  return _zeros.mark(env, _mark_clean(env, filled))


# --- a gather that promises to be in bounds ------------------------------------

def _promised_gather(ctx: Any, rule: Callable[..., list[Any]], operand: Any,
                     indices: Any) -> Any:
  """x[i] on a dynamic axis (PROMISE_IN_BOUNDS). Out of bounds, JAX's own
  derivatives of it disagree: its JVP gathers clamped (as the value does) and
  its transpose drops. The masked gather (the rule, clamped into the logical
  bounds) is bound as a linear call whose transpose drops the cotangents of
  the starts out of logical bounds, so both modes match JAX's."""
  from .rules.indexing import _logical_starts
  eqn, env = ctx.eqn, ctx.env
  params = eqn.params
  dn = params["dimension_numbers"]

  def fwd(t: Any, idx: Any, *logical: Any) -> list[Any]:
    sub = env.with_logical(logical)
    out = rule(type(ctx)(sub, eqn), t, idx, **params)[0]
    # (the rows of padded indices zeroed, so that a dot need not fill them:
    # a select that XLA fuses into the gather)
    return [sub.fill_padding(out, eqn.outvars[0].aval, np.zeros((), out.dtype)[()], None, eqn)]

  def bwd(ct: Any, idx: Any, *logical: Any) -> Any:
    sub = type(ctx)(env.with_logical(logical), eqn)
    # (`_logical_starts` reads the operand's shape only)
    _, _, in_bounds = _logical_starts(sub, jnp.zeros(operand.shape, operand.dtype), idx,
                                      eqn.invars[0].aval.shape, params["slice_sizes"],
                                      dn.start_index_map, clip=False)
    if in_bounds is not None:
      batch = [d for d in range(ct.ndim) if d not in dn.offset_dims]
      ct = lax.select(lax.broadcast_in_dim(in_bounds, ct.shape, batch), ct,
                      jnp.zeros_like(ct))
    t_aval = jax.ShapeDtypeStruct(operand.shape, operand.dtype)  # type: ignore[no-untyped-call, unused-ignore]
    (g,) = jax.linear_transpose(lambda t: fwd(t, idx, *logical)[0], t_aval)(ct)
    return g

  node = _Linear((jc.typeof(operand), jc.typeof(indices), *map(jc.typeof, env.logical_values)),
                 fwd, bwd)
  out: Any = jc.bind_call(node, [operand, indices, *env.logical_values])[0]
  return out


class _Linear(NodeShell):
  """A call node (`_jax/calls.py`) of a map linear in its first argument,
  `fwd(t, *known) -> [out]`, with its own transpose `bwd(ct, *known) -> t`."""

  #: (its maps are gathers and scatters: no LAPACK call to order, `lapack_order.py`)
  calls_no_lapack = True

  def __init__(self, in_avals: tuple[Any, ...], fwd: Callable[..., list[Any]],
               bwd: Callable[..., Any]) -> None:
    super().__init__(in_avals)
    self.fwd, self.bwd = fwd, bwd

  def impl(self, *args: Any) -> list[Any]:
    return self.fwd(*args)

  def jvp(self, primals: list[Any], tangents: list[Any | None]
          ) -> tuple[list[Any], list[Any | None]]:
    outs = jc.bind_call(self, primals)
    if tangents[0] is None:
      return outs, [None]
    return outs, jc.bind_call(self, [tangents[0], *primals[1:]])

  def transpose(self, cts: list[Any], args: list[Any | None]) -> list[Any | None]:
    if args[0] is not None or any(a is None for a in args[1:]):
      raise NotImplementedError("a linear call is linear in its first argument only")
    return [self.bwd(cts[0], *args[1:]), *[None] * (len(args) - 1)]

  def batch(self, dims: tuple[int | None, ...], avals: tuple[Any, ...], axis_size: int,
            axis_name: Any, spmd_axis_name: tuple[Any, ...] | None) -> "_Linear":
    def vmap(f: Callable[..., Any], in_axes: Any) -> Callable[..., Any]:
      return jax.vmap(f, in_axes=in_axes, axis_size=axis_size, axis_name=axis_name,
                      spmd_axis_name=spmd_axis_name)

    def bwd(ct: Any, *known: Any) -> Any:
      g = vmap(self.bwd, (0, *dims[1:]))(ct, *known)
      return g.sum(0) if dims[0] is None else jnp.moveaxis(g, 0, dims[0])

    return _Linear(avals, lambda *a: vmap(self.fwd, dims)(*a), bwd)

