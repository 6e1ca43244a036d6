"""One symbolic trace of a user function, and its derivatives traced the same way.

`SymbolicTrace` is a function traced once with symbolic shapes (`trace_flat`, inside
`jc.trace_spellings()` and `data_dependent.tracing`, so exact replacements of
JAX spellings and data-dependent sizes are in place). Its derivatives are
traced lazily and kept on it: `jvp()` is `jax.jvp(fun)` traced symbolically,
`vjp()` is `jax.vjp(fun)` traced symbolically, and `split_vjp()` the VJP in
the two parts JAX splits it into (forward with residuals, backward), so a
gradient runs the forward computation once. The masked evaluation of each is
one `polyjit_masked_call` equation (`calls.py`); `mask.py` builds the user
facing `pj.mask` on top. This module knows nothing of either.

The replacements `jc.trace_spellings()` puts in place are registered by
`polyjit._spellings`, which builds on this package (so nothing here imports
it): `polyjit/__init__.py` imports it first, by name, and `trace_spellings`
refuses to trace (a `LookupError` saying so) when it has not been imported,
rather than tracing without them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from . import data_dependent as _data_dependent, scopes as _scopes
from .errors import MaskingError


@dataclasses.dataclass(eq=False)
class SymbolicTrace:
  """A function traced once with symbolic shapes.

  `jaxpr` takes the consts first, then the flat arguments: `inputs`.
  """
  jaxpr: jc.Jaxpr
  consts: list[Any]
  in_avals: list[Any]       # of `inputs` (consts first); symbolic shapes
  out_avals: list[Any]
  out_tree: Any
  dim_names: tuple[str, ...]
  cache: dict[Any, Any] = dataclasses.field(default_factory=dict)
  _vjp: "VJP | None" = None
  _jvp: "SymbolicTrace | None" = None
  # The call nodes of its masked evaluation and derivatives (`_masking/calls.py`).
  nodes: dict[Any, Any] = dataclasses.field(default_factory=dict)
  _split: "SplitVJP | None" = None
  _split_traced: bool = False
  # Whether its masked evaluation checks for empty selections (known once it
  # was evaluated; `_data_dependent.extra_outputs`).
  has_checks: bool | None = None
  # JAX's shape rules answered for non-empty selections, checked when the
  # program runs: (expr, expr >= 0, text) (`_variants._Oracle.assume`).
  assumptions: tuple[tuple[Any, bool, str], ...] = ()
  # Traced in a scope other traces share (`scopes.py`): its derivatives are
  # traced refusing size questions, so that none is answered in that scope.
  shared_scope: bool = False

  @property
  def cacheable(self) -> bool:
    return not any(isinstance(c, jc.Tracer) for c in self.consts)

  @functools.cached_property
  def diff_in(self) -> list[int]:
    """The inputs that take derivatives (inexact dtypes)."""
    return [i for i, a in enumerate(self.in_avals) if _inexact(a)]

  @functools.cached_property
  def diff_out(self) -> list[int]:
    """The outputs that carry derivatives (inexact dtypes)."""
    return [j for j, a in enumerate(self.out_avals) if _inexact(a)]

  @functools.cached_property
  def size_names(self) -> tuple[str, ...]:
    """The data-dependent sizes `fun` creates (`_masking/data_dependent.py`)."""
    return _data_dependent.size_names(self.jaxpr)

  def vjp(self) -> "VJP":
    if self._vjp is None:
      with _scopes.refusing_questions(self.shared_scope):
        self._vjp = _trace_vjp(self)
    return self._vjp

  def jvp(self) -> "SymbolicTrace":
    """The tangent map: (inputs, tangents of the inexact inputs) -> tangents
    of the inexact outputs, traced symbolically."""
    if self._jvp is None:
      with _scopes.refusing_questions(self.shared_scope):
        self._jvp = _trace_jvp(self)
    return self._jvp

  def split_vjp(self) -> "SplitVJP | None":
    if not self._split_traced:
      with _scopes.refusing_questions(self.shared_scope):
        self._split = None if self.size_names else _trace_split_vjp(self)
      self._split_traced = True
    return self._split


@dataclasses.dataclass(eq=False)
class VJP:
  """`fun`'s VJP traced symbolically: (inputs, cts) -> grads of `diff_in`."""
  traced: SymbolicTrace
  diff_in: list[int]        # which inputs are differentiable
  diff_out: list[int]       # which outputs carry cotangents


