"""`pj.mask`: run a function written for unpadded arrays on padded arrays.

    masked = pj.mask(fun, in_shapes, out_shape=None, constraints=())
    padded_outs = masked(args, logical_env)

`fun` is traced once per argument structure with symbolic shapes (cached on
the masked function, so a new padded size does not retrace `fun`; keyed by
JAX's configuration too, as `jax.jit`'s traces), then the jaxpr is evaluated
on the padded arguments by the masking interpreter (`_masking/core.py`). Logical sizes are runtime values: under `jax.jit` one program
serves every logical size up to the padded one, and `jax.vmap` over the
logical sizes gives ragged batching.

Derivatives
-----------
Differentiating the masked evaluation as it is would be unsafe: JAX's
transpose rules sum over padding without masks (the transpose of a broadcast
into a dynamic axis is a sum over it, of a gather a scatter-add), and the
local derivatives in the padding are garbage, so 0 * NaN = NaN reaches valid
entries. The masked evaluation is therefore one `polyjit_masked_call`
equation (`_masking/calls.py`) whose derivatives polyjit defines, on one of
two paths:

* Native (`_masking/native.py`), where a gate proves it safe: JAX
  differentiates an evaluation in which every equation that mixes positions
  has its output tangents masked (`select(valid, y, stop_gradient(y))`: value
  unchanged, tangent and cotangent zero in the padding) and, for
  `dot_general`, its operands' padding zeroed; a `scan` over a dynamic length
  runs its frozen steps on a real step's inputs, and a `jax.custom_jvp`
  function keeps its rule (masked too). Under `jax.vmap` / `pj.vmap` JAX then
  sees the whole batch before transposing, so the gradient of a shared
  parameter is accumulated once for the batch, as for `jax.grad` of a
  `jax.vmap`, not once per example. The gate refuses functions with
  data-dependent sizes, custom_vjp functions, and any equation with a dynamic
  axis outside its list (`native.py` says which and why); those take:
* the symbolic path: the JVP is the masked evaluation of `jax.jvp(fun)`
  traced symbolically (forward mode: `jax.jvp`, `jax.jacfwd`,
  `jax.linearize`), and the transpose of that tangent map is *the masked
  evaluation of fun's VJP*: `jax.vjp(fun)` traced symbolically once, whose
  transposes are explicit primitives (`reduce_sum`, `dot_general`, reverse
  `cumsum`, `scatter-add`) that the same rules mask before anything mixes
  positions. Each derivative is again such an equation, so higher
  derivatives in any order (`jax.hessian` = jacfwd(jacrev)) are safe.

Either way gradients with respect to padded inputs have zeros in their
padding, and NaN or inf in any padding never reaches a valid entry.

On the symbolic path the VJP is traced in two parts where JAX splits it (`SplitVJP`): the forward
part returns `fun`'s outputs and the residuals (the pullback's array leaves),
the backward part maps residuals and cotangents to gradients. The JVP's
primal output is the masked evaluation of the first, and the transpose of its
tangent map the second, so a gradient runs the forward computation once, as
`jax.grad` of the unmasked function does. Residuals are padded values like
any other: their padding is unspecified and the backward rules mask it. A
function with data-dependent sizes, or whose split fails, replays the forward
pass in the backward one.

Values `fun` closes over become inputs of the equation (closure conversion),
so derivatives reach them as well.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import dims as _dims
from .. import _jax as jc
from . import rules as _rules  # noqa: F401  (registers the masking rules)
from . import empty as _empty
from . import (data_dependent as _data_dependent, calls as _mask_calls, scopes as _scopes, signals as _signals,
               size_range as _size_range, spec as _spec, autodiff as _symbolic_ad, variants as _variants, verify as _verify)
from .refusals import jax_refusal
from .errors import FallbackWarning, MaskingError, PolyjitError, ShapeError, trace_error, warn_user
from .spec import ArgSpecs, LogicalEnv, SpecTree
from .trace import SymbolicTrace, trace_flat


# Every change polyjit makes to JAX's tables and classes, once, here.
jc.install_patches(_symbolic_ad.install)


def apply(traced: SymbolicTrace, padded: dict[str, int], args: Sequence[Any],
          logical: Sequence[Any]) -> list[Any]:
  """Runs `traced` masked on padded `args` (without its consts).

  One `polyjit_masked_call` equation (`_masking/calls.py`): its gradient is the
  masked evaluation of the traced VJP, its JVP that of the traced JVP.
  """
  return _mask_calls.call_traced(traced, padded, args, tuple(logical))


GROWING_VARIANTS = 8   # variants of one argument structure before a warning


def _warn_if_growing(name: str, count: int, variant: _variants.Variant) -> None:
  """Variants that grow with the sizes (`n in range(1, 1000)`, a hash, one
  `==` per size) each get a program: said once, where the user sees it."""
  if count != GROWING_VARIANTS:
    return
  warn_user(
      f"{name} asks its sizes questions that give nearly every size its own "
      f"trace and program ({count} so far; the last for {variant.describe()}): "
      "comparisons with many values (`n in range(...)`, `n in {...}`, one `==` per "
      "size), which is what jax.jit would compile.\nWhat to do: compare with "
      "inequalities (`1 <= n < 1000` instead of `n in range(1, 1000)`), compute "
      "with the size as a value (jnp.where(x.shape[0] == k, ...)), or declare "
      "that axis fixed.", FallbackWarning)


class Masked:
  """The result of `pj.mask`: call it as `masked(args, logical_env)`.

  For each argument structure it keeps the variants of `fun` (`_masking/variants.py`):
  one trace per side of the size comparisons `fun` makes. Concrete sizes run
  the variant they select; traced sizes run all the variants their padded
  sizes allow, selected in the program.
  """

  def __init__(self, fun: Callable[..., Any], in_shapes: ArgSpecs,
               out_shape: SpecTree = None, *, constraints: Sequence[str] = ()) -> None:
    if not callable(fun):
      raise TypeError(f"pj.mask expects a callable, got {type(fun).__name__}")
    # `pj.mask(jnp.unique, ...)` traces as `pj.mask(lambda v: jnp.unique(v), ...)`
    self.fun = jc.as_called_by_name(fun)
    self.in_shapes = in_shapes
    self.out_shape = out_shape
    self.constraints = tuple([constraints] if isinstance(constraints, str) else constraints)
    self.scope = _spec.make_scope(self.constraints)
    self._variants: dict[Any, list[_variants.Variant]] = {}
    self._explored: dict[Any, list[_variants.Variant]] = {}
    self._bindings: dict[Any, _spec.Binding] = {}
    self._lock = threading.RLock()
    # Asked a size question in a trace: traced in fresh scopes (`_masking/scopes.py`).
    self._asks_sizes = False
    # Sizes of 0 (`_masking/empty.py`); None on an empty path's own Masked.
    self.empty_paths: _empty.EmptyPaths | None = _empty.EmptyPaths(self, Masked)
    functools.update_wrapper(self, fun, updated=())

  def __repr__(self) -> str:
    return f"pj.mask({getattr(self.fun, '__name__', self.fun)!r}, {self.in_shapes!r})"

  @property
  def _name(self) -> str:
    return getattr(self.fun, "__name__", None) or repr(self.fun)

  def bind(self, args: Sequence[Any]) -> _spec.Binding:
    """Binds the specs to padded `args`: padded sizes and symbolic shapes
    (cached per argument structure and shapes: the specs are parsed once)."""
    leaves, tree = jax.tree.flatten(tuple(args))
    key = (tree, tuple(np.shape(x) for x in leaves))
    binding = self._bindings.get(key)
    if binding is None:
      binding = self._bindings[key] = _spec.bind(self.in_shapes, args, self.scope)
    return binding

  # --- variants -------------------------------------------------------------

  def _structure(self, args: Sequence[Any], binding: _spec.Binding) -> tuple[Any, ...]:
    """What a trace depends on: tree, shapes, dtypes, JAX's config (as jax.jit)."""
    leaves, in_tree = jax.tree.flatten(tuple(args))
    return (in_tree, tuple((tuple(map(str, leaf.symbolic_shape)), jc.typeof(x).dtype,
                            jc.typeof(x).weak_type)
                           for leaf, x in zip(binding.leaves, leaves, strict=True)),
            jc.trace_context())

  def _tracer(self, args: Sequence[Any], binding: _spec.Binding) -> _variants.TraceFn:
    """(constraints, oracle) -> SymbolicTrace: `fun` traced in the scope of those
    constraints, its size comparisons answered by `oracle`."""
    leaves, in_tree = jax.tree.flatten(tuple(args))

    def in_scope(scope: jc.SymbolicScope, oracle: Any) -> SymbolicTrace:
      bound = _spec.bind(self.in_shapes, args, scope, check=False)
      avals = [jc.shaped(leaf.symbolic_shape, jc.typeof(x).dtype, jc.typeof(x).weak_type)
               for leaf, x in zip(bound.leaves, leaves, strict=True)]
      with _signals.answering(oracle):   # a signal the function caught voids it
        return self._trace(in_tree, avals, bound.dim_names)

    def trace(constraints: tuple[str, ...], oracle: Callable[..., bool]) -> SymbolicTrace:
      shared = None if self._asks_sizes else _scopes.trace_shared(in_scope, constraints, oracle)
      if shared is None:  # it asks size questions: a scope of its own
        self._asks_sizes = True
        scope = _spec.fresh_scope(constraints)   # its answers reach no other trace
        traced: SymbolicTrace = in_scope(scope, oracle)
      else:
        traced, scope = shared
      traced.assumptions = tuple(getattr(oracle, "assumed", ()))
      if self.out_shape is not None:
        check_out_shape(self.out_shape, traced, scope)
      return traced
    return trace

  def variant_for(self, args: Sequence[Any], sizes: dict[str, int],
                  binding: _spec.Binding | None = None) -> _variants.Variant:
    """The variant that concrete logical `sizes` select (traced once); raises
    the error `fun` gives on that side of its comparisons."""
    binding = binding or self.bind(args)
    key = self._structure(args, binding)
    variant = self._known_variant(key, sizes)
    if variant is None:
      with self._lock:  # one thread traces a side; the others then find it
        variant = self._known_variant(key, sizes)
        if variant is None:
          known = self._variants.setdefault(key, [])
          variant = _variants.for_sizes(self._tracer(args, binding), self.constraints,
                                        sizes, known)
          if variant.traced is None or variant.traced.cacheable:
            self._variants[key] = [*known, variant]
            _warn_if_growing(self._name, len(known) + 1, variant)
    if variant.error is not None:
      error = self._trace_error(variant.error, variant)
      # Only this side of a size comparison fails (`lax.top_k(x, 3)` at n <= 2,
      # as jax.jit does): other sizes still mask (`pj.jit` runs these exactly).
      error.one_side = bool(variant.decisions) or variant.constraints != self.constraints
      raise error
    return variant

  def _known_variant(self, key: tuple[Any, ...], sizes: dict[str, int]
                     ) -> _variants.Variant | None:
    return next((v for v in self._variants.get(key, ()) if v.holds(sizes)), None)

  def variants(self, args: Sequence[Any],
               binding: _spec.Binding | None = None) -> list[_variants.Variant]:
    """Every variant that some logical sizes up to the padded ones select."""
    binding = binding or self.bind(args)
    structure = self._structure(args, binding)
    universal = [v for v in self._variants.get(structure, ()) if self._is_universal(v)]
    if universal:  # `fun` compares no sizes: one trace serves every padded size
      return universal
    key = (structure, binding.padded_key())
    found = self._explored.get(key)
    if found is None:
      found = _variants.explore(self._tracer(args, binding), self.constraints,
                                _variants.Domain(binding.padded))
      for v in found:
        if v.error is not None:
          raise self._trace_error(v.error, v, traced_sizes=True)
      _variants.check_same_outputs(found)
      if all(v.traced.cacheable for v in found):
        self._explored[key] = found
        if len(found) == 1 and self._is_universal(found[0]):
          with self._lock:
            self._variants[structure] = [*self._variants.get(structure, []), found[0]]
    return found

  def _is_universal(self, variant: _variants.Variant) -> bool:
    return (variant.error is None and not variant.decisions
            and variant.constraints == self.constraints)

  def trace(self, args: Sequence[Any], binding: _spec.Binding | None = None) -> SymbolicTrace:
    """A symbolic trace of `fun` for `args`' structure and dtypes: the first
    variant (every variant has the same output shapes)."""
    traced: SymbolicTrace = self.variants(args, binding)[0].traced
    return traced

  def _trace(self, in_tree: Any, avals: list[Any], dim_names: Sequence[str]) -> SymbolicTrace:
    out_tree_box: list[Any] = []

    def flat_fun(*leaves: Any) -> list[Any]:
      args = jax.tree.unflatten(in_tree, leaves)
      out = self.fun(*args)
      out_leaves, out_tree = jax.tree.flatten(out)
      out_tree_box.append(out_tree)
      return out_leaves

    traced = trace_flat(flat_fun, avals, dim_names)
    traced.out_tree = out_tree_box[0]
    return traced

  def _trace_error(self, error: BaseException, variant: _variants.Variant | None = None,
                   traced_sizes: bool = False) -> PolyjitError:
    """`error` from tracing `fun`, as a polyjit error that explains itself."""
    out: PolyjitError
    if isinstance(error, jc.JaxBoundaryError):  # this JAX lacks an internal: that alone
      raise error
    if isinstance(error, (MaskingError, ShapeError)):
      # A copy: the variant keeps its error and raises it on every call, and
      # each raise gets notes of its own.
      out = copy.copy(error)
    elif isinstance(error, NotImplementedError):  # JAX's own refusals at symbolic sizes
      out = jax_refusal(error)
    else:
      out = trace_error(error, self._name)
    out = _data_dependent.readable_sizes(out)
    if variant is not None and traced_sizes and (variant.decisions or variant.other_side):
      excluding = variant.other_side or _variants.excluding_constraint(variant)
      declare = f"constraints=['{excluding}']" if excluding else "constraints=[...]"
      out.exclude_with = excluding   # (pj.vmap learns it: `_ragged/vmap.py`)
      out.add_note(f"(it fails for the sizes where {variant.describe()}. With traced sizes "
                   "(jax.jit of a masked function, pj.vmap) every size up to the padded "
                   f"one must work; if sizes never go there, declare it: {declare}.)")
    out.__cause__ = error
    return out

  # --- calls ------------------------------------------------------------------

  def logical_shapes(self, args: Sequence[Any], logical_env: LogicalEnv) -> Any:
    """The outputs' logical shapes (a pytree of int tuples) for concrete sizes."""
    binding = self.bind(args)
    _spec.logical_values(logical_env, binding)  # validates the sizes
    sizes = {k: int(v) for k, v in logical_env.items()}
    if 0 in sizes.values():   # an empty example: `fun`'s on the empty arrays
      return _empty.logical_shapes(self, args, binding, sizes)
    traced = self.variant_for(args, sizes, binding).traced
    if traced.size_names:
      raise ShapeError(
          f"{self._name} has data-dependent sizes ({', '.join(traced.size_names)}): "
          "its output shapes are known only after it ran, and come with its outputs: "
          "`outs, shapes = masked(args, logical_env)`.")
    shapes = [tuple(_dims.evaluate_dim(d, sizes) for d in a.shape) for a in traced.out_avals]
    return jax.tree.unflatten(traced.out_tree, shapes)

  def unpad(self, padded_outs: Any, args: Sequence[Any], logical_env: LogicalEnv) -> Any:
    """Slices padded outputs to their logical shapes (as NumPy arrays)."""
    shapes = self.logical_shapes(args, logical_env)
    leaves, tree = jax.tree.flatten(padded_outs)
    # (ignore: jaxlib ships no type stub for PyTreeDef, mypy sees none of its methods)
    shape_leaves = tree.flatten_up_to(shapes)  # type: ignore[attr-defined]
    return jax.tree.unflatten(tree, [
        np.asarray(x)[tuple(slice(0, s) for s in shape)]
        for x, shape in zip(leaves, shape_leaves, strict=True)])

  def call_variant(self, variant: _variants.Variant, args: Sequence[Any],
                   padded: dict[str, int], logical_env: dict[str, Any]) -> Any:
    """Runs one variant (chosen by the caller from concrete sizes) on padded
    `args` with the logical sizes of `logical_env`."""
    outs = _apply_variant(variant, padded, jax.tree.leaves(tuple(args)), logical_env)
    traced = variant.traced
    if traced.size_names:  # pj.jit reads the created sizes back itself
      outs, sizes, failed = _data_dependent.split_outputs(traced, outs)
      return jax.tree.unflatten(traced.out_tree, outs), (sizes, failed)
    return jax.tree.unflatten(traced.out_tree, outs)

  def __call__(self, args: Sequence[Any], logical_env: LogicalEnv) -> Any:
    """The padded outputs. A function that creates data-dependent sizes
    (`x[x > 0]`, `jnp.nonzero`, `jnp.unique`) returns `(padded_outputs,
    shapes)` instead: `shapes` has one tuple per output leaf, its logical
    shape (ints for fixed axes, int32 scalars for dynamic ones)."""
    outs, sizes = self.call_with_sizes(args, logical_env)
    if sizes is None:
      return outs
    traced = self.trace_for_output(args, logical_env)
    shapes = _size_range.logical_shapes(traced, sizes)
    return outs, jax.tree.unflatten(traced.out_tree, shapes)

  def trace_for_output(self, args: Sequence[Any], logical_env: Mapping[str, Any]) -> SymbolicTrace:
    """The trace whose output shapes `call_with_sizes`' sizes evaluate."""
    binding = self.bind(args)
    if all(_spec.is_concrete(logical_env[k]) for k in binding.dim_names):
      sizes = {k: int(logical_env[k]) for k in binding.dim_names}
      traced: SymbolicTrace = self.variant_for(args, sizes, binding).traced
      return traced
    return self.trace(args, binding)

  def call_with_sizes(self, args: Sequence[Any], logical_env: Mapping[str, Any]
                      ) -> tuple[Any, Any]:
    """(padded outputs, sizes): `sizes` is None for a function that creates no
    data-dependent sizes, else `logical_env` plus each created size (an int32
    scalar), from which the outputs' logical shapes evaluate."""
    return self.call_with_shapes(args, logical_env)[:2]

  def call_with_shapes(self, args: Sequence[Any], logical_env: Mapping[str, Any],
                       may_be_empty: bool = True) -> tuple[Any, Any, list[list[Any]] | None]:
    """`call_with_sizes`, and the outputs' logical shapes where traced sizes
    may be 0 (int32 scalars per output leaf; None: evaluate the shapes).
    `may_be_empty=False`: the caller knows traced sizes are >= 1 (a
    `pj.Ragged` built without empty examples), so no empty path runs and a 0
    is out of range (poisoned)."""
    shapes: list[list[Any]] | None = None
    in_contract: Any = None   # traced sizes: whether they keep the contract (a traced bool)
    try:
      binding = self.bind(args)
      logical = _spec.logical_values(logical_env, binding)
      leaves = jax.tree.leaves(tuple(args))
      env = dict(zip(binding.dim_names, logical, strict=True))
      if all(_spec.is_concrete(logical_env[k]) for k in binding.dim_names):
        sizes = {k: int(logical_env[k]) for k in binding.dim_names}
        if 0 in sizes.values():   # an empty example (`_masking/empty.py`)
          return _empty.concrete(self, args, binding, sizes), None, None
        variant = self.variant_for(args, sizes, binding)
        _spec.check_constraints(binding.padded, variant.scope, what="padded")
        traced = variant.traced
        outs = _apply_variant(variant, binding.padded, leaves, env)
      else:
        found = self.variants(args, binding)
        traced = found[0].traced
        outs, shapes, in_contract = _call_traced(self, found, binding, args, env,
                                                 may_be_empty)
    except (MaskingError, ShapeError) as e:
      e.add_note(f"(while masking {self._name}, called at {jc.current_user_line()})")
      raise
    if not traced.size_names:
      result = jax.tree.unflatten(traced.out_tree, outs)
      if _verify.enabled():
        self._verify(args, binding, logical_env, result)
      return result, None, shapes
    outs, sizes, failed = _data_dependent.split_outputs(traced, outs)
    _data_dependent.raise_if_failed(failed)
    outs = _data_dependent.poison_if_failed(outs, failed, leaves)
    env = {**logical_env, **sizes}
    if in_contract is not None:   # traced sizes: the counts are poisoned with the rest
      env[_size_range.IN_CONTRACT] = _size_range.ok_and_checked(in_contract, failed)
    return jax.tree.unflatten(traced.out_tree, outs), env, None


  def _verify(self, args: Sequence[Any], binding: _spec.Binding,
              logical_env: Mapping[str, Any], result: Any) -> None:
    """The checking mode (concrete sizes only): `_verify.check_call`."""
    _verify.check_call(self, args, binding, logical_env, result)


