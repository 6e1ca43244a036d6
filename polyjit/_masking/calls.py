"""The masked evaluation as one primitive equation, differentiable both ways.

A masked function is bound as one `polyjit_masked_call` equation (`_jax/calls.py`)
whose `node` says what the function is and what its derivatives are. Three
kinds of node:

  Call(traced)   the masked evaluation of `traced` on (inputs, logical sizes).
  Lin(traced)    its tangent map: the masked evaluation of `jax.jvp(fun)`
                 traced symbolically (`SymbolicTrace.jvp`), on (inputs, residuals,
                 input tangents, logical sizes); linear in the tangents.
  Batched(node)  `jax.vmap` of another node's evaluation (pj.vmap, jax.jacfwd).

Derivatives take one of two paths.

Native (`native.py`), wherever its gate admits `traced` (every equation with
a dynamic axis of a kind proven safe, recursively; no data-dependent size; no
custom_vjp): the JVP of Call(traced) is `jax.jvp` of the masked evaluation in
native mode, which masks tangents at the equations' outputs (and zeroes the
padding of `dot_general`'s operands), so that no transpose meets 0 * NaN. Only
the inputs with tangents are differentiated; the others are closed over. Under
`jax.vmap` (pj.vmap, Batched) JAX differentiates the batched evaluation, as
`jax.grad` of a `jax.vmap`, and transposes its tangent ops like any others: the
cotangent of an unbatched input is accumulated once for the whole batch (one
scatter-add into an embedding table, one contraction over batch and time for a
weight matrix), where the symbolic path below transposes each example and sums
per-example cotangents. Higher derivatives are JAX's own of those ops.

Symbolic, for everything else, by the same rule as the gradient in
`_masking/mask.py` (never let JAX differentiate or transpose the ops the
interpreter emitted; always mask a symbolically traced derivative instead):

  JVP of Call(traced)      primal: Call(traced) (or Call(split forward), which
                           returns the VJP's residuals too); tangent: Lin(traced).
  transpose of Lin(traced) the masked VJP: Call(split backward) on the residuals,
                           or Call(traced.vjp()) on the inputs; padding of the
                           gradients set to zero. This is the gradient reverse
                           mode has always used: `jax.grad` is JVP then transpose.
  JVP of Lin(traced)       the JVP of Call(traced.jvp()): the tangent map is a
                           masked function like any other (so jacfwd(jacrev) and
                           higher orders recurse). The residuals are functions of
                           the inputs that Lin's evaluation does not read, so
                           their tangents do not enter.
  transpose of Call        only for `jax.linear_transpose` of a linear function:
                           its VJP at zero.
  Batched(node)            each rule is `jax.vmap` of `node`'s rule (for a
                           transpose: the inner per-example transpose, vmapped,
                           then summed over the batch for unbatched inputs).
                           Except a native JVP: JAX differentiates the batched
                           native evaluation, as it does `jax.vmap(f)` under
                           `jax.grad` (`_native_fun`: batching rules run on
                           values, never on tangents JAX will transpose).

Forward mode is safe on the symbolic path for the same reason the backward
pass is: the tangent computation is a traced jaxpr (JVP rules are forward ops)
that the masking rules evaluate, filling padding before anything mixes
positions.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from .call_nodes import NodeShell
from .core import MaskEnv, eval_jaxpr_masked
from .data_dependent import extra_outputs
from .errors import PerformanceWarning, warn_user_code
from . import native as _native
from .trace import SymbolicTrace


def _inexact(aval: Any) -> bool:
  return bool(jnp.issubdtype(aval.dtype, jnp.inexact))


def _avals(args: Sequence[Any]) -> tuple[Any, ...]:
  return tuple(jc.typeof(a) for a in args)


def _zeros_like(x: Any) -> Any:
  aval = jc.typeof(x)
  return jnp.zeros(aval.shape, aval.dtype)


class Node(NodeShell):
  """A function of a fixed list of arrays; see the module docstring."""

  def __init__(self, in_avals: tuple[Any, ...]) -> None:
    super().__init__(in_avals)
    self._batched: dict[Any, Node] = {}

  def batch(self, dims: tuple[int | None, ...], avals: tuple[Any, ...], axis_size: int,
            axis_name: Any, spmd_axis_name: tuple[Any, ...] | None) -> "Node":
    key = (dims, avals, axis_size, axis_name, spmd_axis_name)
    node = self._batched.get(key)
    if node is None:
      node = self._batched[key] = Batched(self, dims, avals, axis_size, axis_name,
                                          spmd_axis_name)
    return node


def _masked_eval(traced: "SymbolicTrace", padded: dict[str, int], inputs: Sequence[Any],
                 logical: Sequence[Any]) -> list[Any]:
  env = MaskEnv(traced.dim_names, padded, logical, traced.cache)
  outs: list[Any] = eval_jaxpr_masked(traced.jaxpr, (), list(inputs), env)
  return _checked_outputs(env, outs, traced.out_avals) + extra_outputs(env, traced)


def _checked_outputs(env: MaskEnv, outs: list[Any], avals: Sequence[Any]) -> list[Any]:
  """While jax_debug_nans/debug_infs is on (when traced), the outputs' padding
  zeroed: those flags check every output whole, and must see only what the
  user's program computes (`_jax/float_checks.py`). (A node traced with the
  flags off is another node: `_node`.)"""
  if not any(jc.float_checks()):
    return outs
  return [env.fill_padding(y, a, np.zeros((), a.dtype)[()])
          if _inexact(a) and any(jc.is_symbolic_dim(d) for d in a.shape) else y
          for y, a in zip(outs, avals, strict=True)]


def _native_eval(traced: "SymbolicTrace", padded: dict[str, int], inputs: Sequence[Any],
                 logical: Sequence[Any], live: Sequence[int]) -> list[Any]:
  """The masked evaluation in native mode (`native.py`), for JAX to differentiate:
  the inputs with tangents (`live`) and the outputs wrapped, so tangents are
  zero in their padding (the other inputs have none to mask)."""
  env = MaskEnv(traced.dim_names, padded, logical, traced.cache)
  env.native = _native.step
  inputs = list(inputs)
  for i in live:
    inputs[i] = _native.wrap(env, inputs[i], traced.in_avals[i])
  outs = eval_jaxpr_masked(traced.jaxpr, (), inputs, env)
  outs = _checked_outputs(env, outs, traced.out_avals)
  return [_native.wrap(env, y, a) for y, a in zip(outs, traced.out_avals, strict=True)]


def _node(kind: type, traced: "SymbolicTrace", padded: dict[str, int], args: Sequence[Any],
          *extra: Any) -> Any:
  """The node of `kind` for `traced` at these padded sizes and argument avals
  (one per key, so that JAX's caches see the same param)."""
  avals = _avals(args)
  checks = jc.float_checks()  # (`_checked_outputs`)
  key = (kind, tuple(sorted(padded.items())), avals, extra, checks)
  node = traced.nodes.get(key)
  if node is None:
    node = traced.nodes[key] = kind(traced, padded, avals, *extra)
  return node


def call(traced: "SymbolicTrace", padded: dict[str, int], inputs: Sequence[Any],
         logical: Sequence[Any]) -> list[Any]:
  """The masked evaluation of `traced` (consts included in `inputs`)."""
  args = [*inputs, *logical]
  return jc.bind_call(_node(Call, traced, padded, args), args)


def call_traced(traced: "SymbolicTrace", padded: dict[str, int], args: Sequence[Any],
                logical: Sequence[Any]) -> list[Any]:
  """`call` with `traced`'s consts put first."""
  return call(traced, padded, [*traced.consts, *args], logical)


class Call(Node):
  #: (its outputs' padding is zero while jax_debug_nans/infs is on: `_checked_outputs`)
  checks_outputs = True

  def __init__(self, traced: "SymbolicTrace", padded: dict[str, int], in_avals: tuple[Any, ...]
               ) -> None:
    super().__init__(in_avals)
    self.traced = traced
    self.padded = padded
    self.n_in = len(traced.in_avals)

  def impl(self, *args: Any) -> list[Any]:
    return _masked_eval(self.traced, self.padded, args[:self.n_in], args[self.n_in:])

  def jvp(self, primals: list[Any], tangents: list[Any | None]
          ) -> tuple[list[Any], list[Any | None]]:
    traced, padded = self.traced, self.padded
    inputs, logical = primals[:self.n_in], primals[self.n_in:]
    diff_in, diff_out = traced.diff_in, traced.diff_out
    if all(tangents[i] is None for i in diff_in) or not diff_out:
      outs = jc.bind_call(self, primals)
      return outs, [None] * len(outs)
    if _native.refusal(traced) is None:
      return self._native_jvp(inputs, logical, tangents)
    split = traced.split_vjp()
    if split is not None:   # the residuals the gradient will need, computed now
      both = call_traced(split.fwd, padded, inputs, logical)
      n = len(traced.out_avals)
      outs, res = both[:n], both[n:]
    else:
      outs, res = jc.bind_call(self, primals), []
    ts = [_zeros_like(inputs[i]) if tangents[i] is None else tangents[i] for i in diff_in]
    args = [*inputs, *res, *ts, *logical]
    # (the tangents' avals are the outputs': reverse mode never traces the
    # tangent map, which a custom_vjp inside `fun` could not give)
    t_avals = tuple(jc.shaped(jc.typeof(outs[j]).shape, jc.typeof(outs[j]).dtype)
                    for j in diff_out)
    touts = jc.bind_call(_node(Lin, traced, padded, args, len(res), t_avals), args)
    out_tangents: list[Any | None] = [None] * len(outs)
    for j, t in zip(diff_out, touts, strict=True):
      out_tangents[j] = t
    return outs, out_tangents

  def _native_jvp(self, inputs: list[Any], logical: list[Any], tangents: list[Any | None]
                  ) -> tuple[list[Any], list[Any | None]]:
    live = [i for i in self.traced.diff_in if tangents[i] is not None]
    made = _native_fun(self, live)
    assert made is not None   # (the caller checked the gate and the tangents)
    return _jvp_of(made, [*inputs, *logical], tangents)

  def transpose(self, cts: list[Any], args: list[Any | None]) -> list[Any | None]:
    # Only a linear function is transposed whole (`jax.linear_transpose`):
    # its transpose is its VJP at any point, here zero.
    traced = self.traced
    inputs = [_zeros_like_aval(a) if x is None else x
              for x, a in zip(args[:self.n_in], self.in_avals[:self.n_in], strict=True)]
    logical = args[self.n_in:]
    if any(x is None for x in logical):
      raise TypeError("the logical sizes of a masked function are not linear inputs")
    diff_out = traced.diff_out
    grads = _masked_vjp(traced, self.padded, inputs, [cts[j] for j in diff_out], logical, [])
    out: list[Any | None] = [None] * len(args)
    for i, g in grads.items():
      if args[i] is None:
        out[i] = g
    return out


def _zeros_like_aval(aval: Any) -> Any:
  return jnp.zeros(aval.shape, aval.dtype)


def _masked_vjp(traced: "SymbolicTrace", padded: dict[str, int], inputs: Sequence[Any],
                cts: Sequence[Any], logical: Sequence[Any], res: Sequence[Any]
                ) -> dict[int, Any]:
  """The gradients of `traced`'s differentiable inputs (by index) for the
  cotangents of its differentiable outputs: the masked evaluation of its VJP
  (from the residuals `res` when the forward pass was split), padding zero."""
  if res:
    split = traced.split_vjp()
    assert split is not None
    diff_in = split.diff_in
    outs = call_traced(split.bwd, padded, [*res, *cts], logical)
  else:
    vjp = traced.vjp()
    diff_in = vjp.diff_in
    outs = call_traced(vjp.traced, padded, [*inputs, *cts], logical)
  env = MaskEnv(traced.dim_names, padded, logical)
  # (a VJP that creates data-dependent sizes returns them after the gradients)
  return {i: env.fill_padding(g, traced.in_avals[i], np.zeros((), g.dtype)[()])
          for i, g in zip(diff_in, outs[:len(diff_in)], strict=True)}


def _native_fun(node: Node, live: Sequence[int]) -> tuple[Any, list[int]] | None:
  """(`node`'s function of the list of all its arguments in native mode, the
  arguments of `live` it differentiates) for JAX to differentiate; None
  where `node` is not (a batch of) a Call whose evaluation the native gate
  admits, or where no live argument is differentiable. (A Lin's JVP is a
  Call's of its tangent map, which holds the function's own equations, the
  one the gate refused among them: not native either.)

  A Batched node's function is `jax.vmap` of its inner node's, so that JAX
  batches the evaluation first and differentiates the batched program, the
  order of `jax.grad(jax.vmap(f))`. The other order, the inner node's JVP
  rule vmapped, would run JAX's batching rules on tangents, which JAX's own
  transforms never do to a tangent map they transpose: a `cond` on a
  per-example predicate is batched into selects whose unselected side is
  `stop_gradient(t)`, an op on the tangent with no transpose rule, and
  `jax.grad` of the batch raised."""
  if isinstance(node, Batched):
    made = _native_fun(node.inner, live)
    if made is None:
      return None
    inner, used = made
    vmapped = node._vmap(inner, (list(node.dims),))
    return (lambda args: vmapped(list(args))), used
  if isinstance(node, Call):
    return _call_fun(node.traced, node.padded, live)
  return None


def _call_fun(traced: "SymbolicTrace", padded: dict[str, int], live: Sequence[int]
              ) -> tuple[Any, list[int]] | None:
  """`_native_fun` of Call(traced) at `padded`."""
  used = [i for i in traced.diff_in if i in live]
  if not used or not traced.diff_out or _native.refusal(traced) is not None:
    return None
  n_in = len(traced.in_avals)
  return (lambda args: _native_eval(traced, padded, args[:n_in], args[n_in:], used)), used


def _jvp_of(made: tuple[Any, list[int]], primals: Sequence[Any], tangents: Sequence[Any | None]
            ) -> tuple[list[Any], list[Any | None]]:
  """JAX's JVP of a `_native_fun` with respect to the arguments it
  differentiates; the others are closed over, no zeros made for them (shared
  parameters held fixed). Under `jax.vmap` its tangent ops are batched
  primitives, transposed with the whole batch in view: the cotangent of a
  shared parameter is accumulated once for the batch."""
  fun, live = made

  def of_live(*values: Any) -> list[Any]:
    full = list(primals)
    for i, v in zip(live, values, strict=True):
      full[i] = v
    out: list[Any] = fun(full)
    return out

  outs, touts = jax.jvp(of_live, [primals[i] for i in live], [tangents[i] for i in live])
  return list(outs), [t if _inexact(jc.typeof(o)) else None
                      for o, t in zip(outs, touts, strict=True)]


class Lin(Node):
  def __init__(self, traced: "SymbolicTrace", padded: dict[str, int], in_avals: tuple[Any, ...],
               n_res: int, t_avals: tuple[Any, ...] | None = None) -> None:
    super().__init__(in_avals)
    self.t_avals = t_avals
    self.traced = traced
    self.padded = padded
    self.n_in = len(traced.in_avals)
    self.n_res = n_res
    self.diff_in = traced.diff_in
    self.n_out = len(traced.diff_out)

  def out_avals(self) -> list[Any] | None:
    return None if self.t_avals is None else list(self.t_avals)

  def _split(self, args: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    a, b, c = self.n_in, self.n_in + self.n_res, self.n_in + self.n_res + len(self.diff_in)
    return list(args[:a]), list(args[a:b]), list(args[b:c]), list(args[c:])

  def impl(self, *args: Any) -> list[Any]:
    inputs, _, ts, logical = self._split(args)
    tangent_map = self.traced.jvp()
    outs = _masked_eval(tangent_map, self.padded, [*tangent_map.consts, *inputs, *ts],
                        logical)
    # (a function with data-dependent sizes: the tangents are shaped by the
    # sizes the primal evaluation creates and returns, the same ones)
    return outs[:self.n_out]

  def jvp(self, primals: list[Any], tangents: list[Any | None]
          ) -> tuple[list[Any], list[Any | None]]:
    inputs, _, ts, logical = self._split(primals)
    d_inputs, _, d_ts, d_logical = self._split(tangents)
    tangent_map = self.traced.jvp()
    consts = list(tangent_map.consts)
    args = [*consts, *inputs, *ts, *logical]
    node: Call = _node(Call, tangent_map, self.padded, args)
    outs, touts = node.jvp(args, [*[None] * len(consts), *d_inputs, *d_ts, *d_logical])
    return outs[:self.n_out], touts[:self.n_out]

  def transpose(self, cts: list[Any], args: list[Any | None]) -> list[Any | None]:
    inputs, res, ts, logical = self._split(args)
    if any(x is None for x in [*inputs, *res, *logical]):
      raise NotImplementedError(
          "polyjit's masked tangent map is linear in the tangents only")
    grads = _masked_vjp(self.traced, self.padded, inputs, cts, logical, res)
    # (a tangent that is known, a zero JAX instantiated, needs no cotangent)
    return [*[None] * (self.n_in + self.n_res),
            *[grads[i] if t is None else None for i, t in zip(self.diff_in, ts, strict=True)],
            *[None] * len(logical)]


class Batched(Node):
  def __init__(self, inner: Node, dims: tuple[int | None, ...], in_avals: tuple[Any, ...],
               axis_size: int, axis_name: Any, spmd_axis_name: tuple[Any, ...] | None) -> None:
    super().__init__(in_avals)
    self.inner = inner
    self.dims = dims
    self.axis_size = axis_size
    self.axis_name = axis_name
    self.spmd_axis_name = spmd_axis_name
    self.checks_outputs = getattr(inner, "checks_outputs", False)

  def _vmap(self, fun: Any, in_axes: Any) -> Any:
    return jax.vmap(fun, in_axes=in_axes, axis_size=self.axis_size, axis_name=self.axis_name,
                    spmd_axis_name=self.spmd_axis_name)

  def impl(self, *args: Any) -> list[Any]:
    outs: list[Any] = self._vmap(self.inner.impl, self.dims)(*args)
    return outs

  def out_avals(self) -> list[Any] | None:
    # (a batched tangent map: known without tracing it, as the inner one's are;
    # reverse mode through a custom_vjp function never traces it)
    inner = self.inner.out_avals()
    return None if inner is None else [jc.shaped((self.axis_size, *a.shape), a.dtype)
                                       for a in inner]

  def jvp(self, primals: list[Any], tangents: list[Any | None]
          ) -> tuple[list[Any], list[Any | None]]:
    if isinstance(self.inner, Call):
      _announce_per_example(self.inner.traced, self.dims, self.in_avals, tangents)
    native = _native_fun(self, [i for i, t in enumerate(tangents) if t is not None])
    if native is not None:   # (the batch differentiated, not each example: `_native_fun`)
      return _jvp_of(native, primals, tangents)

    def rule(p: list[Any], t: list[Any | None]) -> tuple[list[Any], list[Any | None]]:
      outs, touts = self.inner.jvp(p, t)
      return outs, [_zeros_like(o) if d is None and _inexact(jc.typeof(o)) else d
                    for o, d in zip(outs, touts, strict=True)]

    dims = list(self.dims)
    outs, touts = self._vmap(rule, (dims, dims))(primals, tangents)
    return list(outs), list(touts)

  def transpose(self, cts: list[Any], args: list[Any | None]) -> list[Any | None]:
    linear = [i for i, a in enumerate(args) if a is None]

    def rule(known: list[Any | None], cts: list[Any]) -> list[Any]:
      out = self.inner.transpose(cts, known)
      return [out[i] for i in linear]

    known_dims = [d if a is not None else None for a, d in zip(args, self.dims, strict=True)]
    grads = self._vmap(rule, (known_dims, 0))(args, cts)
    result: list[Any | None] = [None] * len(args)
    for i, g in zip(linear, grads, strict=True):
      d = self.dims[i]
      result[i] = g.sum(0) if d is None else jnp.moveaxis(g, 0, d)
    return result


#: The traced functions whose per-example gradients were announced (by id;
#: the entry keeps the trace alive, so the id is not reused).
_announced: dict[int, "SymbolicTrace"] = {}


def _announce_per_example(traced: "SymbolicTrace", dims: tuple[int | None, ...],
                          avals: tuple[Any, ...], tangents: list[Any | None]) -> None:
  """A `pj.PerformanceWarning`, once per traced function, where the native
  gate refuses it and the batch differentiates it with respect to an input
  every example shares: that input's cotangent is then built per example (the
  symbolic path transposes each example) and summed."""
  shared = [i for i in traced.diff_in if dims[i] is None and tangents[i] is not None]
  if not shared or _announced.get(id(traced)) is traced:
    return
  reason = _native.refusal(traced)
  if reason is None:
    return
  _announced[id(traced)] = traced
  inputs = ", ".join(f"input {i} ({avals[i].str_short()})" for i in shared)
  warn_user_code(
      f"polyjit differentiates a masked function under vmap with respect to {inputs}, "
      "which every example shares, one example at a time: that gradient is built once "
      "per example and then summed (a copy per example: slow and memory-hungry for an "
      f"embedding table or a weight matrix), because {reason}, so JAX cannot "
      "differentiate the masked evaluation of the whole batch itself.\nWhat to do: "
      "rewrite that part of the function (a jax.custom_vjp function as plain JAX or a "
      "jax.custom_jvp one; a scatter with mode='drop'; sizes that do not depend on the "
      "data), or, if the cost is acceptable, filter this warning: "
      "warnings.filterwarnings('ignore', category=pj.PerformanceWarning).",
      PerformanceWarning)