@dataclasses.dataclass(eq=False)
class SplitVJP:
  """`fun`'s VJP in two traces: `fwd` (inputs -> outputs, then residuals)
  and `bwd` (residuals, cts -> grads of `diff_in`), so a gradient computes
  the forward pass once."""
  fwd: SymbolicTrace
  bwd: SymbolicTrace
  diff_in: list[int]
  diff_out: list[int]


def _is_array(x: Any) -> bool:
  return isinstance(x, (jc.Tracer, jax.Array, np.ndarray))


def _trace_split_vjp(traced: SymbolicTrace) -> SplitVJP | None:
  """`fun`'s VJP split where JAX splits it: `jax.vjp` traced symbolically
  returns the outputs and the pullback, a pytree whose array leaves are the
  residuals; the backward trace rebuilds the pullback from them. None when
  that fails or the backward pass has effects that must not run (then the
  gradient replays the forward pass, `_trace_vjp`, which explains itself)."""
  diff_in, diff_out = traced.diff_in, traced.diff_out
  primal_fun = jc.jaxpr_as_fun(traced.jaxpr)
  box: list[Any] = []

  def fwd_fun(*inputs: Any) -> list[Any]:
    primal = _differentiable_part(primal_fun, inputs, diff_in, diff_out, with_outputs=True)
    _, pullback, outs = jax.vjp(primal, *[inputs[i] for i in diff_in], has_aux=True)
    leaves, tree = jax.tree.flatten(pullback)
    dynamic = [k for k, leaf in enumerate(leaves) if _is_array(leaf)]
    box.append((tree, [None if k in dynamic else leaf for k, leaf in enumerate(leaves)],
                dynamic))
    return [*outs, *[leaves[k] for k in dynamic]]

  try:
    fwd = trace_flat(fwd_fun, traced.in_avals, traced.dim_names, replay=True)
    tree, leaves, dynamic = box[0]
    res_avals = fwd.out_avals[len(traced.out_avals):]
    n_res = len(res_avals)

    def bwd_fun(*flat: Any) -> list[Any]:
      full = list(leaves)
      for k, r in zip(dynamic, flat[:n_res], strict=True):
        full[k] = r
      pullback = jax.tree.unflatten(tree, full)
      return list(pullback(list(flat[n_res:])))

    ct_avals = [jc.shaped(traced.out_avals[j].shape, traced.out_avals[j].dtype)
                for j in diff_out]
    bwd = trace_flat(bwd_fun, [*res_avals, *ct_avals], traced.dim_names, replay=True)
  except Exception:
    return None  # the VJP that replays the forward pass explains the failure
  if jc.replay_unsafe_effects(bwd.jaxpr) or fwd.size_names or bwd.size_names:
    return None
  return SplitVJP(fwd, bwd, diff_in, diff_out)


def _inexact(aval: Any) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.inexact)


def trace_flat(flat_fun: Callable[..., list[Any]], avals: Sequence[Any],
               dim_names: Sequence[str], out_tree: Any = None, *,
               replay: bool = False) -> SymbolicTrace:
  """Traces `flat_fun(*leaves) -> list` at symbolic `avals` (`replay`: a
  derivative, which evaluates an earlier trace's jaxpr)."""
  with jc.trace_spellings():
    closed = _data_dependent.trace_own_sizes(
        lambda: jc.make_closed_jaxpr(flat_fun, list(avals)), avals, replay=replay)
  consts = list(closed.consts)
  const_avals = [jc.typeof(c) for c in consts]
  return SymbolicTrace(
      jaxpr=jc.convert_constvars_jaxpr(closed.jaxpr),
      consts=consts,
      in_avals=[*const_avals, *avals],
      out_avals=[v.aval for v in closed.jaxpr.outvars],
      out_tree=out_tree,
      dim_names=tuple(dim_names))


def _differentiable_part(fun: Callable[..., Any], inputs: Sequence[Any], diff_in: Sequence[int],
                         diff_out: Sequence[int], with_outputs: bool = False
                         ) -> Callable[..., Any]:
  """`fun` as a function of its differentiable inputs only (the others fixed
  at `inputs`), returning its differentiable outputs: what jvp/vjp take
  (`with_outputs`: and all its outputs, as `has_aux`)."""
  def primal(*diff_values: Any) -> Any:
    full = list(inputs)
    for i, v in zip(diff_in, diff_values, strict=True):
      full[i] = v
    outs = fun(*full)
    diff = [outs[j] for j in diff_out]
    return (diff, outs) if with_outputs else diff
  return primal


