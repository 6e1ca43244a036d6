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
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np

from .. import _jax as jc
from .auto import fit_to_constraints
from .._masking.errors import ShapeError
from .args import strip_padded
from .plans import (Plan, ProgramKey, Structure, abstract_leaves, exact_body, logical_values,
                    masked_body, out_shapes, padded_shapes, waste, zero_sized)
from .stats import Cause
from .._masking.padding import is_padded, unpad

if TYPE_CHECKING:
  from .function import JitFunction


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

  def __init__(self, jf: JitFunction, program: _Program, jax_traced: Any):
    self._jf, self._program, self.jax_traced = jf, program, jax_traced

  jaxpr = property(lambda self: self.jax_traced.jaxpr)
  fun_name = property(lambda self: getattr(self._jf.fun, "__name__", "fun"))
  out_info = property(lambda self: self._program.out_info())
  bucket = property(lambda self: self._program.bucket,
                    doc="dimension -> padded size; None for an exact-shape program")
  padded_shapes = property(lambda self: self._program.key.padded_shapes)

  def lower(self) -> Lowered:
    return Lowered(self._jf, self._program, self.jax_traced.lower())


class Lowered:
  """`pj.jit(f).lower(*args)`: the bucket program lowered, not yet compiled."""

  def __init__(self, jf: JitFunction, program: _Program, jax_lowered: Any):
    self._jf, self._program, self.jax_lowered = jf, program, jax_lowered

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
    jf, p = self._jf, self._program
    executable = jf._cache.get(p.key, lambda: jf._compile(p.key, p.body, p.struct, p.cause,
                                                          p.n_dims))
    return Compiled(jf, p, executable)


class Compiled:
  """`pj.jit(f).lower(*args).compile()`: call it on the same arguments."""

  def __init__(self, jf: JitFunction, program: _Program, jax_compiled: Any):
    self._jf, self._program, self.jax_compiled = jf, program, jax_compiled

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
    prepared = self._jf._prepare(args, kwargs)
    if prepared is None:
      raise TypeError("a pj.jit Compiled cannot be called inside a JAX transformation; "
                      "call the pj.jit function itself there.")
    struct, leaves, shapes = prepared
    if struct.key != p.struct.key or tuple(shapes) != tuple(p.shapes):
      raise ShapeError(
          f"this Compiled of {self._jf!r} serves arguments of shapes {list(p.shapes)} "
          f"(and their dtypes and static values); it was called with {list(shapes)}. "
          f"What to do: call {self._jf!r} itself, which runs every size (and reuses this "
          "bucket's program), or lower again for these arguments.")
    plan = Plan(p.key, self.jax_compiled, struct.dtypes, p.logical, p.out_shapes,
                waste(shapes, p.key.padded_shapes))
    return plan.map_outputs(plan.run(leaves), unpad)


# --- entry points ---------------------------------------------------------------

