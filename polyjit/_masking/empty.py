"""Empty examples: logical sizes of 0, on a path of their own.

JAX's symbolic dimensions are >= 1, and a masked trace relies on it without
saying so: JAX simplifies `max(n - 1, 0)` to `n - 1` (`x[1:]`), accepts
`jnp.max(x)` and `x[0]` as defined, and the size comparisons polyjit explores
range over [1, padded]. The symbolic trace is therefore never *used* at a size
of 0. An empty size gets a trace in which it is the constant 0:

* **Concrete sizes** (`pj.mask` called with ints): `fun` runs on the arguments
  sliced to their logical shapes, as plain JAX, so an empty sum is 0, an empty
  mean NaN, and `jnp.max` of an empty array raises JAX's (NumPy's) ValueError.
  Its outputs are padded with zeros to the masked outputs' padded shapes.
* **Traced sizes** (`jax.jit(pj.mask(f))`, `pj.vmap` over a `pj.Ragged`): for
  every set Z of sizes that may be 0 together, `fun` is traced once more with
  the dims of Z constant 0 (their axes sliced to their empty length) and the
  other sizes symbolic (a `Masked` of its own, `EmptyPaths.child`, which is
  only ever run with those sizes >= 1). The program selects, from which sizes
  are 0, the main trace (run with every size raised to >= 1, so it stays in
  its domain) or the path of Z (`lax.switch`; a select under `vmap`, where
  each path sees its inputs through `where(selected, x, stop_gradient(x))`, so
  a path that was not selected sends no gradient, NaN included). A path whose
  trace fails (JAX raises for those empty shapes, as `jnp.max` does) is
  *poisoned* where it is selected (`size_range.guard`), as any size outside
  [0, padded]: never a plausible number. A path JAX computes but cannot
  reverse-differentiate (a `while_loop`) gives its values, exact, its
  forward-mode derivatives where JAX lowers its JVP (FORWARD,
  `forward_only.py`) and NaN reverse-mode ones; where not even its JVP
  lowers (a gather's derivative at size 0), NaN derivatives
  (`size_range.without_derivative`): poisoning it whole made a forward call
  NaN where the example alone gives a number.

Not covered (poisoned at 0, as before): functions that create data-dependent
sizes, more than `MAX_EMPTY_SIZES` sizes, a dimension expression mixing a size
that is 0 with one that is not (`n + m`), and constraints that mention a size
that is 0.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import dims as _dims, forward_only as _forward_only, size_range as _size_range
from . import spec as _spec
from .. import _jax as jc
from .errors import MaskingError, PerformanceWarning, warn_user_code

MAX_EMPTY_SIZES = 3   # sizes that may be 0 together: 2**3 - 1 empty paths at most


def _slice_to(x: Any, shape: Sequence[int]) -> Any:
  if tuple(np.shape(x)) == tuple(shape):
    return x
  return x[tuple(slice(0, s) for s in shape)]


def pad_to(x: Any, shape: Sequence[int]) -> Any:
  """`x` padded with zeros at the end of each axis up to `shape`."""
  have = np.shape(x)
  if tuple(have) == tuple(shape):
    return x
  return jnp.pad(x, [(0, s - h) for h, s in zip(have, shape, strict=True)])


def _axis_spec(d: Any, zero: frozenset[str]) -> tuple[str, int | None] | None:
  """(spec text, length to slice to or None) for one axis with the sizes of
  `zero` at 0; None when its expression mixes them with other sizes."""
  if not jc.is_symbolic_dim(d):
    return "_", None
  names = _dims.dim_vars(d)
  if not names & zero:
    return str(d), None
  if not names <= zero:
    return None
  length = _dims.evaluate_dim(d, {v: 0 for v in names})
  return ("_", int(length)) if length >= 0 else None


def _spec_text(parts: Sequence[str]) -> str:
  return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


class EmptyPaths:
  """The empty paths of one masked function (cached per argument structure)."""

  def __init__(self, masked: Any, make: Callable[..., Any]) -> None:
    self._masked = masked
    self._make = make   # pj.mask's class (mask.py imports this module, not the reverse)
    self._children: dict[Any, Any] = {}
    # (sizes at 0, argument shapes, config) -> what the path gives (`_usable`)
    self.usable: dict[Any, str | None] = {}

  def child(self, binding: _spec.Binding, tree: Any, zero: frozenset[str]
            ) -> tuple[Any, list[tuple[int, ...]]] | None:
    """`fun` masked with the sizes of `zero` constant 0, and each argument
    leaf's shape sliced for it; None where no such trace can be made."""
    parent = self._masked
    if any(_dims.dim_vars(diff) & zero for _, _, diff in jc.scope_constraints(parent.scope)):
      return None
    specs, shapes = [], []
    for leaf in binding.leaves:
      axes = [_axis_spec(d, zero) for d in leaf.symbolic_shape]
      if any(a is None for a in axes):
        return None
      specs.append(_spec_text([a[0] for a in axes if a is not None]))
      shapes.append(tuple(size if a is None or a[1] is None else a[1]
                          for a, size in zip(axes, leaf.padded_shape, strict=True)))
    # One Masked per specs, whatever the padded sizes: its traces are reused.
    key = (tree, zero, tuple(specs))
    child = self._children.get(key)
    if child is None:
      child = self._make(parent.fun, list(jax.tree.unflatten(tree, specs)),
                         constraints=parent.constraints)
      child.empty_paths = None   # run only where its own sizes are >= 1
      self._children[key] = child
    return child, shapes


