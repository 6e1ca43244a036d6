"""Control flow: recurse into sub-jaxprs with the same sizes.

Call-like primitives (`jit`, `closed_call` or `eval_jaxpr`, `custom_jvp_call`,
`custom_vjp_call`) are evaluated inline: the masked program is one program
anyway, and the custom derivative rules they carry are not needed here,
because gradients of a masked function come from masking `fun`'s own VJP
(`_masking/mask.py`), traced with JAX's rules in place.

Primitives that must stay primitives (`cond`, `while`, `scan`, `remat`) get
their sub-jaxprs masked (`_masking.core.mask_closed_jaxpr`, cached per padded size),
with the logical sizes passed in as extra leading operands.

A `scan` over a dynamic length runs over the padded length; after the logical
end its carry stops changing (each step selects the old carry once the step
index reaches the logical length). Run in reverse, the padding steps come
first, and the same select keeps the initial carry until the data starts.
"""

from __future__ import annotations

from typing import Any

import jax
from jax import lax

from ... import _jax as jc
from ..core import RuleContext, eval_jaxpr_masked, register


@register("jit")
def _jit(ctx: RuleContext, *args: Any, jaxpr: Any, name: Any=None, **_: Any) -> list[Any]:
  with jax.named_scope(name or "jit"):  # so that errors can say where
    return ctx.eval_jaxpr(jaxpr, *args)


# After JAX 0.11.0 `closed_call` and `call` are one primitive, `eval_jaxpr`,
# with a closed `call_jaxpr` (an older `eval_jaxpr`, with a `jaxpr` param, is
# staged out as `closed_call` and never reaches a jaxpr: it gets no rule).
@register(*(("eval_jaxpr",) if jc.EVAL_JAXPR_IS_THE_CALL else ()))
@register("custom_jvp_call", "custom_vjp_call")
@register("closed_call", optional=True)
def _call(ctx: RuleContext, *args: Any, call_jaxpr: Any, **_: Any) -> list[Any]:
  return ctx.eval_jaxpr(call_jaxpr, *args)


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
  k = len(logical)
  consts, carry, xs = (args[:num_consts], args[num_consts:num_consts + num_carry],
                       args[num_consts + num_carry:])
  padded_length = ctx.padded(length)
  steps = [lax.iota(jc.dim_value_dtype(), padded_length)] if dynamic_length else []
  if "linear" in params:  # not every JAX version has it
    linear = params["linear"]
    params["linear"] = ((False,) * k + tuple(linear[:num_consts + num_carry])
                        + (False,) * len(steps) + tuple(linear[num_consts + num_carry:]))
  params = jc.with_scan_counts(params, num_consts + k, num_carry, len(steps) + len(xs))
  return ctx.bind(*logical, *consts, *carry, *steps, *xs,
                  jaxpr=body, length=padded_length, **params)


def _masked_scan_body(ctx: RuleContext, closed: Any, num_consts: Any, num_carry: Any,
                      length: Any) -> Any:
  env = ctx.env
  dynamic_length = jc.is_symbolic_dim(length)
  key = ("scan", id(closed), env.padded_key(), length)
  hit = env.cache.get(key)
  if hit is not None and hit[0] is closed:
    return hit[1]
  k = len(env.dim_names)
  invars = closed.jaxpr.invars
  logical_aval = jc.shaped((), jc.dim_value_dtype())
  in_avals = ([logical_aval] * k
              + [env.padded_aval(v.aval) for v in invars[:num_consts + num_carry]]
              + ([logical_aval] if dynamic_length else [])
              + [env.padded_aval(v.aval) for v in invars[num_consts + num_carry:]])

  def body(*args: Any) -> Any:
    sub_env = env.with_logical(args[:k], "scan")
    rest = args[k:]
    consts_carry = rest[:num_consts + num_carry]
    carry = rest[num_consts:num_consts + num_carry]
    xs = rest[num_consts + num_carry:]
    if dynamic_length:
      step, xs = xs[0], xs[1:]
    outs = eval_jaxpr_masked(closed.jaxpr, closed.consts, (*consts_carry, *xs), sub_env)
    new_carry, ys = outs[:num_carry], outs[num_carry:]
    if dynamic_length:
      live = step < sub_env.logical(length)
      new_carry = [lax.select(lax.broadcast(live, new.shape), new, old)
                   for new, old in zip(new_carry, carry, strict=True)]
    return [*new_carry, *ys]

  result = jc.make_closed_jaxpr(body, in_avals)
  env.cache[key] = (closed, result)
  return result
