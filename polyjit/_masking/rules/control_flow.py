"""Control flow: recurse into sub-jaxprs with the same sizes.

Call-like primitives (`jit`, `closed_call` or `eval_jaxpr`, `custom_jvp_call`,
`custom_vjp_call`) are evaluated inline: the masked program is one program
anyway, and on the symbolic derivative path the custom derivative rules they
carry are not needed here, because gradients come from masking `fun`'s own
VJP (`_masking/mask.py`), traced with JAX's rules in place. In native mode
(`_masking/native.py`: JAX differentiates the masked evaluation itself) a
`custom_jvp_call` is re-emitted as a `jax.custom_jvp` whose function is the
masked evaluation of its `call_jaxpr` and whose rule is the masked
evaluation of its JVP traced with the custom rule in place, so jax.nn.relu's
derivative at 0 (and any numerically safe rule) stays the one JAX uses; the
native gate refuses `custom_vjp_call`.

Primitives that must stay primitives (`cond`, `while`, `scan`, `remat`) get
their sub-jaxprs masked (`_masking.core.mask_closed_jaxpr`, cached per padded size),
with the logical sizes passed in as extra leading operands.

A `scan` over a dynamic length runs over the padded length; after the logical
end its carry stops changing (each step selects the old carry once the step
index reaches the logical length). Run in reverse, the padding steps come
first, and the same select keeps the initial carry until the data starts. In
native mode those frozen steps run on the inputs of the first real step (the
initial carry and the slices at index 0, or n - 1 in reverse), held constant:
their cotangents are zero and their local derivatives are a real step's,
finite, where garbage slices would give 0 * NaN in the cotangents of the
consts (the weights) and of the carry. Gating the consts instead
(`where(active, w, stop_gradient(w))`) would make every shared weight a
per-example value under `jax.vmap`, the cost native mode exists to avoid.

What the backward pass of a scan reads per step is what JAX's partial
evaluation stacks in the forward one, so the masking adds as little as a
hand-written mask: the first slices are put in the padding of `xs` by one
select before the loop (`xs` is forwarded, not stacked; a select per step
would stack the selected slice), and every select in the body of one shape
shares one predicate (each distinct predicate is a stacked boolean residual,
and a pass per step forward and backward). `tests/test_scan_step_residuals.py`
counts them against a hand-masked LSTM.

A length that can be 0 while every dimension is >= 1 (`n - 1`, a scan over
`x[1:]` or `jnp.diff(x)`) has no real step to copy when it is 0: its frozen
steps run on zeros, where a body's derivative may be infinite (`w / dt`),
and the consts' cotangents, which sum every step's, would get 0 * inf = NaN.
Such a scan (only such: the interval of its length reaches 0) takes its
inexact consts as `where(length > 0, c, stop_gradient(c))`, once before the
loop: no step of an empty scan sends them a cotangent. Under `jax.vmap`
that makes those consts per example, a cost paid only where a length can be
0. A scan whose padded length is 0 runs no step and needs no fill.

A real step's local derivative can itself be infinite (`jnp.sqrt(w + x_t)`
where `x_0 = -w`): JAX's gradient is then inf, and a frozen step rerunning
that step would add 0 * inf = NaN to the consts' cotangent. So in the body
of a native scan, the inexact inputs of each equation whose derivative may
be unbounded at finite arguments (`_SINGULAR`: sqrt, log, div, pow, ...;
a call, a nested loop or a custom_jvp function that may hold one) pass
through `where(live, u, stop_gradient(u))`: the frozen steps' zero
cotangent stays 0 past it. The select is on the value that meets the
singular derivative, per step and of its shape (under `jax.vmap` per
example where it is computed from the data anyway), not on the consts,
which stay shared; a body without such an equation (an LSTM: tanh,
logistic, mul, dot) gets none.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _jax as jc
from ..core import RuleContext, eval_jaxpr_masked, register
from .. import dims as _dims, native as _native, native_zeros as _zeros


@register("jit")
def _jit(ctx: RuleContext, *args: Any, jaxpr: Any, name: Any=None, **_: Any) -> list[Any]:
  with jax.named_scope(name or "jit"):  # so that errors can say where
    return ctx.eval_jaxpr(jaxpr, *args)


# After JAX 0.11.0 `closed_call` and `call` are one primitive, `eval_jaxpr`,
# with a closed `call_jaxpr` (an older `eval_jaxpr`, with a `jaxpr` param, is
# staged out as `closed_call` and never reaches a jaxpr: it gets no rule).
@register(*(("eval_jaxpr",) if jc.EVAL_JAXPR_IS_THE_CALL else ()))
@register("custom_vjp_call")
@register("closed_call", optional=True)
def _call(ctx: RuleContext, *args: Any, call_jaxpr: Any, **_: Any) -> list[Any]:
  return ctx.eval_jaxpr(call_jaxpr, *args)


# JAX 0.12's `call_hi_primitive` (searchsorted, nonzero, ... bound as one
# equation): its expansion in ordinary primitives, traced at the equation's
# symbolic avals and evaluated masked like a `jit`.
@register(*(("call_hi_primitive",) if jc.NUMPY_BINDS_HI_PRIMITIVES else ()))
def _hi_primitive(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
  expansion = jc.make_closed_jaxpr(jc.hi_primitive_expansion(params), list(ctx.in_avals))
  return ctx.eval_jaxpr(expansion, *args)


@register("custom_jvp_call")
def _custom_jvp_call(ctx: RuleContext, *args: Any, call_jaxpr: Any, **_: Any) -> list[Any]:
  if ctx.env.native is None:
    return ctx.eval_jaxpr(call_jaxpr, *args)
  # Native mode: JAX differentiates this evaluation, so the custom rule must
  # stay the derivative (jax.nn.relu's at 0, a numerically safe rule): a
  # jax.custom_jvp whose function is the masked evaluation of `call_jaxpr` and
  # whose rule is the masked evaluation of the JVP traced with the custom rule
  # in place (`native.custom_jvp_rule`). The logical sizes are its (integer)
  # arguments, so that nothing it evaluates is closed over.
  rule, out_zeros = _native.custom_jvp_rule(ctx.eqn)
  env = ctx.env
  k = len(env.dim_names)
  n_consts = ctx.eqn.params["num_consts"]
  n_out = len(ctx.eqn.outvars)
  diff_in = [i for i, v in enumerate(ctx.eqn.invars[n_consts:]) if _native.inexact(v.aval)]

  @jax.custom_jvp
  def masked(*flat: Any) -> list[Any]:
    return ctx.eval_jaxpr_with(call_jaxpr, flat[:k], *flat[k:])

  def masked_jvp(primals: Any, tangents: Any) -> tuple[list[Any], list[Any]]:
    logical, xs = primals[:k], primals[k + n_consts:]
    ts = [tangents[k + n_consts + i] for i in diff_in]
    sub = env.with_logical(logical)
    sub.native_linear = True  # (`native.wrap`: its tangents are transposed)
    both = eval_jaxpr_masked(rule.jaxpr, rule.consts, [*xs, *ts], sub)
    outs, nz = list(both[:n_out]), iter(both[n_out:])
    touts = [jnp.zeros(jnp.shape(o), _native.tangent_dtype(o)) if z else next(nz)
             for o, z in zip(outs, out_zeros, strict=True)]
    return outs, touts

  masked.defjvp(masked_jvp)
  return list(masked(*env.logical_values, *args))


@register("call", optional=True)
def _open_call(ctx: RuleContext, *args: Any, call_jaxpr: Any, **_: Any) -> list[Any]:
  return eval_jaxpr_masked(call_jaxpr, (), args, ctx.env)


@register("remat2")
def _remat(ctx: RuleContext, *args: Any, jaxpr: Any, **params: Any) -> list[Any]:
  masked = ctx.mask_jaxpr(jc.ClosedJaxpr(jaxpr, ()))
  open_jaxpr = jc.convert_constvars_jaxpr(masked.jaxpr)
  return ctx.bind(*masked.consts, *ctx.logical_operands(), *args,
                  jaxpr=open_jaxpr, **params)


@register("cond")
def _cond(ctx: RuleContext, index: Any, *operands: Any, branches: Any, **params: Any) -> list[Any]:
  masked = tuple(ctx.mask_jaxpr(b) for b in branches)
  return ctx.bind(index, *ctx.logical_operands(), *operands,
                  branches=masked, **params)


@register("while")
def _while(ctx: RuleContext, *args: Any, cond_jaxpr: Any, body_jaxpr: Any, cond_nconsts: Any,
           body_nconsts: Any, **params: Any) -> list[Any]:
  cond_consts = args[:cond_nconsts]
  body_consts = args[cond_nconsts:cond_nconsts + body_nconsts]
  carry = args[cond_nconsts + body_nconsts:]
  logical = ctx.logical_operands()
  k = len(logical)
  return ctx.bind(*logical, *cond_consts, *logical, *body_consts, *carry,
                  cond_jaxpr=ctx.mask_jaxpr(cond_jaxpr),
                  body_jaxpr=ctx.mask_jaxpr(body_jaxpr),
                  cond_nconsts=cond_nconsts + k, body_nconsts=body_nconsts + k,
                  **params)


@register("scan")
def _scan(ctx: RuleContext, *args: Any, jaxpr: Any, length: Any, **params: Any) -> list[Any]:
  num_consts, num_carry = jc.scan_counts(params)
  dynamic_length = jc.is_symbolic_dim(length)
  body = _masked_scan_body(ctx, jaxpr, num_consts, num_carry, length)
  logical = ctx.logical_operands()
  consts, carry = list(args[:num_consts]), args[num_consts:num_consts + num_carry]
  xs = list(args[num_consts + num_carry:])
  real: list[Any] = []
  if ctx.env.native is not None and dynamic_length:
    # Native mode: the steps past the logical length run on the initial
    # carry (passed to the body as consts) and on the first real step's
    # slices, put in the padding of `xs` here (see `_masked_scan_body`).
    real = list(carry)
    xs = _first_slices_in_padding(ctx, xs, length, params.get("reverse", False))
    consts = _held_where_empty(ctx, consts, length)
  k = len(logical) + len(real)
  padded_length = ctx.padded(length)
  steps = [lax.iota(jc.dim_value_dtype(), padded_length)] if dynamic_length else []
  if "linear" in params:  # not every JAX version has it
    linear = params["linear"]
    params["linear"] = ((False,) * k + tuple(linear[:num_consts + num_carry])
                        + (False,) * len(steps) + tuple(linear[num_consts + num_carry:]))
  params = jc.with_scan_counts(params, num_consts + k, num_carry, len(steps) + len(xs))
  return ctx.bind(*logical, *real, *consts, *carry, *steps, *xs,
                  jaxpr=body, length=padded_length, **params)


def _first_slices_in_padding(ctx: RuleContext, xs: list[Any], length: Any, reverse: bool
                             ) -> list[Any]:
  """`xs` whose padding holds the slices of the first step that runs on data
  (index 0, n - 1 in reverse; zeros when the length is 0), held constant
  (no cotangent flows to them from there). One select over each `xs` before
  the loop: a select of each slice in the body would cost a pass per step,
  and the selected slice, which the transposes of the step read, would be
  stacked as a residual per step, where JAX forwards `xs` itself."""
  n = ctx.logical(length)
  index = lax.max(n - 1, jnp.zeros_like(n))
  filled = []
  for x in xs:
    if x.shape[0] == 0:   # a padded length of 0: no step runs, nothing to fill
      filled.append(x)
      continue
    # (forward, a static slice: no gather per example under vmap)
    first = (lax.dynamic_index_in_dim(x, index, 0, keepdims=True) if reverse
             else lax.slice_in_dim(x, 0, 1))
    first = lax.select(lax.broadcast(n > 0, first.shape), first, jnp.zeros_like(first))
    live = lax.broadcast_in_dim(lax.iota(n.dtype, x.shape[0]) < n, x.shape, (0,))
    filled.append(lax.select(live, x, lax.stop_gradient(jnp.broadcast_to(first, x.shape))))
  return filled


def _held_where_empty(ctx: RuleContext, consts: Any, length: Any) -> list[Any]:
  """`consts`, their inexact ones held constant where the logical `length` is
  0, if it can be (see the module docstring): an empty scan's frozen steps
  run on zeros, and nothing bounds their derivatives there."""
  lowest = _dims.dim_lower_bound(length, ctx.env.padded_env)
  if lowest is not None and lowest >= 1:
    return list(consts)
  some = ctx.logical(length) > 0
  return [lax.select(lax.broadcast(some, jnp.shape(c)), c, lax.stop_gradient(c))
          if _native.inexact(jc.typeof(c)) else c for c in consts]


def _masked_scan_body(ctx: RuleContext, closed: Any, num_consts: Any, num_carry: Any,
                      length: Any) -> Any:
  env = ctx.env
  dynamic_length = jc.is_symbolic_dim(length)
  native = env.native is not None and dynamic_length
  key = ("scan", id(closed), env.padded_key(), length, env.native is not None)
  hit = env.cache.get(key)
  if hit is not None and hit[0] is closed:
    return hit[1]
  k = len(env.dim_names)
  invars = closed.jaxpr.invars
  logical_aval = jc.shaped((), jc.dim_value_dtype())
  real_avals = ([env.padded_aval(v.aval) for v in invars[num_consts:num_consts + num_carry]]
                if native else [])
  in_avals = ([logical_aval] * k + real_avals
              + [env.padded_aval(v.aval) for v in invars[:num_consts + num_carry]]
              + ([logical_aval] if dynamic_length else [])
              + [env.padded_aval(v.aval) for v in invars[num_consts + num_carry:]])

  def body(*args: Any) -> Any:
    sub_env = env.with_logical(args[:k], "scan")
    real, rest = args[k:k + len(real_avals)], args[k + len(real_avals):]
    consts = rest[:num_consts]
    carry = rest[num_consts:num_consts + num_carry]
    xs = rest[num_consts + num_carry:]
    # One broadcast of `live` per shape, shared by every select of that
    # shape: the predicate of a select is what its transpose reads, so JAX
    # stacks one residual per distinct predicate, per step.
    live: Any = None
    if dynamic_length:
      step, xs = xs[0], xs[1:]
      live = step < sub_env.logical(length)
    masks: dict[tuple[int, ...], Any] = {}

    def live_as(shape: tuple[int, ...]) -> Any:
      if shape not in masks:
        masks[shape] = lax.broadcast(live, shape)
      return masks[shape]

    carry_in = list(carry)
    if native:
      sub_env.gate_inputs = lambda eqn, invals: _gate_singular(eqn, invals, live_as)
      # A step past the logical length runs on a real step's inputs instead
      # (the initial carry here; the slices of the first step were put in
      # the padding of `xs` before the loop), held constant: its outputs
      # are dropped and its cotangents are zero, and its local derivatives
      # are those of a step that ran on data, finite, so 0 * derivative is
      # 0 where garbage would give 0 * NaN in the consts' and the carry's
      # cotangents.
      carry_in = [lax.select(live_as(x.shape), x, lax.stop_gradient(r))
                  for x, r in zip(carry, real, strict=True)]
    outs = eval_jaxpr_masked(closed.jaxpr, closed.consts, (*consts, *carry_in, *xs), sub_env)
    new_carry, ys = outs[:num_carry], outs[num_carry:]
    if dynamic_length:
      new_carry = [lax.select(live_as(new.shape), new, old)
                   for new, old in zip(new_carry, carry, strict=True)]
    return [*new_carry, *ys]

  result = jc.make_closed_jaxpr(body, in_avals)
  env.cache[key] = (closed, result)
  return result


#: Elementwise primitives whose derivative may be infinite (or 0/0) at finite
#: arguments with a finite value (sqrt at 0, log at 0, 1/x at 0, asin at 1, a
#: pole of lgamma). Not among them: +, *, tanh, logistic, exp, sin, select,
#: max, ... (a derivative that is finite wherever the step's values are).
_SINGULAR = frozenset({
    "sqrt", "rsqrt", "cbrt", "log", "log1p", "div", "pow", "acos", "asin", "atanh",
    "acosh", "atan2", "tan", "erf_inv", "lgamma", "digamma", "polygamma", "igamma",
    "igammac", "igamma_grad_a", "random_gamma_grad", "regularized_incomplete_beta",
    "zeta", "rem"})

_singular_jaxprs: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _singular(eqn: Any) -> bool:
  """Whether `eqn`'s derivative may be unbounded at finite arguments."""
  name = eqn.primitive.name
  if name == "integer_pow":
    return bool(eqn.params["y"] < 0)
  if name == "div":   # (by a nonzero constant: bounded)
    d = eqn.invars[1]
    return not (isinstance(d, jc.Literal) and bool(np.all(_zeros.literal_value(d) != 0)))
  if name in _SINGULAR:
    return True
  if name == "custom_jvp_call":   # (its rule is what differentiates it)
    return not _native._rule_zero_preserving(eqn)
  return any(_singular_jaxpr(j) for j in jc.subjaxprs_in_params(eqn.params))


def _singular_jaxpr(jaxpr: Any) -> bool:
  hit = _singular_jaxprs.get(jaxpr)
  if hit is None:
    hit = _singular_jaxprs[jaxpr] = any(_singular(e) for e in jaxpr.eqns)
  return hit


def _gate_singular(eqn: Any, invals: list[Any], live_as: Any) -> list[Any]:
  """`invals` of one equation in a native scan's body: where its derivative
  may be unbounded, its inexact inputs as `where(live, u, stop_gradient(u))`
  (see the module docstring)."""
  if not _singular(eqn):
    return invals
  return [lax.select(live_as(jnp.shape(x)), x, lax.stop_gradient(x))
          if not isinstance(v, jc.Literal) and _native.inexact(v.aval) else x
          for v, x in zip(eqn.invars, invals, strict=True)]