def logical(masked: Any, args: Sequence[Any], binding: _spec.Binding,
            sizes: dict[str, int]) -> Any:
  """`fun` at concrete sizes, on the arguments sliced to their logical
  shapes, as plain JAX (its errors are JAX's)."""
  leaves, tree = jax.tree.flatten(tuple(args))
  # (as JAX arrays, which a masked trace would have given `fun`: `x.at[...]`)
  sliced = [jnp.asarray(_slice_to(x, [_dims.evaluate_dim(d, sizes) for d in leaf.symbolic_shape]))
            for x, leaf in zip(leaves, binding.leaves, strict=True)]
  return masked.fun(*jax.tree.unflatten(tree, sliced))


def logical_shapes(masked: Any, args: Sequence[Any], binding: _spec.Binding,
                   sizes: dict[str, int]) -> Any:
  """The outputs' shapes at concrete sizes of which some are 0."""
  outs = jax.eval_shape(lambda: logical(masked, args, binding, sizes))
  return jax.tree.map(lambda o: tuple(np.shape(o)), outs)


def padded_out_shapes(masked: Any, args: Sequence[Any], binding: _spec.Binding
                      ) -> tuple[Any, list[tuple[int, ...]]]:
  """(output tree, padded shape of each output leaf) as a call at the padded
  sizes makes them (a rule may pad wider than the output's shape there)."""
  sizes = dict(binding.padded)
  traced = masked.variant_for(args, sizes, binding).traced
  if 0 in sizes.values():   # (arguments padded to nothing: their own shapes)
    return traced.out_tree, [tuple(_dims.evaluate_dim(d, sizes) for d in a.shape)
                             for a in traced.out_avals]
  outs = jax.eval_shape(lambda a: masked.call_with_sizes(a, sizes)[0], list(args))
  return traced.out_tree, [tuple(np.shape(o)) for o in jax.tree.leaves(outs)]


def concrete(masked: Any, args: Sequence[Any], binding: _spec.Binding,
             sizes: dict[str, int]) -> Any:
  """`fun` at concrete sizes of which some are 0 (`logical`), its outputs
  padded to the masked outputs' padded shapes (a pytree like them)."""
  outs = jax.tree.leaves(logical(masked, args, binding, sizes))
  tree, padded = padded_out_shapes(masked, args, binding)
  if len(outs) != len(padded) or any(
      np.ndim(o) != len(p) or any(h > q for h, q in zip(np.shape(o), p, strict=True))
      for o, p in zip(outs, padded, strict=True)):
    raise MaskingError(
        f"{masked._name} returns outputs at empty sizes {sizes} whose shapes do not fit "
        f"the padded outputs ({[np.shape(o) for o in outs]} against {padded}).\nWhat to "
        "do: leave empty examples out for this function.")
  return jax.tree.unflatten(tree, [pad_to(o, s) for o, s in zip(outs, padded, strict=True)])


