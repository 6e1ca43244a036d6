"""`pj.jit`'s ahead-of-time API: `trace`, `lower`, `compile`, `eval_shape`.

`jax.jit(f).lower(*args)` lowers the program `jax.jit(f)(*args)` would run.
The same holds here: `pj.jit(f).lower(*args)` plans exactly as a call with
those arguments does (in automatic mode it learns from their shapes, as a
call would) and lowers the program that call runs: the *bucket program* at
the padded shapes, which takes the padded arguments plus one int32 logical
size per dimension, or `jax.jit`'s own program at the exact shapes when the
call would run that (automatic mode's first call, a fallback, an empty axis).
Nothing is compiled before `compile()`, and `compile()` goes through the
function's executable cache: a program that a call already compiled is not
compiled again, and a program compiled here serves later calls.

The stages mirror `jax.stages` (`Traced` -> `Lowered` -> `Compiled`):
`jaxpr`, `as_text()`, `compiler_ir()` and `cost_analysis()` describe the
bucket program (padded shapes); `out_info` is what a call returns (the
logical shapes, as `jax.jit(f)` gives them); calling a `Compiled` on the
arguments it was lowered for gives `jax.jit(f)`'s result. The underlying
`jax.stages` objects are `.jax_traced`, `.jax_lowered`, `.jax_compiled`.

`eval_shape` returns `jax.jit(f).eval_shape(*args)`: from the symbolic trace
when the structure already has dynamic axes (no retrace for a new size),
else from JAX's own abstract evaluation. It learns nothing and compiles
nothing.

The stages plan and compile through the function's `Planner` (`planner.py`)
and its `Compiler` (`compile.py`), by their public methods: `prepare`,
`decide` (the decision a call makes), `variant`, `call_bucket`, and
`compiler.cached`. Nothing here reaches into `JitFunction`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np

from .. import _jax as jc
from .auto import fit_to_constraints
from .._masking.errors import ShapeError
from .args import strip_padded
from .plans import (Plan, ProgramKey, Structure, abstract_leaves, exact_body, logical_values,
                    masked_body, out_shapes, padded_shapes, waste, zero_sized)
from .planner import Planner, Prepared
from .stats import Cause
from .._masking.padding import is_padded
from .._sharding.placement import unpad


@dataclasses.dataclass
class _Program:
  """The program a call with given arguments runs, before it is compiled."""
  struct: Structure
  shapes: tuple[Any, ...]        # per leaf, the call's (logical) shape
  key: ProgramKey
  body: Callable[..., Any]
  n_dims: int                    # logical sizes the program takes
  logical: tuple[Any, ...]       # their values for these arguments
  out_shapes: tuple[Any, ...] | None  # per output leaf, logical shape (None: exact)
  out_tree: Any
  out_avals: tuple[Any, ...]     # per output leaf, (dtype, weak_type)
  cause: Cause

  @property
  def bucket(self) -> dict[str, int] | None:
    return None if self.key.exact else dict(self.key.bucket)

  def out_info(self) -> Any:
    shapes = self.out_shapes or [None] * len(self.out_avals)
    return self.out_tree.unflatten([
        # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
        jax.ShapeDtypeStruct(s if s is not None else shape, dtype, weak_type=weak)  # type: ignore[no-untyped-call, unused-ignore]
        for s, (shape, dtype, weak) in zip(shapes, self.out_avals, strict=True)])


# --- the stages -----------------------------------------------------------------

class Traced:
  """`pj.jit(f).trace(*args)`: the bucket program traced for these arguments."""

  def __init__(self, planner: Planner, program: _Program, jax_traced: Any):
    self._planner, self._program, self.jax_traced = planner, program, jax_traced

  jaxpr = property(lambda self: self.jax_traced.jaxpr)
  fun_name = property(lambda self: getattr(self._planner.fun, "__name__", "fun"))
  out_info = property(lambda self: self._program.out_info())
  bucket = property(lambda self: self._program.bucket,
                    doc="dimension -> padded size; None for an exact-shape program")
  padded_shapes = property(lambda self: self._program.key.padded_shapes)

  def lower(self) -> Lowered:
    return Lowered(self._planner, self._program, self.jax_traced.lower())


class Lowered:
  """`pj.jit(f).lower(*args)`: the bucket program lowered, not yet compiled."""

  def __init__(self, planner: Planner, program: _Program, jax_lowered: Any):
    self._planner, self._program, self.jax_lowered = planner, program, jax_lowered

  out_info = Traced.out_info
  bucket = Traced.bucket
  padded_shapes = Traced.padded_shapes

  def as_text(self, dialect: str | None = None, **kwargs: Any) -> str:
    return str(self.jax_lowered.as_text(dialect, **kwargs))

  def compiler_ir(self, dialect: str | None = None) -> Any:
    return self.jax_lowered.compiler_ir(dialect)

  def cost_analysis(self) -> Any:
    return self.jax_lowered.cost_analysis()

  def compile(self) -> Compiled:
    """The compiled program, from the function's cache or compiled now (and
    then kept there for later calls)."""
    p = self._program
    executable = self._planner.compiler.cached(p.key, p.body, p.struct, p.cause, p.n_dims)
    return Compiled(self._planner, p, executable)


class Compiled:
  """`pj.jit(f).lower(*args).compile()`: call it on the same arguments."""

  def __init__(self, planner: Planner, program: _Program, jax_compiled: Any):
    self._planner, self._program, self.jax_compiled = planner, program, jax_compiled

  out_info = Traced.out_info
  bucket = Traced.bucket
  padded_shapes = Traced.padded_shapes

  def as_text(self) -> str:
    return str(self.jax_compiled.as_text())

  def cost_analysis(self) -> Any:
    return self.jax_compiled.cost_analysis()

  def memory_analysis(self) -> Any:
    return self.jax_compiled.memory_analysis()

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    p = self._program
    prepared = self._planner.prepare(args, kwargs)
    if prepared is None:
      raise TypeError("a pj.jit Compiled cannot be called inside a JAX transformation; "
                      "call the pj.jit function itself there.")
    struct, leaves, shapes = prepared
    if struct.key != p.struct.key or tuple(shapes) != tuple(p.shapes):
      raise ShapeError(
          f"this Compiled of {self._planner.label} serves arguments of shapes {list(p.shapes)} "
          f"(and their dtypes and static values); it was called with {list(shapes)}. "
          f"What to do: call {self._planner.label} itself, which runs every size (and reuses this "
          "bucket's program), or lower again for these arguments.")
    plan = Plan(p.key, self.jax_compiled, struct.dtypes, p.logical, p.out_shapes,
                waste(shapes, p.key.padded_shapes))
    return plan.map_outputs(plan.run(leaves), unpad)


# --- entry points ---------------------------------------------------------------

def trace(planner: Planner, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Traced:
  program = _program(planner, args, kwargs)
  body = program.body
  body.__name__ = planner.compiler.name
  donate = planner.compiler.donated(program.struct)
  # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
  size_avals = tuple(jax.ShapeDtypeStruct((), jc.dim_value_dtype())  # type: ignore[no-untyped-call, unused-ignore]
                     for _ in range(program.n_dims))
  jax_traced = jax.jit(body, donate_argnums=donate).trace(
      *abstract_leaves(program.key.padded_shapes, program.struct.avals), size_avals)
  return Traced(planner, program, jax_traced)


def lower(planner: Planner, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lowered:
  return trace(planner, args, kwargs).lower()


def eval_shape(planner: Planner, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
  """`jax.jit(f).eval_shape(*args, **kwargs)`, learning and compiling nothing."""
  # A structure starts learning at its first call, not here: a new one is not kept.
  struct, _, shapes = _prepare_abstract(planner, args, kwargs, keep=False)
  if (struct.specs is not None and not struct.exact_only
      and not zero_sized(struct.specs, shapes)):
    try:
      _, binding, variant = planner.variant(struct, shapes)
    except Exception:  # noqa: BLE001  JAX's own evaluation decides (and raises)
      variant = None
    if variant is not None:
      out_dims = [a.shape for a in variant.traced.out_avals]
      return variant.traced.out_tree.unflatten([
          # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
          jax.ShapeDtypeStruct(s, a.dtype, weak_type=a.weak_type) for s, a in  # type: ignore[no-untyped-call, unused-ignore]
          zip(out_shapes(out_dims, binding.padded), variant.traced.out_avals, strict=True)])
  # jax.jit(...).eval_shape carries no annotations (strict only)
  return jax.jit(planner.fun, static_argnums=planner.args.static_argnums or None,  # type: ignore[no-untyped-call, unused-ignore]
                 static_argnames=planner.args.static_argnames or None).eval_shape(
                     *strip_padded(args), **strip_padded(kwargs))


# --- planning without running ---------------------------------------------------

def _abstract(x: Any) -> Any:
  """A leaf as an abstract value: tracers and arrays become ShapeDtypeStructs."""
  if is_padded(x) or isinstance(x, jax.ShapeDtypeStruct):
    return x
  aval = jax.typeof(x)
  # A committed array keeps its sharding: its placement is part of the call's
  # structure (`_sharding.placement`: one committed to another device than
  # the default runs there), so a program lowered without it would serve no
  # call with that array. An uncommitted one goes where jax.jit puts it.
  sharding = x.sharding if type(x) is jc.ARRAY_TYPE and x.committed else None
  # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
  return jax.ShapeDtypeStruct(np.shape(x), aval.dtype, weak_type=aval.weak_type,  # type: ignore[no-untyped-call, unused-ignore]
                              sharding=sharding)


def _prepare_abstract(planner: Planner, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                      keep: bool = True) -> Prepared:
  """`planner.prepare` on abstract arguments (tracers allowed; static ones kept)."""
  layout = planner.args
  nums = {a % len(args) for a in layout.static_argnums if -len(args) <= a < len(args)}
  args = tuple(a if i in nums else jax.tree.map(_abstract, a, is_leaf=is_padded)
               for i, a in enumerate(args))
  kwargs = {k: v if k in layout.static_argnames else jax.tree.map(_abstract, v, is_leaf=is_padded)
            for k, v in kwargs.items()}
  prepared = planner.prepare(args, kwargs, keep=keep)
  assert prepared is not None  # (abstract arguments, no tracers)
  return prepared


def _program(planner: Planner, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Program:
  """The program a call with these arguments would run; plans as that call
  would (so automatic mode learns from these shapes), compiles nothing."""
  struct, _, shapes = _prepare_abstract(planner, args, kwargs)
  plan = struct.plan(shapes)
  if plan is not None:  # a call already planned these shapes
    if plan.key.exact:
      return _exact(planner, struct, shapes, Cause("precompile", shapes=shapes))
    return _masked(planner, struct, shapes, Cause("precompile", shapes=shapes))
  return planner.decide(struct, shapes, functools.partial(_exact, planner, struct, shapes),
                        functools.partial(_masked, planner, struct, shapes))


def _exact(planner: Planner, struct: Structure, shapes: tuple[Any, ...], cause: Cause) -> _Program:
  fun = planner.bind_static(struct)
  out = jax.eval_shape(lambda *leaves: exact_body(struct.treedef, fun)(*leaves, ()),
                       *abstract_leaves(shapes, struct.avals))
  leaves, tree = jax.tree.flatten(out)
  return _Program(struct, tuple(shapes), ProgramKey.exact_shapes(struct, shapes),
                  exact_body(struct.treedef, fun), 0, (), None, tree,
                  tuple((o.shape, o.dtype, o.weak_type) for o in leaves), cause)


def _masked(planner: Planner, struct: Structure, shapes: tuple[Any, ...], cause: Cause) -> _Program:
  masked, binding, variant = planner.variant(struct, shapes)
  logical = binding.padded  # solved from the unpadded shapes: the logical sizes
  env = fit_to_constraints(logical, planner.call_bucket(struct, binding, variant, logical),
                           variant.scope)
  cause = dataclasses.replace(cause, bucket=dict(env), sizes=dict(logical))
  key = ProgramKey.masked(struct, variant, padded_shapes(binding, env), env)
  traced = variant.traced
  out_dims = tuple(a.shape for a in traced.out_avals)
  return _Program(struct, tuple(shapes), key, masked_body(struct.treedef, masked, variant, env),
                  len(binding.dim_names), logical_values(binding, logical),
                  out_shapes(out_dims, logical), traced.out_tree,
                  tuple((None, a.dtype, a.weak_type) for a in traced.out_avals), cause)