def _trace_jvp(traced: SymbolicTrace) -> SymbolicTrace:
  n_in = len(traced.in_avals)
  diff_in, diff_out = traced.diff_in, traced.diff_out
  primal_fun = jc.jaxpr_as_fun(traced.jaxpr)

  def jvp_fun(*flat: Any) -> list[Any]:
    inputs, ts = list(flat[:n_in]), list(flat[n_in:])
    primal = _differentiable_part(primal_fun, inputs, diff_in, diff_out)
    _, touts = jax.jvp(primal, tuple(inputs[i] for i in diff_in), tuple(ts))
    return list(touts)

  t_avals = [jc.shaped(traced.in_avals[i].shape, traced.in_avals[i].dtype) for i in diff_in]
  try:
    tangent_map = trace_flat(jvp_fun, [*traced.in_avals, *t_avals], traced.dim_names, replay=True)
  except MaskingError:
    raise
  except Exception as e:
    raise MaskingError(
        "polyjit could not derive the forward-mode derivative (JVP) of the masked "
        f"function with symbolic shapes: {type(e).__name__}: {e}\nWhat to do: use "
        "reverse mode (jax.jacrev(f), and jax.jacrev(jax.jacrev(f)) for a Hessian), "
        "or differentiate inside the masked function (pj.mask(jax.hessian(f), ...)).") from e
  if _uses_primitive(tangent_map.jaxpr, "custom_lin"):
    raise MaskingError(
        "forward-mode differentiation (jax.jvp, jax.jacfwd, jax.hessian) of a masked "
        "function that calls a jax.custom_vjp function: JAX itself cannot differentiate "
        "a custom_vjp function in forward mode (jax.jvp of it fails without polyjit "
        "too).\nWhat to do: use reverse mode (jax.jacrev, jax.jacrev(jax.jacrev(f)) "
        "for a Hessian), or give that function a jax.custom_jvp rule instead.")
  return tangent_map


def _uses_primitive(jaxpr: jc.Jaxpr, name: str) -> bool:
  return any(eqn.primitive.name == name
             or any(_uses_primitive(sub, name) for sub in jc.subjaxprs_in_params(eqn.params))
             for eqn in jaxpr.eqns)


def _trace_vjp(traced: SymbolicTrace) -> VJP:
  n_in = len(traced.in_avals)
  diff_in, diff_out = traced.diff_in, traced.diff_out
  primal_fun = jc.jaxpr_as_fun(traced.jaxpr)

  def vjp_fun(*flat: Any) -> list[Any]:
    inputs, cts = list(flat[:n_in]), list(flat[n_in:])
    primal = _differentiable_part(primal_fun, inputs, diff_in, diff_out)

    _, pullback = jax.vjp(primal, *[inputs[i] for i in diff_in])
    return list(pullback(cts))

  ct_avals = [jc.shaped(traced.out_avals[j].shape, traced.out_avals[j].dtype)
              for j in diff_out]
  try:
    vjp_traced = trace_flat(vjp_fun, [*traced.in_avals, *ct_avals], traced.dim_names, replay=True)
  except MaskingError:
    raise
  except Exception as e:
    if jc.is_while_loop_vjp_refusal(e):
      raise MaskingError(
          "the masked function has a loop whose trip count depends on a dynamic "
          "size (a lax.fori_loop or lax.while_loop up to x.shape[0]); with "
          "symbolic sizes JAX turns it into a while_loop, which JAX cannot "
          "differentiate in reverse mode.\nWhat to do: loop with lax.scan over "
          "the array (lax.scan(step, init, x)), which masks and differentiates; "
          "or compute the gradient inside the masked function with jax.jvp.",
          primitive="while") from e
    raise MaskingError(
        "polyjit could not derive the gradient of the masked function with "
        f"symbolic shapes: {type(e).__name__}: {e}\nWhat to do: compute the "
        "gradient inside the masked function (pj.mask(jax.grad(f), ...)), or "
        "differentiate at fixed shapes.") from e
  replayed = jc.replay_unsafe_effects(vjp_traced.jaxpr)
  if replayed:
    raise MaskingError(
        "the gradient of a masked function replays its forward pass, and this "
        f"one has effects that must not run twice ({', '.join(map(str, replayed))}, "
        "e.g. an io_callback).\nWhat to do: compute the gradient inside the masked "
        "function (pj.mask(jax.grad(f), ...)), where the forward pass runs once; "
        "or move the callback out of the function you differentiate.")
  return VJP(vjp_traced, diff_in, diff_out)