def _call_traced(masked: Masked, found: Sequence[_variants.Variant], binding: _spec.Binding,
                 args: Sequence[Any], env: dict[str, Any], may_be_empty: bool = True
                 ) -> tuple[list[Any], Any, Any]:
  """(outputs, their logical shapes or None, whether the sizes keep the
  contract: a traced bool) at traced sizes: the variant they select, and the
  empty paths where sizes may be 0 (`_masking/empty.py`); poisoned outside
  the sizes that have a computation or that violate a declared constraint."""
  traced = found[0].traced
  leaves, logical = jax.tree.leaves(tuple(args)), [env[k] for k in binding.dim_names]
  what = f"pj.mask({masked._name})"
  if traced.size_names or masked.empty_paths is None or not may_be_empty:
    outs = _apply_selected(found, binding, leaves, logical)
    n_out = len(traced.out_avals)   # (created sizes and check codes follow)
    guarded, in_contract = _size_range.guard(outs[:n_out], env, binding.padded, what,
                                             masked.scope, inputs=leaves)
    return [*guarded, *outs[n_out:]], None, in_contract

  def main(xs: list[Any], e: dict[str, Any]) -> list[Any]:
    return _apply_selected(found, binding, xs, [e[k] for k in binding.dim_names])
  outs, shapes, ok = _empty.selected(masked, args, binding, env, main, traced.out_avals)
  guarded, in_contract = _size_range.guard(outs, env, binding.padded, what, masked.scope,
                                           lowest=0, ok=ok, inputs=leaves)
  return guarded, shapes, in_contract