def selected(masked: Any, args: Sequence[Any], binding: _spec.Binding,
             env: dict[str, Any], main: Callable[[list[Any], dict[str, Any]], list[Any]],
             out_avals: Sequence[Any]) -> tuple[list[Any], list[list[Any]], Any]:
  """(outputs, their logical shapes, ok) at traced sizes that may be 0: the
  main trace where every size is >= 1, else the empty path of the sizes that
  are 0. `ok` is False where that path could not be traced (then poisoned)."""
  names = list(binding.dim_names)
  leaves, tree = jax.tree.flatten(tuple(args))
  dtype = jc.dim_value_dtype()
  one = np.asarray(1, dtype)
  # A size a declared constraint mentions (`constraints=["n >= 1"]`) has no
  # empty path (`EmptyPaths.child`): at 0 it is poisoned, and without a path
  # to select it needs no per-example select of the shared inputs either.
  constrained = set().union(*(_dims.dim_vars(diff) & set(names)
                              for _, _, diff in jc.scope_constraints(masked.scope)))
  free = [k for k in names if k not in constrained]
  subsets = ([] if len(free) > MAX_EMPTY_SIZES else
             [frozenset(c) for r in range(1, len(free) + 1)
              for c in itertools.combinations(free, r)])
  # Which sizes are 0, as an index: 0 for none, else 1 + the subset's position.
  zeros = [env[k] == 0 for k in names]
  constrained_nonzero = jnp.bool_(True)
  for k, z in zip(names, zeros, strict=True):
    if k in constrained:
      constrained_nonzero = constrained_nonzero & ~z
  index = jnp.int32(0)
  for i, zero in enumerate(subsets):
    hit = jnp.bool_(True)
    for k, z in zip(names, zeros, strict=True):
      hit = hit & (z if k in zero else ~z)
    index = jnp.where(hit, jnp.int32(i + 1), index)

  if subsets:
    _announce_per_example(masked, index, leaves)

  def guarded(i: int, xs: list[Any]) -> list[Any]:
    # A path that was not selected sends no gradient (a select drops its NaN).
    return [jnp.where(index == i, x, jax.lax.stop_gradient(x))
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else x for x in xs]

  # The main trace, run with every size raised to >= 1 (its domain), always:
  # its padded output shapes are what the rules make, which every path fills.
  raised = {k: jnp.maximum(v, one) for k, v in env.items()}
  main_outs = main(guarded(0, list(leaves)) if subsets else list(leaves), raised)
  main_shapes = [jnp.stack([jnp.asarray(_dims.evaluate_dim(d, raised), dtype) for d in a.shape])
                 if a.shape else jnp.zeros((0,), dtype) for a in out_avals]
  if not subsets:   # too many sizes for a path per set of empty ones: poisoned at 0
    nonzero = jnp.bool_(True)
    for z in zeros:
      nonzero = nonzero & ~z
    return list(main_outs), _split(main_shapes), nonzero
  padded_shapes = [tuple(np.shape(o)) for o in main_outs]

  def main_branch(xs: list[Any], env: dict[str, Any]) -> tuple[list[Any], list[Any], Any]:
    return list(main_outs), main_shapes, jnp.bool_(True)

  def path(i: int, run: Callable[..., Any]) -> Callable[..., Any]:
    return lambda xs, env: run(guarded(i, xs), env)

  branches: list[Callable[..., Any]] = [main_branch] + [
      path(i + 1, _empty_branch(masked, binding, tree, zero, padded_shapes, out_avals))
      for i, zero in enumerate(subsets)]
  outs, shapes, ok = jax.lax.switch(index, branches, list(leaves), env)
  return list(outs), _split(shapes), ok & constrained_nonzero


#: The functions whose per-example shared inputs were announced (by id; the
#: entry keeps the function alive, so the id is not reused).
_announced: dict[int, Any] = {}


def _announce_per_example(masked: Any, index: Any, leaves: Sequence[Any]) -> None:
  """A `pj.PerformanceWarning`, once per masked function, where the path is
  chosen per example under `jax.vmap` (the sizes are batched) and an input
  every example shares goes through the select of `guarded`: that makes it,
  and its gradient, one copy per example."""
  trace = jc.vmap_trace_of(index)
  if trace is None or _announced.get(id(masked)) is masked:
    return
  shared = [x for x in leaves if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
            and jc.vmap_trace_of(x) is not trace]
  if not shared:
    return
  _announced[id(masked)] = masked
  what = ", ".join(jc.typeof(x).str_short() for x in shared[:4])
  warn_user_code(
      f"polyjit: {masked._name} runs under vmap with sizes that may be 0, so each example "
      "selects between its computation and an empty example's path, and the inputs "
      f"every example shares ({what}) are copied once per example, their gradients too "
      "(slow and memory-hungry for an embedding table or a weight matrix).\nWhat to do: "
      "pass pj.vmap a pj.Ragged whose lengths are known to be >= 1 when it is built "
      "(pj.Ragged.from_list, or lengths as a NumPy array), or give pj.mask the "
      "constraint that sizes are >= 1 (pj.mask(f, specs, constraints=['n >= 1'])): "
      "then no empty path runs; or, "
      "if the cost is acceptable, filter this warning: "
      "warnings.filterwarnings('ignore', category=pj.PerformanceWarning).",
      PerformanceWarning)


