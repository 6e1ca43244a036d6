"""`pj.jit` with data-dependent sizes: outputs at their exact size, one program per bucket.

A function that creates data-dependent sizes (`_masking/data_dependent.py`) has a
masked program that returns, besides its padded outputs, the sizes it
computed and whether every reduction without an identity had data. Its plan
(`DataDependentPlan`) cannot know the output shapes before the program runs,
so after each run it reads those few scalars back to the host in one
transfer, raises NumPy's error for an empty max, and slices each output to
its logical shape. The sizes never enter a program's key: one program per
input bucket, whatever the counts.

`jax.jit` cannot trace such a function at all (`NonConcreteBooleanIndexError`,
`ConcretizationTypeError`; `pj.nonzero` & co., which would give `size=`
semantics there, raise `NeedsPolyjitTrace`, see `plain_jit_trace`), so where
`pj.jit` would run `jax.jit`'s own program at exact shapes (the first call in automatic mode, an empty dynamic
axis), it runs the masked program with every axis fixed instead
(`exact_plan`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from .._masking.data_dependent import NeedsPolyjitTrace, mentions_size, raise_if_failed
# Re-exported explicitly: `planner.py` may import it from here (strict mypy's no_implicit_reexport).
from .._masking.data_dependent import plain_jit_trace as plain_jit_trace
from .plans import EXACT, Plan, ProgramKey, masked_body, out_shapes
from .._masking.mask import Masked

#: What `jax.jit` raises for `x[x > 0]`, `jnp.nonzero(x)`, `jnp.unique(x)`.
JAX_ERRORS = (jax.errors.NonConcreteBooleanIndexError, jax.errors.ConcretizationTypeError,
              NeedsPolyjitTrace)


class DataDependentPlan(Plan):
  """A plan whose output shapes are known only after its program ran."""
  __slots__ = ("out_dims", "sizes", "blocking", "sized")

  def __init__(self, key: ProgramKey, program: Any, dtypes: Any, logical: Any,
               out_dims: Any, sizes: dict[str, int], waste: float, provisional: Any = None,
               *, has_checks: bool | None = None, shapes: Any = None) -> None:
    super().__init__(key, program, dtypes, logical, None, waste, provisional, shapes=shapes)
    self.out_dims = out_dims            # per output leaf, its symbolic shape
    self.sizes = dict(sizes)            # the logical sizes of the inputs' dims
    # Read back only what is needed: sizes for outputs shaped by them, the
    # check code where the program checks (None: not known, so read).
    self.sized = any(mentions_size(d) for dims in out_dims for d in dims)
    self.blocking = has_checks is not False or self.sized

  def unpad_outputs(self, outs: Any) -> Any:
    return self.map_outputs(outs, self.unpad_leaf)   # shapes known only now: always look

  def map_outputs(self, outs: Any, convert: Callable[[Any, Any], Any]) -> Any:
    if not self.blocking:  # no output depends on a computed size: no transfer
      outs, _ = outs
      leaves, tree = jax.tree.flatten(outs)
      # jaxlib's PyTreeDef is not visible to mypy (a stub gap): its methods are unknown.
      return tree.unflatten([convert(o, s) for o, s in  # type: ignore[attr-defined]
                             zip(leaves, out_shapes(self.out_dims, self.sizes), strict=True)])
    outs, (created, failed) = outs
    if not self.sized:  # only checks: read the one code
      created, failed = {}, jax.device_get(failed)
    else:
      created, failed = jax.device_get((created, failed))   # one transfer per call
    raise_if_failed(failed)
    sizes = {**self.sizes, **{k: int(v) for k, v in created.items()}}
    leaves, tree = jax.tree.flatten(outs)
    # A size that would be negative on an empty selection (`y[1:]`) is 0.
    shapes = [tuple(max(0, d) for d in s) for s in out_shapes(self.out_dims, sizes)]
    # jaxlib's PyTreeDef is not visible to mypy (a stub gap): its methods are unknown.
    return tree.unflatten(  # type: ignore[attr-defined]
        [convert(o, s) for o, s in zip(leaves, shapes, strict=True)])


def is_data_dependent_error(error: BaseException) -> bool:
  """Whether `jax.jit` failed on a data-dependent size (or something like it:
  the masked trace that follows tells which)."""
  cause: BaseException | None = error
  while cause is not None:
    if isinstance(cause, JAX_ERRORS):
      return True
    cause = cause.__cause__
  return False


def exact_plan(struct: Any, shapes: Any, fun: Callable[..., Any],
               compile_program: Callable[..., Any]) -> Plan:
  """The plan that runs `fun` masked with every axis fixed at `shapes`.

  `compile_program(key, body) -> program` compiles (and records) it.
  """
  args = struct.abstract_args(shapes)
  masked = Masked(lambda a, k: fun(*a, **k), [None] * len(args))
  masked.__name__ = getattr(fun, "__name__", "fun")  # type: ignore[attr-defined]
  variant = masked.variant_for(args, {})
  key = ProgramKey(struct.key, EXACT, "data-dependent", tuple(shapes), ())
  program = compile_program(key, masked_body(struct.treedef, masked, variant, {}))
  out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
  if not variant.traced.size_names:
    return Plan(key, program, struct.dtypes, (), out_shapes(out_dims, {}), 0.0)
  return DataDependentPlan(key, program, struct.dtypes, (), out_dims, {}, 0.0,
                           has_checks=variant.traced.has_checks, shapes=shapes)


def plan_for(variant: Any, key: ProgramKey, program: Any, dtypes: Any,
             logical_values: tuple[Any, ...], logical: dict[str, int], waste: float,
             provisional: Any, shapes: Any = None) -> Plan | None:
  """The plan of a masked program that creates sizes; None when it creates none."""
  if not variant.traced.size_names:
    return None
  out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
  return DataDependentPlan(key, program, dtypes, logical_values, out_dims, logical,
                           waste, provisional, has_checks=variant.traced.has_checks,
                           shapes=shapes)