def _apply_selected(variants: Sequence[_variants.Variant], binding: _spec.Binding,
                    leaves: Sequence[Any], logical: Sequence[Any]) -> list[Any]:
  """Runs the variant the (traced) sizes select: `lax.switch` over them.

  Under `vmap` the switch evaluates every variant and selects; a variant on
  the wrong side of its comparisons may compute NaN there, so each one sees
  its inputs through `where(selected, x, stop_gradient(x))`: its gradient
  reaches the inputs only where it was selected (a select, which drops NaN,
  not a product, which keeps it).
  """
  padded = binding.padded
  env = dict(zip(binding.dim_names, logical, strict=True))
  if len(variants) == 1:
    return _apply_variant(variants[0], padded, leaves, env)
  envs = [_padded_for(padded, v) for v in variants]
  selected = [v.holds_traced(env) for v in variants]
  index = jnp.argmax(jnp.stack(selected)).astype(np.int32)

  def branch(i: int) -> Callable[[list[Any], dict[str, Any]], list[Any]]:
    def run(leaves: list[Any], env: dict[str, Any]) -> list[Any]:
      guarded = [jnp.where(selected[i], x, jax.lax.stop_gradient(x))
                 if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else x for x in leaves]
      if envs[i] is not padded:
        guarded = [_pad_to(x, _padded_shape(leaf.symbolic_shape, envs[i]))
                   for x, leaf in zip(guarded, binding.leaves, strict=True)]
      return _apply_variant(variants[i], envs[i], guarded, env)
    return run

  branches = [branch(i) for i in range(len(variants))]
  if any(e is not padded for e in envs):
    # Variants padded differently: their outputs, padded to one shape (each
    # dim the largest; the padding of an output is unspecified anyway).
    shapes = [[np.shape(o) for o in jax.eval_shape(b, list(leaves), env)] for b in branches]
    common = [tuple(max(dims) for dims in zip(*per_out, strict=True))
              for per_out in zip(*shapes, strict=True)]

    def widened(run: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
      return lambda leaves, env: [_pad_to(o, s) for o, s in zip(run(leaves, env), common,
                                                                 strict=True)]
    branches = [widened(b) for b in branches]
  outs: list[Any] = jax.lax.switch(index, branches, list(leaves), env)
  return outs


def _padded_for(padded: dict[str, int], variant: _variants.Variant) -> dict[str, int]:
  """Padded sizes for running `variant` with traced sizes: the arguments'
  own where they satisfy its constraints, else one of them raised to the
  nearest size that does ('n - m <= -1', settled for `min(n, m)`, at n = m =
  16: m = 17). Raised, never lowered: every logical size up to the arguments'
  padded ones still fits; the arguments are padded to it."""
  scope = variant.scope
  if _spec.violated_constraint(padded, scope) is None:
    return padded
  best: dict[str, int] | None = None
  for var in sorted(padded):
    size = _raised(padded, var, scope)
    if size is not None and (best is None or size - padded[var] < best[var] - padded[var]):
      best = {**padded, var: size}
  if best is None:
    _spec.check_constraints(padded, scope, what="padded")   # raises
  assert best is not None
  return best


def _raised(padded: dict[str, int], var: str, scope: Any) -> int | None:
  """The smallest size above `padded[var]` (the others kept) that satisfies
  the constraints, or None (searched up to 4 times the largest padded size)."""
  def ok(size: int) -> bool:
    return _spec.violated_constraint({**padded, var: size}, scope) is None
  base = padded[var]
  limit = base + 4 * max(max(padded.values()), 1)
  lo, hi, step = base, base + 1, 1
  while not ok(hi):   # up by one for 16 sizes, then by doubling steps
    if hi >= limit:
      return None
    lo, step = hi, (step * 2 if hi - base >= 16 else 1)
    hi = min(hi + step, limit)
  while hi - lo > 1:  # the smallest in (lo, hi] (linear constraints: an interval)
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if ok(mid) else (mid, hi)
  return hi


def _padded_shape(shape: Sequence[Any], env: dict[str, int]) -> tuple[int, ...]:
  return tuple(int(_dims.evaluate_dim(d, env)) for d in shape)


def _pad_to(x: Any, shape: Sequence[int]) -> Any:
  """`x` padded with zeros at the end of each axis up to `shape`."""
  have = np.shape(x)
  if tuple(have) == tuple(shape):
    return x
  return jnp.pad(x, [(0, s - h) for h, s in zip(have, shape, strict=True)])


def _apply_variant(variant: _variants.Variant, padded: dict[str, int], leaves: Sequence[Any],
                   env: dict[str, Any]) -> list[Any]:
  """`apply` with the sizes a variant's trace names (an equality constraint
  such as 'm == n' leaves only `n`)."""
  traced = variant.traced
  return apply(traced, padded, leaves, [env[k] for k in traced.dim_names])


def check_out_shape(out_shape: SpecTree, traced: SymbolicTrace, scope: jc.SymbolicScope) -> None:
  """Raises ShapeError when the traced output shapes differ from `out_shape`."""
  example = jax.tree.unflatten(traced.out_tree, traced.out_avals)
  try:
    specs = jax.tree.broadcast(out_shape, example, is_leaf=_spec.is_spec_leaf)
  except Exception as e:
    raise ShapeError(f"out_shape {out_shape!r} does not match the output structure "
                     f"{traced.out_tree}: {e}") from None
  # Up to the outputs' structure: a None output (an empty subtree) has no spec.
  spec_leaves = traced.out_tree.flatten_up_to(specs)
  for i, (spec, aval) in enumerate(zip(spec_leaves, traced.out_avals, strict=True)):
    if spec is None:
      continue
    like = tuple(None if jc.is_symbolic_dim(d) else d for d in aval.shape)
    declared = _spec.parse_shape(spec, like, scope, f"out_shape output {i}")
    if len(declared) != len(aval.shape) or any(
        a != b for a, b in zip(declared, aval.shape, strict=True)):
      raise ShapeError(
          f"output {i} has shape {_fmt(aval.shape)} but out_shape declares "
          f"{_fmt(declared)} (spec {spec!r}).")


def _fmt(shape: Sequence[Any]) -> str:
  return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def mask(fun: Callable[..., Any], in_shapes: ArgSpecs, out_shape: SpecTree = None, *,
         constraints: Sequence[str] = ()) -> Masked:
  """Masks `fun`: run it on padded arrays, get the exact unpadded result.

  Args:
    fun: a function of positional array arguments (pytrees allowed), written
      for unpadded arrays.
    in_shapes: one spec per positional argument (a pytree prefix of it), in
      `jax.export`'s polymorphic-shape syntax: "n", "(n, _)", "(m+1, 2*n)";
      "_" is a fixed dim taken from the argument; None: no dynamic dims.
    out_shape: optional spec pytree for the outputs, checked at trace time.
    constraints: constraint strings such as "n >= 3", for code that compares
      sizes (e.g. `lax.top_k(x, 3)`).

  Returns:
    `masked(args, logical_env)`: `args` a list or tuple of padded arrays,
    `logical_env` a dict from each dimension name to its logical size (a
    Python int or an int scalar, possibly traced). Returns `fun`'s output
    pytree, padded: along each dynamic axis only the leading logical region
    is defined. A `fun` with data-dependent sizes (`x[x > 0]`, `jnp.nonzero`,
    `jnp.unique`) returns `(padded_outputs, shapes)`: `shapes` holds each
    output's logical shape (int32 scalars for dynamic axes), computed by the
    program; see `_masking/data_dependent.py`.
  """
  return Masked(fun, in_shapes, out_shape, constraints=constraints)