def _split(shapes: Sequence[Any]) -> list[list[Any]]:
  return [[s[i] for i in range(np.shape(s)[0])] for s in shapes]


def _empty_branch(masked: Any, binding: _spec.Binding, tree: Any, zero: frozenset[str],
                  padded_shapes: Sequence[tuple[int, ...]], out_avals: Sequence[Any]
                  ) -> Callable[..., Any]:
  """The path for the sizes of `zero` at 0 (a failed one outputs zeros, not ok)."""
  return empty_path(masked, binding, tree, zero, padded_shapes, out_avals)[0]


def empty_path(masked: Any, binding: _spec.Binding, tree: Any, zero: frozenset[str],
               padded_shapes: Sequence[tuple[int, ...]], out_avals: Sequence[Any]
               ) -> tuple[Callable[..., Any], Callable[[list[Any], dict[str, Any]], bool]]:
  """(the path for the sizes of `zero` at 0, a failed one outputting zeros and
  not ok; whether it works at these arguments, known while tracing: the
  packed `pj.vmap` poisons its outputs by it, `_ragged/packed_vmap.py`)."""
  made = masked.empty_paths.child(binding, tree, zero) if masked.empty_paths else None
  dtype = jc.dim_value_dtype()

  def failed(xs: list[Any], env: dict[str, Any]) -> tuple[list[Any], list[Any], Any]:
    outs = [jc.zeros(s, a.dtype) for s, a in zip(padded_shapes, out_avals, strict=True)]
    shapes = [jnp.zeros((len(a.shape),), dtype) for a in out_avals]
    return outs, shapes, jnp.bool_(False)

  if made is None:
    return failed, lambda xs, env: False
  child, shapes_in = made
  one = np.asarray(1, dtype)

  def run(xs: list[Any], env: dict[str, Any]) -> tuple[list[Any], list[Any], Any]:
    sliced = [_slice_to(x, s) for x, s in zip(xs, shapes_in, strict=True)]
    args = jax.tree.unflatten(tree, sliced)
    rest = {k: jnp.maximum(v, one) for k, v in env.items() if k not in zero}
    child_binding = child.bind(list(args))
    rest = {k: rest[k] for k in child_binding.dim_names}
    outs, sizes = child.call_with_sizes(list(args), rest)
    if sizes is not None:
      raise _Unfit()
    out_leaves = jax.tree.leaves(outs)
    traced = child.trace(list(args), child_binding)
    if len(out_leaves) != len(out_avals) or any(
        np.ndim(o) != len(a.shape) or jnp.result_type(o) != a.dtype
        or any(h > s for h, s in zip(np.shape(o), p, strict=True))
        for o, a, p in zip(out_leaves, out_avals, padded_shapes, strict=True)):
      raise _Unfit()
    shapes = [jnp.stack([jnp.asarray(_dims.evaluate_dim(d, rest), dtype) for d in a.shape])
              if a.shape else jnp.zeros((0,), dtype) for a in traced.out_avals]
    return ([pad_to(o, p) for o, p in zip(out_leaves, padded_shapes, strict=True)],
            shapes, jnp.bool_(True))

  def verdict_at(xs: list[Any], env: dict[str, Any]) -> str | None:
    structs = ([_struct(x) for x in xs], {k: _struct(v) for k, v in env.items()})
    key = (zero, tuple(sorted(env)), tuple((a.shape, str(a.dtype), a.weak_type)
                                           for a in jax.tree.leaves(structs)),
           jc.trace_context())   # (a trace: keyed as jax.jit keys its traces)
    assert masked.empty_paths is not None
    cache = masked.empty_paths.usable
    if key not in cache:
      cache[key] = _usable(run, structs)
    verdict: str | None = cache[key]
    return verdict

  def usable(xs: list[Any], env: dict[str, Any]) -> bool:
    return verdict_at(xs, env) is not None

  def value_only(xs: list[Any], env: dict[str, Any], forward: bool
                 ) -> tuple[list[Any], list[Any], Any]:
    # JAX computes this path but cannot reverse-differentiate it (a
    # while_loop, a gather's VJP at size 0): its values, with its forward-mode
    # derivatives (`forward`: where JAX lowers its JVP) or NaN ones
    inexact = [jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in xs]
    outs, shapes, ok = run([jax.lax.stop_gradient(x) if f else x
                            for x, f in zip(xs, inexact, strict=True)], env)
    floats = [i for i, o in enumerate(outs) if jnp.issubdtype(o.dtype, jnp.inexact)]
    inputs = [x for x, f in zip(xs, inexact, strict=True) if f and isinstance(x, jc.Tracer)]
    if floats and inputs:
      kept = [outs[i] for i in floats]
      if forward:
        keys = sorted(env)
        differentiable = tuple(i for i, f in enumerate(inexact) if f)
        tangents = _forward_only.path_tangents(run, len(xs), keys, differentiable, floats)
        kept = _forward_only.with_forward_derivative(
            tangents, kept, list(xs), [jnp.asarray(env[k]) for k in keys], differentiable)
      else:
        kept = _size_range.without_derivative(kept, inputs)
      outs = list(outs)
      for i, o in zip(floats, kept, strict=True):
        outs[i] = o
    return outs, shapes, ok

  def checked(xs: list[Any], env: dict[str, Any]) -> tuple[list[Any], list[Any], Any]:
    verdict = verdict_at(xs, env)
    if verdict == ALL:
      return run(xs, env)
    if verdict in (FORWARD, VALUES):
      return value_only(xs, env, verdict == FORWARD)
    return failed(xs, env)
  return checked, usable