def trace(jf: JitFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Traced:
  program = _program(jf, args, kwargs)
  body = program.body
  body.__name__ = jf._name
  donate = jf._args.donated_leaves(program.struct.treedef, program.struct.static_key)
  # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
  size_avals = tuple(jax.ShapeDtypeStruct((), jc.dim_value_dtype())  # type: ignore[no-untyped-call, unused-ignore]
                     for _ in range(program.n_dims))
  jax_traced = jax.jit(body, donate_argnums=donate).trace(
      *abstract_leaves(program.key.padded_shapes, program.struct.avals), size_avals)
  return Traced(jf, program, jax_traced)


def lower(jf: JitFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lowered:
  return trace(jf, args, kwargs).lower()


def eval_shape(jf: JitFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
  """`jax.jit(f).eval_shape(*args, **kwargs)`, learning and compiling nothing."""
  known = set(jf._structures)
  struct, _, shapes = _prepare_abstract(jf, args, kwargs)
  if struct.key not in known:  # a structure starts learning at its first call, not here
    del jf._structures[struct.key]
  if (struct.specs is not None and not struct.exact_only
      and not zero_sized(struct.specs, shapes)):
    try:
      _, binding, variant = jf._variant(struct, shapes)
    except Exception:  # noqa: BLE001  JAX's own evaluation decides (and raises)
      variant = None
    if variant is not None:
      out_dims = [a.shape for a in variant.traced.out_avals]
      return variant.traced.out_tree.unflatten([
          # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
          jax.ShapeDtypeStruct(s, a.dtype, weak_type=a.weak_type) for s, a in  # type: ignore[no-untyped-call, unused-ignore]
          zip(out_shapes(out_dims, binding.padded), variant.traced.out_avals, strict=True)])
  # jax.jit(...).eval_shape carries no annotations (strict only)
  return jax.jit(jf.fun, static_argnums=jf.static_argnums or None,  # type: ignore[no-untyped-call, unused-ignore]
                 static_argnames=jf.static_argnames or None).eval_shape(
                     *strip_padded(args), **strip_padded(kwargs))


# --- planning without running ---------------------------------------------------

def _abstract(x: Any) -> Any:
  """A leaf as an abstract value: tracers and arrays become ShapeDtypeStructs."""
  if is_padded(x) or isinstance(x, jax.ShapeDtypeStruct):
    return x
  aval = jax.typeof(x)
  # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
  return jax.ShapeDtypeStruct(np.shape(x), aval.dtype, weak_type=aval.weak_type)  # type: ignore[no-untyped-call, unused-ignore]


def _prepare_abstract(jf: JitFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
  """`jf._prepare` on abstract arguments (tracers allowed; static ones kept)."""
  nums = {a % len(args) for a in jf.static_argnums if -len(args) <= a < len(args)}
  args = tuple(a if i in nums else jax.tree.map(_abstract, a, is_leaf=is_padded)
               for i, a in enumerate(args))
  kwargs = {k: v if k in jf.static_argnames else jax.tree.map(_abstract, v, is_leaf=is_padded)
            for k, v in kwargs.items()}
  return jf._prepare(args, kwargs)


def _program(jf: JitFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Program:
  """The program a call with these arguments would run; plans as that call
  would (so automatic mode learns from these shapes), compiles nothing."""
  struct, _, shapes = _prepare_abstract(jf, args, kwargs)
  plan = struct.plan(shapes)
  if plan is not None:  # a call already planned these shapes
    if plan.key.exact:
      return _exact(jf, struct, shapes, Cause("precompile", shapes=shapes))
    return _masked(jf, struct, shapes, Cause("precompile", shapes=shapes))
  changed, became = struct.observe(shapes)

  def why(kind: Any, **kw: Any) -> Cause:
    return Cause(kind, shapes=shapes, changed=changed, became_dynamic=became, **kw)
  if struct.specs is None or struct.exact_only:
    kind = "fallback" if struct.exact_only else ("exact" if changed else "first call")
    return _exact(jf, struct, shapes, why(kind, error=struct.fallback_reason))
  if zero_sized(struct.specs, shapes):
    return _exact(jf, struct, shapes, why("zero size"))
  try:
    return _masked(jf, struct, shapes, why("bucket"))
  except Exception as e:
    if struct.tracker is None and not getattr(jf, "_specs_may_fall_back", False):
      raise  # explicit specs: the user asked for masking
    jf._fall_back(struct, e)
    return _exact(jf, struct, shapes, why("fallback", error=struct.fallback_reason))


def _exact(jf: JitFunction, struct: Structure, shapes: tuple[Any, ...], cause: Cause) -> _Program:
  fun = jf._args.bind_static(struct.static_key)
  out = jax.eval_shape(lambda *leaves: exact_body(struct.treedef, fun)(*leaves, ()),
                       *abstract_leaves(shapes, struct.avals))
  leaves, tree = jax.tree.flatten(out)
  return _Program(struct, tuple(shapes), ProgramKey.exact_shapes(struct, shapes),
                  exact_body(struct.treedef, fun), 0, (), None, tree,
                  tuple((o.shape, o.dtype, o.weak_type) for o in leaves), cause)


def _masked(jf: JitFunction, struct: Structure, shapes: tuple[Any, ...], cause: Cause) -> _Program:
  masked, binding, variant = jf._variant(struct, shapes)
  logical = binding.padded  # solved from the unpadded shapes: the logical sizes
  env = fit_to_constraints(logical, jf._call_bucket(struct, binding, variant, logical),
                           variant.scope)
  cause = dataclasses.replace(cause, bucket=dict(env), sizes=dict(logical))
  key = ProgramKey.masked(struct, variant, padded_shapes(binding, env), env)
  traced = variant.traced
  out_dims = tuple(a.shape for a in traced.out_avals)
  return _Program(struct, tuple(shapes), key, masked_body(struct.treedef, masked, variant, env),
                  len(binding.dim_names), logical_values(binding, logical),
                  out_shapes(out_dims, logical), traced.out_tree,
                  tuple((None, a.dtype, a.weak_type) for a in traced.out_avals), cause)

