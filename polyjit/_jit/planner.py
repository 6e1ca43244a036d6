"""From a `pj.jit` call's arguments to the plan that runs it, and the policy of it.

`Planner.prepare` flattens a call and finds its *structure* (`plans.py`:
static values, pytree, dtypes, ranks and, on a mesh, shardings). On a plan
miss (`plan_for`), the planner decides how the structure runs these shapes
(`decide`, one decision that calls and the ahead-of-time API share):

* jax.jit's own program at the exact shapes: automatic mode's first call
  (`_jit/auto.py`), an empty dynamic axis (a masked trace assumes sizes >= 1),
  or a structure that fell back;
* otherwise the masked program of the bucket the sizes fall in: the variant
  of `fun` these sizes select (`variant`, one per side of each size
  comparison), its bucket (`bucket_choice.py`), and its program
  (`compile.py`). A new size in a bucket that has a template reuses the
  bucket's plan resized (`fast_plan`);
* when `fun` cannot be masked in automatic mode (or with inferred
  annotations), the structure falls back to exact shapes and says so
  (`announce.py`: a `pj.FallbackWarning` once per cause, an error, or only the
  log, per `fallback=`). With explicit specs the error is raised.

The ahead-of-time stages (`aot.py`) plan through the same public methods:
`prepare`, `decide`, `variant`, `call_bucket`, and the compiler.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Sequence, TypeAlias, TypeVar

import numpy as np

from .. import _jax as jc
from .._caching import axes as _axes
from .._caching.executables import wait
from .._masking.data_dependent import plain_jit_trace
from .._masking.errors import PolyjitError, ShapeError
from .._masking.mask import Masked
from .._masking.padding import logical_shape
from .._masking.spec import Binding
from .._masking.variants import Variant
from .._sharding import placement as _sharding
from . import data_dependent
from .announce import Announcer, first_line
from .args import ArgLayout, aval_key, note_fixed_kwargs, uncanonical_array
from .auto import DimTracker, fit_to_constraints
from .bucket_choice import BucketChoice
from .compile import Compiler
from .plans import (Plan, ProgramKey, Shapes, Structure, StructureKey, exact_body,
                    logical_values, plan_in, waste, zero_sized)
from .stats import Cause, CauseKind, Stats

T = TypeVar("T")

#: A call seen by the planner: its structure, leaves and logical shapes (a
#: plain tuple: it is made on every call that misses the hot path).
Prepared: TypeAlias = tuple[Structure, list[Any], Shapes]


class Planner:
  """The structures and plans of one `pj.jit` function."""

  def __init__(self, fun: Callable[..., Any], args: ArgLayout, shardings: _sharding.ShardingLayout,
               compiler: Compiler, buckets: BucketChoice, stats: Stats, *,
               constraints: tuple[str, ...], fallback: str, specs_may_fall_back: bool) -> None:
    self.fun = fun
    self.args = args
    self.compiler = compiler
    self.buckets = buckets
    self.structures: dict[StructureKey, Structure] = {}
    self._shardings = shardings
    self._stats = stats
    self._constraints = constraints
    self._fallback = fallback
    # Inferred specs (annotations) fall back to exact shapes like automatic mode's.
    self._specs_may_fall_back = specs_may_fall_back
    self.announce = Announcer(getattr(fun, "__name__", "fun"), fallback)

  @property
  def label(self) -> str:
    return self.compiler.label

  # --- structures ------------------------------------------------------------------

  def prepare(self, args: Sequence[Any], kwargs: dict[str, Any], *,
              keep: bool = True) -> Prepared | None:
    """The call's structure, leaves and logical shapes, or None when a leaf
    is a tracer. A new structure is kept unless `keep` is False (`eval_shape`
    learns nothing)."""
    static_key, leaves, treedef = self.args.flatten(args, kwargs)
    avals = tuple(aval_key(x) for x in leaves)
    if None in avals:
      return None
    shapes = tuple(logical_shape(x) for x in leaves)
    # Looked up as a plain tuple (equal to, and hashed as, its `StructureKey`,
    # which is made only for a new structure): nothing extra per call.
    key = (static_key, treedef, avals, tuple(len(s) for s in shapes),
           self._shardings.leaf_shardings(leaves, treedef), jc.trace_context())
    struct = self.structures.get(key)  # type: ignore[call-overload]
    if struct is None:
      if any(isinstance(a[0], np.dtype) and a[0].kind in "USO" for a in avals if a):
        raise self._bad_argument(leaves, treedef, static_key)   # as jax.jit names it
      struct = self._new_structure(StructureKey(*key), shapes)
      struct.uncanonical = uncanonical_array(leaves)
      if keep:
        self.structures[struct.key] = struct
    return struct, leaves, shapes

  def _bad_argument(self, leaves: Sequence[Any], treedef: Any, static_key: Any) -> TypeError:
    """A string or object array among the arguments, named by its path."""
    names = self.args.leaf_names(treedef, static_key)
    bad = [(x, name) for x, name in zip(leaves, names, strict=True)
           if getattr(getattr(x, "dtype", None), "kind", "") in ("U", "S", "O")]
    x, name = bad[0]
    return TypeError(
        f"Error interpreting argument to {self.label} as an abstract array. The "
        f"problematic value is of type {type(x)} with dtype {x.dtype} (JAX arrays hold "
        f"numbers only) and was passed to the function at path {name}.\nThis typically "
        "means that a jit-wrapped function was called with a non-array argument, and "
        "this argument was not marked as static using the static_argnums or "
        "static_argnames parameters of pj.jit.")

  def _new_structure(self, key: StructureKey, shapes: Shapes) -> Structure:
    names = self.args.leaf_names(key.treedef, key.static)
    if self.args.polymorphic_shapes is not None:
      return Structure(key, names, specs=self.args.explicit_specs(key.treedef, key.static))
    struct = Structure(key, names, tracker=DimTracker(names, shapes))
    # the axes an earlier run of this function learned (a hint: `_caching/axes.py`)
    struct.axes_key = _axes.key(self.fun, key, names)
    remembered = _axes.recall(struct.axes_key)
    if remembered and struct.tracker is not None and struct.tracker.assume(remembered):
      struct.reset(tuple(struct.tracker.specs()))
      struct.recalled = True  # (its first call: `_masked_plan`)
    return struct

  def forget_program(self, key: ProgramKey) -> None:
    """Drops the plans that run an evicted program, so that it can be freed."""
    for struct in list(self.structures.values()):
      struct.forget(key)

  def bind_static(self, struct: Structure) -> Callable[..., Any]:
    """`fun` with the structure's static arguments bound."""
    return self.args.bind_static(struct.static_key)

  # --- plans -------------------------------------------------------------------------

  def plan_for(self, struct: Structure, shapes: Shapes) -> Plan:
    """The plan for `shapes`: the structure's, or a new one (remembered)."""
    plan = struct.plan(shapes)
    if plan is None:
      plan = self.decide(struct, shapes, functools.partial(self._exact_plan, struct, shapes),
                         functools.partial(self._masked_plan, struct, shapes))
      struct.remember(shapes, plan)
    return plan

  def decide(self, struct: Structure, shapes: Shapes, exact: Callable[[Cause], T],
             masked: Callable[[Cause], T]) -> T:
    """`exact(cause)` or `masked(cause)`: how `struct` runs new `shapes`
    (see the module docstring). Automatic mode learns from the shapes."""
    changed, became = struct.observe(shapes)
    if became and struct.tracker is not None:  # (automatic mode learned an axis)
      _axes.remember(struct.axes_key, struct.tracker.dynamic_groups())
    why = functools.partial(Cause, shapes=shapes, changed=changed, became_dynamic=became)
    if struct.specs is None or struct.exact_only:
      kind: CauseKind = "fallback" if struct.exact_only else ("exact" if changed else "first call")
      return exact(why(kind, error=struct.fallback_reason))
    if zero_sized(struct.specs, shapes):
      # A masked trace assumes sizes >= 1; jax.jit's own program for the empty
      # shapes gives exactly its shapes, values and exceptions.
      struct.recalled = False
      return exact(why("zero size"))
    try:
      return masked(why("bucket"))
    except Exception as e:
      if jc.transfer_refused(e):  # the user's transfer guard: as jax.jit raises it
        raise
      if (getattr(e, "one_side", False) and self._fallback != "error"
          and (struct.tracker is not None or self._specs_may_fall_back)):
        # `fun` fails traced on this side of a size comparison (`lax.top_k(x, 3)`
        # at n <= 2): these shapes run as jax.jit runs them (which raises there
        # as a rule), and the structure keeps masking every other size.
        plan = exact(why("failing side", error=first_line(e)))
        self.announce.side(e)
        return plan
      if struct.tracker is None and not self._specs_may_fall_back:  # the user asked
        if isinstance(e, PolyjitError):
          note_fixed_kwargs(e, struct.treedef, struct.leaf_names, self.args.label)
        raise
      self.announce.fall_back(struct, e)
      return exact(why("fallback", error=struct.fallback_reason))

  def _exact_plan(self, struct: Structure, shapes: Shapes, why: Cause) -> Plan:
    fun = self.bind_static(struct)
    if not struct.data_dependent:
      key = ProgramKey.exact_shapes(struct, shapes)
      try:
        with plain_jit_trace():
          program = self.compiler.cached(key, exact_body(struct.treedef, fun), struct, why)
        return Plan(key, program, struct.dtypes, (), None, 0.0, fallback=struct.exact_only,
                    shapes=shapes)
      except Exception as e:  # x[x > 0], jnp.nonzero: jax.jit cannot, polyjit can
        if not data_dependent.is_data_dependent_error(e):
          raise
        struct.mark_data_dependent()
    return data_dependent.exact_plan(struct, shapes, fun, lambda key, body: self.compiler.cached(
        key, body, struct, why))

  def fast_plan(self, struct: Structure, shapes: Shapes) -> Plan | None:
    """The plan for new sizes in a bucket that already has one, or None.

    The common case on the call path (every call with a new length): the
    sizes are read off the shapes, the bucket's program and padded shapes are
    reused, and only the logical sizes and output shapes are computed. The
    full path (`_masked_plan`) runs for anything else, and is the only one
    that records templates: no constraints or guards to check, no background
    compile. A template's program is compiled and still in the cache (an
    evicted program's templates are dropped: `Structure.forget`), so it is
    not looked up again here. Under a cost-aware policy the bucket is the
    smallest compiled one that holds the sizes.
    """
    templates = struct.templates  # (read here, not through `Structure`'s methods: every new size)
    first = next(iter(templates.values()), None)
    logical = None if first is None else first.sizes(shapes)  # (`Structure.template_sizes`)
    if logical is None:
      return None
    # (once started, as it is; a structure known to have none does not ask)
    rental = struct.rental or (None if struct.fixed_buckets else self.buckets.rental(struct, logical))
    tight = self.buckets.tight_key(struct, logical)
    # Under a cost-aware policy: the smallest compiled bucket, or the full path.
    bucket = tight if rental is None else rental.smallest_key(logical)
    template = templates.get(bucket)  # (`Structure.template`)
    if template is None or not template.fits(shapes) or not template.variant.holds(logical):
      return None
    self._stats.record_sizes(template.binding, struct.leaf_names, logical)
    plan: Plan = template.plan_at(shapes, logical)  # (templates.py sits below plans.py: Any)
    if rental is not None:
      self.buckets.rent(struct, rental, plan, logical, tight, template.binding, template.variant)
    return plan

  def _masked_plan(self, struct: Structure, shapes: Shapes, why: Cause) -> Plan:
    """A plan that runs the masked program of the bucket these sizes fall in."""
    fast = self.fast_plan(struct, shapes)
    if fast is not None:
      return fast
    recalled, struct.recalled = struct.recalled, False
    masked, binding, variant = self.variant(struct, shapes)
    logical = binding.padded  # solved from unpadded shapes: the logical sizes
    if struct.shardings is not None:  # on a mesh
      struct.learn_shard_multiples(_sharding.dim_multiples(binding, struct.shardings))
    buckets = self.buckets.tight(struct, logical)
    self._stats.record_sizes(binding, struct.leaf_names, logical)
    rental = self.buckets.rental(struct, logical, variant)
    if rental is not None:
      plan = self.buckets.borrowed_plan(struct, shapes, rental, binding, variant, logical, buckets)
      if plan is not None:
        return plan
      tight, buckets = buckets, rental.roomy(logical)
    if recalled and (rental is None or buckets not in rental.remembered):
      # The first call under remembered axes (`_caching/axes.py`) runs a bucket
      # only where an earlier run's bucket holds it (a load); else its exact
      # shapes, as a first call without the memory does (a first call at the
      # first run's first shapes loads that program).
      return self._exact_plan(struct, shapes, dataclasses.replace(why, kind="first call"))
    if rental is not None:
      if buckets != tight and buckets in rental.remembered:
        why = dataclasses.replace(why, reason=(
            "no compiled bucket holds " + _sizes(logical) + "; the tightest bucket an "
            "earlier run of this program compiled (remembered on disk) holds it"))
      elif buckets != tight:
        why = dataclasses.replace(why, reason=(
            "no compiled bucket holds " + _sizes(logical) + f"; headroom "
            f"{rental.policies[next(iter(logical))].headroom:g}x the largest size seen, "
            "rounded up to a power of two"))
    padded_env = fit_to_constraints(logical, buckets, variant.scope)
    why = dataclasses.replace(why, bucket=dict(padded_env), sizes=dict(logical),
                              variant=variant.describe() if variant.decisions else None)
    key, build = self.compiler.masked(struct, masked, binding, variant, padded_env, why)
    compiles = len(self._stats.compile_events)
    key, program, provisional = self.compiler.program(key, build, shapes)
    dd_plan = data_dependent.plan_for(variant, key, program, struct.dtypes,
                                      logical_values(binding, logical), logical,
                                      waste(shapes, key.padded_shapes), provisional, shapes)
    if dd_plan is not None:  # output shapes known after the run: no template
      return dd_plan
    plan = plan_in(struct, key, program, binding, variant, logical, shapes, provisional)
    if provisional is None and not variant.constraints and dict(padded_env) == buckets:
      struct.keep_template(plan, binding, variant)
    if rental is not None:
      rental.observe(logical)
      if len(self._stats.compile_events) > compiles:
        rental.bump()  # a new program: plans borrowing a larger one it may hold look again
    return plan

  def variant(self, struct: Structure, shapes: Shapes) -> tuple[Masked, Binding, Variant]:
    """The masked function, its binding at these (logical) shapes, and the
    variant of `fun` that these sizes select (`_masking/variants.py`): one per side
    of each size comparison `fun` makes, traced on first use."""
    args = struct.abstract_args(shapes)
    masked = struct.masked_fun(functools.partial(self._masked_fun, struct))
    binding = masked.bind(args)
    return masked, binding, masked.variant_for(args, binding.padded, binding)

  def _masked_fun(self, struct: Structure) -> Masked:
    fun = self.bind_static(struct)
    masked = Masked(lambda a, k: fun(*a, **k), struct.spec_tree(), constraints=self._constraints)
    # (setattr: a Masked instance has no declared __name__; named like `fun` for JAX)
    setattr(masked, "__name__", getattr(self.fun, "__name__", "fun"))
    return masked

  def call_bucket(self, struct: Structure, binding: Binding, variant: Variant,
                  logical: dict[str, int]) -> dict[str, int]:
    """The padded sizes a call with these logical sizes runs at, compiling nothing."""
    return self.buckets.call_bucket(struct, binding, variant, logical)

  # --- ahead of time -------------------------------------------------------------

  def precompile(self, examples: tuple[Any, Any], sizes: dict[str, Sequence[int]] | None,
                 progress: bool) -> list[dict[str, int]]:
    """`JitFunction.precompile` for abstract `examples` ((args, kwargs))."""
    prepared = self.prepare(*examples)
    assert prepared is not None  # (abstract examples, no tracers)
    struct, _, shapes = prepared
    if struct.tracker is not None and sizes and struct.tracker.force_dynamic(list(sizes)):
      struct.reset(tuple(struct.tracker.specs()))
    if struct.specs is None or not sizes:
      self.plan_for(struct, shapes)
      return [{}]
    masked, binding, variant = self.variant(struct, shapes)
    self.buckets.rental(struct, binding.padded, variant)  # a cost-aware policy learns of these programs
    unknown = set(sizes) - set(binding.dim_names)
    if unknown:
      raise ShapeError(f"precompile: unknown dimension names {sorted(unknown)}; this "
                       f"function's dimensions are {list(binding.dim_names)}.")
    per_dim = {v: sorted({self.buckets.policy(v).bucket(n)
                          for n in sizes.get(v, [binding.padded[v]])})
               for v in binding.dim_names}
    envs = [dict(zip(per_dim, combo, strict=True))
            for combo in itertools.product(*per_dim.values())]
    futures = []
    for env in envs:
      key, build = self.compiler.masked(struct, masked, binding, variant, env,
                                        Cause("precompile", bucket=env))
      futures.append(self.compiler.cache.submit(key, build))
    wait(futures, progress=progress, desc=f"precompiling {getattr(self.fun, '__name__', 'fun')}")
    return envs


def _sizes(logical: dict[str, int]) -> str:
  return ", ".join(f"{v}={n}" for v, n in sorted(logical.items()))


