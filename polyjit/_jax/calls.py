"""polyjit's call primitive: a function bound as one equation whose JVP,
transpose and batching polyjit defines (the masked evaluation, `_masking/calls.py`).

The equation's param `node` is an object (hashed by identity) with:

  jaxpr                      ClosedJaxpr of the function at its input avals:
                             abstract evaluation, eager evaluation and lowering
  jvp(primals, tangents)     -> (outs, out tangents); a tangent is None for a
                             symbolic zero, in and out
  transpose(cts, args)       -> a cotangent per argument (None for the known
                             ones); `args` holds None for the linear arguments,
                             `cts` are arrays (symbolic zeros instantiated)
  batch(dims, avals, axis_size, axis_name, spmd_axis_name)
                             -> the node of the function vmapped over `dims`
                             (None: not batched) into output axis 0, with
                             the outer vmap's `spmd_axis_name` (a tuple of
                             mesh axis names, or None)

This is `jax.custom_derivatives.linear_call`'s shape, with the two things it
lacks: a JVP rule for every argument (it asserts zero residual tangents, so
`jax.hessian` = jacfwd(jacrev) fails) and a batching rule (`jax.jacfwd` vmaps).
The rules here only translate JAX's conventions (symbolic zeros, undefined
primals, batch dims) into the node's; what each derivative is, is the node's.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import jax
import numpy as np
from jax._src.interpreters.mlir import ir as _ir  # type: ignore[attr-defined, unused-ignore]
from jax._src import core as _core
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe

from .core import ClosedJaxpr, Primitive
from .float_checks import float_checks, float_checks_off, floats_found


class CallNode(Protocol):
  @property
  def jaxpr(self) -> ClosedJaxpr: ...

  def out_avals(self) -> list[Any] | None:
    """The output avals when known without tracing (else `jaxpr` is traced)."""
    ...

  def jvp(self, primals: list[Any], tangents: list[Any | None]
          ) -> tuple[list[Any], list[Any | None]]: ...

  def transpose(self, cts: list[Any], args: list[Any | None]) -> list[Any | None]: ...

  def batch(self, dims: tuple[int | None, ...], avals: tuple[Any, ...], axis_size: int,
            axis_name: Any, spmd_axis_name: tuple[Any, ...] | None) -> "CallNode": ...


call_p = Primitive("polyjit_masked_call")
call_p.multiple_results = True


def bind_call(node: CallNode, args: Sequence[Any]) -> list[Any]:
  """`node`'s function applied to `args`, as one `polyjit_masked_call` equation."""
  outs: list[Any] = call_p.bind(*args, node=node)  # type: ignore[no-untyped-call, unused-ignore]
  return outs


def _impl(*args: Any, node: CallNode) -> list[Any]:
  closed = node.jaxpr
  nans, infs = float_checks()
  if not (nans or infs):
    outs: list[Any] = _core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
    return outs
  # Eagerly, jax_debug_nans/debug_infs check every primitive's output, the
  # padding's too (a sort rule's NaN fill, log 0 of padding): the call runs
  # with the checks off, and its outputs are checked as a jitted function's
  # are, where the node zeroed their padding (`checks_outputs`).
  with float_checks_off():
    outs = _core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
  found = floats_found(outs, nans, infs) if getattr(node, "checks_outputs", False) else None
  if found is not None:
    raise FloatingPointError(
        f"invalid value ({found}) encountered in the output of a masked function "
        "(its valid region: its padding is zero while these checks are on)")
  return outs


def _abstract_eval(*avals: Any, node: CallNode) -> tuple[list[Any], Any]:
  known = node.out_avals()
  if known is not None:   # (a tangent map, traced only where it is evaluated)
    return known, _core.no_effects
  return list(node.jaxpr.out_avals), node.jaxpr.effects


#: Set by `polyjit._masking.lapack_order` (else None): an object with `wants(node)`,
#: `after(token, args)`, `token_after(token, outs)` and `gives_token(aval)`.
#: Calls it wants are lowered one after another in each block of the program:
#: the inputs of one wait for a token made from the outputs of the previous one.
lowering_order: Any = None
# Per lowering: (block, token) pairs, kept in the module context's dict of
# cached lowerings (the one per-lowering store it has) under this key.
_CHAIN_KEY = ("polyjit_masked_call", "lapack chain")


def set_lowering_order(order: Any) -> None:
  global lowering_order
  lowering_order = order