def _struct(x: Any) -> Any:
  """`x`'s abstract value, its dtype as it is (a `jax.ShapeDtypeStruct` would
  make a float64 one float32 with x64 off: `jc.make_closed_jaxpr`)."""
  aval = jc.typeof(x)
  return jc.shaped(np.shape(x), aval.dtype, aval.weak_type)


#: What an empty path gives (`_usable`): its values and derivatives; its
#: values and forward-mode derivatives (reverse-mode ones NaN); or its values
#: with NaN derivatives (None: neither, poisoned).
ALL, FORWARD, VALUES = "values and derivatives", "values and forward derivatives", "values"


def _usable(run: Callable[..., Any], structs: tuple[Any, Any]) -> str | None:
  """Whether an empty path traces and lowers (JAX refuses `jnp.max` of an
  empty array when tracing, an FFT of one when lowering: JAX raises there
  too) and has no effect that must not run twice (an io_callback would run on
  the empty arrays, and cannot be selected under vmap): then whether its VJP
  traces too (ALL; the program's derivatives transpose this path) or not:
  then whether its JVP lowers (FORWARD: a while_loop; its values and
  forward-mode derivatives exact, reverse-mode ones NaN) or not (VALUES: a
  gather's derivative at size 0: its values are still exact, its
  derivatives NaN)."""
  def derivative(xs: list[Any], env: dict[str, Any]) -> Any:
    # (the program's derivatives transpose this path too: its VJP must trace)
    outs, pullback = jax.vjp(lambda *a: run(list(a), env)[0], *xs)
    return pullback([jnp.zeros_like(o) if jnp.issubdtype(o.dtype, jnp.inexact)
                     else np.zeros(np.shape(o), jax.dtypes.float0) for o in outs])

  def forward(xs: list[Any], env: dict[str, Any]) -> Any:
    inexact = [i for i, x in enumerate(xs) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    def on(*values: Any) -> Any:
      full = list(xs)
      for i, v in zip(inexact, values, strict=True):
        full[i] = v
      return run(full, env)[0]
    primals = [xs[i] for i in inexact]
    return jax.jvp(on, primals, [jnp.zeros_like(x) for x in primals])

  try:
    traced = jax.jit(run).trace(*structs)
    if jc.replay_unsafe_effects(traced.jaxpr.jaxpr):
      return None
    traced.lower()
  except jc.JaxBoundaryError:
    raise
  except Exception:
    return None
  try:
    jax.eval_shape(derivative, *structs)
  except jc.JaxBoundaryError:
    raise
  except Exception:
    try:   # (lowered: a JVP can trace and fail to lower, a gather's at size 0)
      jax.jit(forward).trace(*structs).lower()
    except jc.JaxBoundaryError:
      raise
    except Exception:
      return VALUES
    return FORWARD
  return ALL


class _Unfit(Exception):
  """An empty path whose outputs do not fit the main trace's."""