def _lowerable(closed: Any) -> Any:
  """`closed` with JAX 0.12's hi primitives (`call_hi_primitive`) expanded, as
  `jit`'s lowering expands them (older JAX has none)."""
  if getattr(closed, "is_high", False):
    return _pe.lower_jaxpr2(closed)
  return closed


def _lower(ctx: Any, *args: Any, node: CallNode) -> Any:
  order = lowering_order
  if order is None or not order.wants(node):
    return _mlir.core_call_lowering(ctx, *args, name="polyjit_masked_call",
                                    call_jaxpr=_lowerable(node.jaxpr))
  block = _ir.InsertionPoint.current.block
  chain = ctx.module_context.cached_primitive_lowerings.setdefault(_CHAIN_KEY, [])
  token = next((t for b, t in chain if b == block), None)
  token_aval = _core.ShapedArray((), np.float32)
  if token is not None:
    chained = _mlir.lower_fun(lambda t, *a: order.after(t, a), multiple_results=True)
    args = tuple(chained(ctx.replace(avals_in=[token_aval, *ctx.avals_in],
                                     avals_out=list(ctx.avals_in)), token, *args))
  outs = _mlir.core_call_lowering(ctx, *args, name="polyjit_masked_call",
                                  call_jaxpr=_lowerable(node.jaxpr))
  if not any(order.gives_token(a) for a in ctx.avals_out):
    return outs   # (nothing to wait for: the chain stays as it was)
  if token is None:
    new = _mlir.lower_fun(lambda *o: [order.token_after(None, o)], multiple_results=True)(
        ctx.replace(avals_in=list(ctx.avals_out), avals_out=[token_aval], tokens_out=None), *outs)
  else:
    new = _mlir.lower_fun(lambda t, *o: [order.token_after(t, o)], multiple_results=True)(
        ctx.replace(avals_in=[token_aval, *ctx.avals_out], avals_out=[token_aval],
                    tokens_out=None),
        token, *outs)
  chain[:] = [(b, t) for b, t in chain if b != block] + [(block, new[0])]
  return outs


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], *, node: CallNode
         ) -> tuple[list[Any], list[Any]]:
  ts = [None if isinstance(t, _ad.Zero) else t for t in tangents]  # type: ignore[attr-defined, unused-ignore]
  if all(t is None for t in ts):
    outs = bind_call(node, primals)
    touts: list[Any | None] = [None] * len(outs)
  else:
    outs, touts = node.jvp(list(primals), ts)
  return outs, [
      _ad.Zero(_core.typeof(o).to_tangent_aval()) if t is None else t  # type: ignore[attr-defined, unused-ignore]
      for o, t in zip(outs, touts, strict=True)]


def _transpose(cts: Sequence[Any], *args: Any, node: CallNode) -> list[Any]:
  dense = [_ad.instantiate_zeros(ct) for ct in cts]  # type: ignore[no-untyped-call, unused-ignore]
  known = [None if _ad.is_undefined_primal(a) else a for a in args]  # type: ignore[no-untyped-call, unused-ignore]
  return node.transpose(dense, known)


def _batch(axis_data: Any, args: Sequence[Any], dims: Sequence[Any], *, node: CallNode
           ) -> tuple[list[Any], list[int | None]]:
  dims_ = tuple(None if d is None else int(d) for d in dims)
  if all(d is None for d in dims_):   # (JAX asks even when nothing is batched)
    outs = bind_call(node, args)
    return outs, [None] * len(outs)
  avals = tuple(_core.typeof(a) for a in args)
  # (`spmd_name`: the outer `jax.vmap`'s spmd_axis_name, passed on to the inner
  # one so that sharding and varying-axis types inside see it as well)
  batched = node.batch(dims_, avals, axis_data.size, axis_data.name, axis_data.spmd_name)
  outs = bind_call(batched, args)
  return outs, [0 for _ in outs]


call_p.def_impl(_impl)  # type: ignore[no-untyped-call, unused-ignore]
call_p.def_effectful_abstract_eval(_abstract_eval)  # type: ignore[no-untyped-call, unused-ignore]
_mlir.register_lowering(call_p, _lower, cacheable=False)
_ad.primitive_jvps[call_p] = _jvp
_ad.primitive_transposes[call_p] = _transpose
_batching.fancy_primitive_batchers[call_p] = _batch

