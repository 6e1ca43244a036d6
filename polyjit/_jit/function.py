"""`pj.jit`: a drop-in for `jax.jit` that compiles once per bucket, not per shape.

A call goes through these steps, all on the host:

1. split static arguments off and flatten the rest (a `pj.Padded` is a leaf);
2. look up the *structure* (static values, pytree, dtypes, ranks) and, within
   it, the *plan* for these exact shapes; a plan knows the padded shape of
   every argument, the logical sizes, the compiled program and how to unpad
   the outputs, so a repeated shape costs a dict lookup;
3. pad the arguments to the bucket on the host (`_padding.py`), run the
   program with the logical sizes as runtime values, slice outputs with
   dynamic dims back to their logical shapes.

A repeated call skips steps 1-2: positional arrays and scalars are keyed by
`call_signature` (dtype, weak type, shape each) straight to their plan, which
pads only the leaves that need it, passes logical sizes already on the device,
and returns outputs without dynamic dims as the program made them (nothing
blocks the host). Only outputs with dynamic dims are sliced, on the host.
A signature not seen before, of a structure seen before (same types and
ranks, `rank_signature`), whose sizes fall in a compiled bucket with a
template, takes that bucket's plan resized (`Plan.resized`): new padding
regions and size scalars, no new plan, trace or compile (`_resized_plan`).

On a plan miss, the logical size of every dimension variable is solved from the
argument shapes, rounded up by the bucket policy, and the program for those
padded sizes comes from the executable cache (`_cache.py`), compiled there
once: `jax.jit` of `pj.mask(fun)` lowered at the padded shapes.

Explicit mode (`polymorphic_shapes=`) uses the given specs. Automatic mode
learns them (`_auto.py`): the first call compiles the exact shapes, and axes
that vary become dynamic. Python branching on a size gets one variant per
side of the comparison (`_variants.py`): the sizes of a call select the variant
on their side, traced once, and each variant has its own program per bucket.
If `fun` still cannot be traced or masked with symbolic sizes (a primitive
without a masking rule), the structure falls back to exact shapes, like
`jax.jit`, and says so: a `pj.FallbackWarning` once per function and cause
(`fallback="warn"`, the default), an error (`fallback="error"`), or only
`pj.explain` and the "polyjit" logger (`fallback="silent"`).

Under `pj.buckets.CostAware` (`_policy.py`), the default, the bucket of a call
is the smallest compiled one that holds it; a tighter one compiles once the
run time its absence wastes has paid for a compile (both estimated from the
function's jaxpr, `_cost_model.py`, so the choice is the same on every run).
On a mesh the default is powers of two: a fixed policy.

Called under another transformation (`jax.jit`, `jax.grad`, `jax.vmap`), a
`pj.jit` function is inlined: the outer trace has fixed shapes anyway.

This module holds `JitFunction`, the steps above and their policy (when to
mask, fall back, borrow a bucket, warn). The parts it ties together:
`_jit_args.py` (static arguments, leaves, leaf names, explicit specs,
donation), `_jit_plans.py` (structures, plans, templates, program keys and
bodies) and `_jit_stats.py` (the typed record `pj.stats` and `pj.explain` read).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import time
from concurrent.futures import Future
from typing import Any, Callable, Sequence, TypeAlias, overload

import jax
import numpy as np

from . import annotations as _annotations, aot as _jit_aot
from .._caching import disk as _disk_cache
from .._masking import verify as _verify
from .. import _jax as jc
from .._sharding import placement as _sharding
from .auto import DimTracker, fit_to_constraints, sanitize
from .._buckets.fixed import BucketPolicy, PerDimBucketSpec, PowersOfTwo, as_policy
from .._caching.executables import ExecutableCache, wait
from .._caching.compiles import count_compiles
from . import data_dependent
from .._masking.data_dependent import plain_jit_trace
from .._masking.errors import FallbackWarning, MaskingError, PolyjitError, ShapeError, warn_user
from .args import (ArgLayout, aval_key, call_signature, note_fixed_kwargs, rank_signature,
                   refuse_jit_options, signature_shapes, strip_padded)
from .plans import (Plan, ProgramKey, Structure, Template, borrow, exact_body, bucket_key,
                    logical_values, lower_and_compile, masked_body, out_shapes, padded_shapes,
                    waste, zero_sized)
from .stats import Cause, CauseKind, Stats
from .._masking.mask import Masked
from .._buckets.cost_aware import CostAware, Rental
from .._masking.padding import Padded, logical_shape
from .._masking.spec import ArgSpecs, Binding
from .._masking.variants import Variant

HOT_PLANS = 16384 # call signatures kept for the hot path (then it starts over)
DEFAULT_BUCKETS = CostAware()  # pj.jit's policy when `buckets` is not given
MESH_BUCKETS = PowersOfTwo()   # in place of a cost-aware policy on a mesh

#: Per argument leaf, its logical (unpadded) shape.
Shapes: TypeAlias = tuple[tuple[int, ...], ...]

logger = logging.getLogger("polyjit")
logger.addHandler(logging.NullHandler())  # a library prints nothing unless asked


class JitFunction:
  """A function compiled by `pj.jit`."""

  def __init__(self, fun: Callable[..., Any], *, polymorphic_shapes: ArgSpecs | None = None,
               buckets: PerDimBucketSpec = None, constraints: Sequence[str] = (),
               static_argnums: int | Sequence[int] | None = None,
               static_argnames: str | Sequence[str] | None = None,
               donate_argnums: int | Sequence[int] | None = None, cache_size: int = 64,
               background_compile: bool = False, fallback: str = "warn",
               in_shardings: Any = None, out_shardings: Any = None,
               donate_argnames: str | Sequence[str] | None = None, keep_unused: bool = False,
               inline: bool = False, device: Any = None, backend: str | None = None,
               compiler_options: dict[str, Any] | None = None) -> None:
    if not callable(fun):
      raise TypeError(f"pj.jit expects a callable, got {type(fun).__name__}")
    refuse_jit_options(device=device, backend=backend, compiler_options=compiler_options)
    if fallback not in ("warn", "error", "silent"):
      raise ValueError(f"fallback must be 'warn', 'error' or 'silent', got {fallback!r}")
    self.fun = fun
    self.buckets = buckets
    self.constraints = tuple(constraints)
    self.background_compile = background_compile
    self.fallback = fallback
    self.stats = Stats()
    # jaxtyping annotations name the dynamic dims unless specs are given; being
    # inferred, like automatic mode's, they fall back to exact shapes if need be.
    annotated = _annotations.annotated_specs(fun) if polymorphic_shapes is None else None
    self._specs_may_fall_back = annotated is not None
    polymorphic_shapes = annotated if annotated is not None else polymorphic_shapes
    self._args = ArgLayout(fun, repr(self), polymorphic_shapes=polymorphic_shapes,
                           static_argnums=static_argnums, static_argnames=static_argnames,
                           donate_argnums=donate_argnums, donate_argnames=donate_argnames)
    self._args.specs_per_parameter = annotated is not None
    self._cache = ExecutableCache(cache_size, on_evict=self._forget_program)
    self._structures: dict[Any, Structure] = {}
    # call_signature -> plan (the hot path); None (no signature) is looked up, never stored
    self._hot: dict[tuple[Any, ...] | None, Plan] = {}
    # rank_signature -> its structure, for new sizes of hot signatures (`_resized_plan`)
    self._by_rank: dict[tuple[Any, ...], Structure] = {}
    self._shardings = _sharding.ShardingLayout(in_shardings, out_shardings)
    self._warned: set[str] = set()
    self._policies: dict[str, BucketPolicy] = {}  # dim -> its policy (`bucket_policy`)
    # Deterministic across processes: the name is part of the persistent
    # compilation cache's key.
    self._name = "pj_" + sanitize(getattr(fun, "__qualname__", None) or "fun")
    self._inline = jax.jit(fun, static_argnums=self._args.static_argnums or None,
                           static_argnames=self._args.static_argnames or None,
                           keep_unused=keep_unused, inline=inline,
                           **_sharding.jit_options(in_shardings, out_shardings))
    functools.update_wrapper(self, fun, updated=())

  polymorphic_shapes = property(lambda self: self._args.polymorphic_shapes)
  static_argnums = property(lambda self: self._args.static_argnums)
  static_argnames = property(lambda self: self._args.static_argnames)
  donate_argnums = property(lambda self: self._args.donate_argnums)

  def __repr__(self) -> str:
    return f"pj.jit({getattr(self.fun, '__name__', self.fun)})"

  def __get__(self, obj: Any, objtype: type | None = None) -> Any:  # methods: bind like a function
    return self if obj is None else functools.partial(self, obj)

  def bucket_policy(self, dim: str) -> BucketPolicy:
    """The bucket policy that pads the dimension `dim` (made once per dimension)."""
    policy = self._policies.get(dim)
    if policy is None:
      policy = self._policies[dim] = self._make_policy(dim)
    return policy

  def _make_policy(self, dim: str) -> BucketPolicy:
    spec = self.buckets
    if isinstance(spec, dict):
      spec = spec.get(dim, spec.get("*"))
    return DEFAULT_BUCKETS if spec is None else as_policy(spec)

  # --- calls -----------------------------------------------------------------

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if jc.jit_disabled():  # jax.disable_jit(): run `fun` eagerly, as jax.jit does
      return self._inline(*strip_padded(args), **strip_padded(kwargs))
    if _verify.enabled():  # the checking mode: jax.jit at the exact shapes agrees
      return _verify.checked_call(repr(self), self._reference, self, args, kwargs)
    # The hot path: positional arrays and scalars whose signature was seen.
    key = None if kwargs or self._args.has_static else call_signature(args)
    plan = self._hot.get(key)
    if plan is not None and plan.current:
      self.stats.record_call(plan.bucket, plan.waste, plan.fallback)
      if plan.borrow is not None:  # in a larger bucket than its own: pay for it
        plan.borrow.pay()
      return plan.unpad_outputs(plan.run_plain(args))
    if key is not None:  # a never-seen size in a compiled bucket: the bucket's plan, resized
      plan = self._resized_plan(key)
      if plan is not None:
        self.stats.record_call(plan.bucket, plan.waste, plan.fallback)
        if plan.borrow is not None:
          plan.borrow.pay()
        return plan.unpad_outputs(plan.run_plain(args))
    done = self._execute(args, kwargs, key)
    if done is None:  # under a transformation: inline
      return self._inline(*strip_padded(args), **strip_padded(kwargs))
    plan, outs = done
    return plan.unpad_outputs(outs)

  def _reference(self, *args: Any, **kwargs: Any) -> Any:
    """`jax.jit(fun)` at the exact shapes (the checking mode's reference)."""
    return self._inline(*strip_padded(args), **strip_padded(kwargs))

  def call_padded(self, *args: Any, **kwargs: Any) -> Any:
    """Like calling the function, but outputs with dynamic dims come back as
    `pj.Padded` (padded data on the device plus logical shape): no host round
    trip, and another `pj.jit` function takes them as they are."""
    done = self._execute(args, kwargs)
    if done is None:
      raise TypeError("call_padded cannot be used inside a JAX transformation; "
                      "call the function itself there.")
    plan, outs = done
    return plan.map_outputs(outs, lambda o, s: o if tuple(o.shape) == s else Padded(o, s))

  def _execute(self, args: Sequence[Any], kwargs: dict[str, Any],
               hot_key: tuple[Any, ...] | None = None) -> tuple[Plan, Any] | None:
    """(plan, padded outputs) for a call, or None under a transformation.
    With `hot_key` (the call's `call_signature`), the plan is kept for the
    hot path of the next call with that signature."""
    prepared = self._prepare(args, kwargs)
    if prepared is None:
      return None
    struct, leaves, shapes = prepared
    plan = self._plan_for(struct, shapes)
    if hot_key is not None and plan.current and struct.shardings is None \
        and self._shardings.one_device():
      # Only where no argument can be on a mesh: the hot key has no shardings.
      if len(self._hot) >= HOT_PLANS:
        self._hot.clear()
      self._hot[hot_key] = plan
      self._by_rank[rank_signature(hot_key)] = struct
    self.stats.record_call(plan.bucket, plan.waste, plan.fallback)
    if plan.borrow is not None:
      plan.borrow.pay()
    if struct.shardings is not None:  # on a mesh: padded shard by shard
      plan.unpad_leaf = _sharding.unpad  # and unpadded keeping the shardings
      return plan, _sharding.run(plan, leaves, struct.shardings)
    rental = struct.rental
    if rental is None or plan.bucket is None or not rental.wants_sample(plan.bucket):
      return plan, plan.run(leaves)
    t0 = time.perf_counter()  # a new shape: time it (repeated shapes never block)
    # jax.block_until_ready carries no annotations (strict only)
    outs = jax.block_until_ready(plan.run(leaves))  # type: ignore[no-untyped-call, unused-ignore]
    rental.record_time(plan.bucket, time.perf_counter() - t0)
    return plan, outs

  def _prepare(self, args: Sequence[Any], kwargs: dict[str, Any]
               ) -> tuple[Structure, list[Any], Shapes] | None:
    """(structure, leaves, logical shapes), or None when a leaf is a tracer."""
    static_key, leaves, treedef = self._args.flatten(args, kwargs)
    avals = tuple(aval_key(x) for x in leaves)
    if None in avals:
      return None
    shapes = tuple(logical_shape(x) for x in leaves)
    key: tuple[Any, ...] = (static_key, treedef, avals, tuple(len(s) for s in shapes))
    shardings = self._shardings.leaf_shardings(leaves, treedef)
    if shardings is not None:
      key += (shardings,)
    struct = self._structures.get(key)
    if struct is None:
      struct = self._structures[key] = self._new_structure(key, treedef, avals, shapes)
    return struct, leaves, shapes

  def _new_structure(self, key: tuple[Any, ...], treedef: Any, avals: tuple[Any, ...],
                     shapes: Shapes) -> Structure:
    static_key = key[0]
    names = self._args.leaf_names(treedef, static_key)
    struct = Structure(key, treedef, avals, names)
    struct.shardings = key[4] if len(key) > 4 else None  # per leaf, or None: one device
    struct.shard_multiples = {}  # dim -> its buckets' multiple (`_sharding.dim_multiples`)
    if self._args.polymorphic_shapes is not None:
      struct.specs = self._args.explicit_specs(treedef, static_key)
    else:
      struct.tracker = DimTracker(names, shapes)
    return struct

  def _plan_for(self, struct: Structure, shapes: Shapes) -> Plan:
    plan = struct.plan(shapes)
    if plan is None:
      plan = self._new_plan(struct, shapes)
      struct.remember(shapes, plan)
    return plan

  def _resized_plan(self, key: tuple[Any, ...]) -> Plan | None:
    """The plan for a call signature not seen before whose structure was (the
    same argument types and ranks), when its sizes fall in a compiled bucket
    with a template: that bucket's plan, resized (`Plan.resized`). None sends
    the call down the general path (`_execute`)."""
    struct = self._by_rank.get(rank_signature(key))
    if struct is None or (struct.rental is not None and struct.rental.measured):
      return None  # (measured estimates time a new shape's first run: `_execute`)
    shapes = signature_shapes(key)
    plan = struct.plan(shapes)
    if plan is None:
      plan = self._fast_plan(struct, shapes)
      if plan is None:
        return None
      struct.last_shapes = shapes
      struct.remember(shapes, plan)
    if plan.current:
      if len(self._hot) >= HOT_PLANS:
        self._hot.clear()
      self._hot[key] = plan
    return plan

  def _forget_program(self, key: ProgramKey) -> None:
    """Drops the plans that run an evicted program, so that it can be freed."""
    for struct in list(self._structures.values()):
      struct.forget(key)

  # --- new plans -----------------------------------------------------------------

  def _new_plan(self, struct: Structure, shapes: Shapes) -> Plan:
    changed, became = struct.observe(shapes)
    why = functools.partial(Cause, shapes=shapes, changed=changed, became_dynamic=became)
    if struct.specs is None or struct.exact_only:
      kind: CauseKind = "fallback" if struct.exact_only else ("exact" if changed else "first call")
      return self._exact_plan(struct, shapes, why(kind, error=struct.fallback_reason))
    if zero_sized(struct.specs, shapes):
      # A masked trace assumes sizes >= 1; jax.jit's own program for the empty
      # shapes gives exactly its shapes, values and exceptions.
      return self._exact_plan(struct, shapes, why("zero size"))
    try:
      return self._masked_plan(struct, shapes, why("bucket"))
    except Exception as e:
      if struct.tracker is None and not self._specs_may_fall_back:  # the user asked
        if isinstance(e, PolyjitError):
          note_fixed_kwargs(e, struct.treedef, struct.leaf_names, self._args.label)
        raise
      self._fall_back(struct, e)
      return self._exact_plan(struct, shapes, why("fallback", error=struct.fallback_reason))

  def _fall_back(self, struct: Structure, error: Exception) -> None:
    """Automatic mode cannot mask this structure: run exact shapes, and say so."""
    name = getattr(self.fun, "__name__", "fun")
    text = str(error).strip()
    reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    if self.fallback == "error":
      if isinstance(error, PolyjitError):
        raise error
      raise MaskingError(f"pj.jit({name}) cannot run with dynamic sizes: {reason}") from error
    struct.fall_back(reason)
    message = (
        f"pj.jit({name}) cannot run with dynamic sizes, so it compiles every distinct "
        f"shape exactly, as jax.jit does: {reason}\nWhat to do: see the full error with "
        f"pj.jit({name}, fallback='error'); give polymorphic_shapes (and constraints) so "
        "that only the axes that really vary are dynamic; or pass fallback='silent' "
        "to accept compiling per shape.")
    logger.warning("%s", message)
    if self.fallback == "warn" and reason not in self._warned:
      self._warned.add(reason)
      warn_user(message, FallbackWarning)

  def _exact_plan(self, struct: Structure, shapes: Shapes, why: Cause) -> Plan:
    fun = self._args.bind_static(struct.static_key)
    if not struct.data_dependent:
      key = ProgramKey.exact_shapes(struct, shapes)
      try:
        with plain_jit_trace():
          program = self._cache.get(key, lambda: self._compile(
              key, exact_body(struct.treedef, fun), struct, why))
        return Plan(key, program, struct.dtypes, (), None, 0.0, fallback=struct.exact_only,
                    shapes=shapes)
      except Exception as e:  # x[x > 0], jnp.nonzero: jax.jit cannot, polyjit can
        if not data_dependent.is_data_dependent_error(e):
          raise
        struct.data_dependent = True
    return data_dependent.exact_plan(struct, shapes, fun, lambda key, body: self._cache.get(
        key, lambda: self._compile(key, body, struct, why)))

  def _fast_plan(self, struct: Structure, shapes: Shapes) -> Plan | None:
    """The plan for new sizes in a bucket that already has one, or None.

    The common case on the call path (every call with a new length): the
    sizes are read off the shapes, the bucket's program and padded shapes are
    reused, and only the logical sizes and output shapes are computed. The
    full path (`_masked_plan`) runs for anything else, and is the only one
    that records templates: no constraints or guards to check, no background
    compile, and a program still in the cache. Under a cost-aware policy the
    bucket is the smallest compiled one that holds the sizes.
    """
    logical = struct.template_sizes(shapes)
    if logical is None:
      return None
    rental = self._rental(struct, logical)
    tight = {v: self._bucket(struct, v, n) for v, n in logical.items()}
    # Under a cost-aware policy: the smallest compiled bucket, or the full path.
    buckets = [bucket_key(tight)] if rental is None else rental.smallest(logical)
    for bucket in buckets:
      template = struct.template(shapes, bucket)
      if template is None:
        continue
      fut = self._cache.peek(template.plan.key)
      if fut is None or not fut.done() or not template.variant.holds(logical):
        continue
      self.stats.record_sizes(template.binding, struct.leaf_names, logical)
      plan = template.plan_at(shapes, logical)
      if rental is not None:
        self._rent(struct, rental, plan, logical, tight, template.binding, template.variant)
      return plan
    return None

  def _masked_plan(self, struct: Structure, shapes: Shapes, why: Cause) -> Plan:
    """A plan that runs the masked program of the bucket these sizes fall in."""
    fast = self._fast_plan(struct, shapes)
    if fast is not None:
      return fast
    masked, binding, variant = self._variant(struct, shapes)
    logical = binding.padded  # solved from unpadded shapes: the logical sizes
    if struct.shardings is not None:
      struct.shard_multiples = _sharding.dim_multiples(binding, struct.shardings)
    buckets = {v: self._bucket(struct, v, n) for v, n in logical.items()}
    self.stats.record_sizes(binding, struct.leaf_names, logical)
    rental = self._rental(struct, logical, variant)
    if rental is not None:
      plan = self._borrowed_plan(struct, shapes, rental, binding, variant, logical, buckets)
      if plan is not None:
        return plan
      tight, buckets = buckets, rental.roomy(logical)
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
    key, build = self._masked_program(struct, masked, binding, variant, padded_env, why)
    compiles = len(self.stats.compile_events)
    key, program, provisional = self._program(key, build, shapes)
    dd_plan = data_dependent.plan_for(variant, key, program, struct.dtypes,
                                      logical_values(binding, logical), logical,
                                      waste(shapes, key.padded_shapes), provisional, shapes)
    if dd_plan is not None:  # output shapes known after the run: no template
      return dd_plan
    plan = self._plan_in(struct, key, program, binding, variant, logical, shapes, provisional)
    if provisional is None and not variant.constraints and dict(padded_env) == buckets:
      self._keep_template(struct, plan, binding, variant)
    if rental is not None:
      rental.observe(logical)
      if len(self.stats.compile_events) > compiles:
        rental.bump()  # a new program: plans borrowing a larger one look again
    return plan

  def _plan_in(self, struct: Structure, key: ProgramKey, program: Any, binding: Binding,
               variant: Variant, logical: dict[str, int], shapes: Shapes,
               provisional: Future[Any] | None = None) -> Plan:
    out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
    return Plan(key, program, struct.dtypes, logical_values(binding, logical),
                out_shapes(out_dims, logical), waste(shapes, key.padded_shapes), provisional,
                shapes=shapes)

  def _keep_template(self, struct: Structure, plan: Plan, binding: Binding,
                     variant: Variant) -> None:
    out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
    template = Template.of(plan, binding, variant, out_dims)
    if template is not None:
      struct.templates[plan.key.bucket] = template

  # --- the cost-aware policy (`_policy.py`) ----------------------------------------

  def _rental(self, struct: Structure, logical: dict[str, int],
              variant: Variant | None = None) -> Rental | None:
    """The structure's ski-rental state when every dimension's policy is cost-aware.
    On a mesh the policies are the fixed ones: the processes must pick the
    same buckets, and the cost-aware choice depends on timings. With
    `variant`, its traced jaxpr gives the estimates (the first one does)."""
    if struct.shardings is not None:
      return None
    if struct.rental is None:
      policies = {v: self.bucket_policy(v) for v in logical}
      cost_aware = {v: p for v, p in policies.items() if isinstance(p, CostAware)}
      if not policies or len(cost_aware) != len(policies):
        return None
      struct.rental = Rental(cost_aware)
      if struct.tracker is not None and struct.masked is not None:
        # Automatic mode compiled the first call exactly: its sizes count
        # for the headroom too.
        try:
          struct.rental.observe(struct.masked.bind(
              struct.abstract_args(struct.tracker.first)).padded)
        except PolyjitError:
          pass  # first shapes this variant cannot bind: only later sizes count
    if variant is not None and variant.traced is not None:
      if struct.rental.model is None and not struct.rental.measured:
        struct.rental.remember(_disk_cache.program_key(variant.traced.jaxpr, struct.specs))
      struct.rental.use_model(variant.traced.jaxpr, jax.default_backend())
    return struct.rental

  def _borrowed_plan(self, struct: Structure, shapes: Shapes, rental: Rental, binding: Binding,
                     variant: Variant, logical: dict[str, int],
                     tight: dict[str, int]) -> Plan | None:
    """A plan in the smallest compiled bucket that holds `logical`, or None."""
    found = self._compiled_bucket(struct, rental, binding, variant, logical)
    if found is not None:
      bucket, key, fut = found
      plan = data_dependent.plan_for(variant, key, fut.result(), struct.dtypes,
                                     logical_values(binding, logical), logical,
                                     waste(shapes, key.padded_shapes), None, shapes)
      if plan is None:  # (output shapes known after the run: no template)
        plan = self._plan_in(struct, key, fut.result(), binding, variant, logical, shapes)
        if not variant.constraints and struct.templates.get(bucket) is None:
          self._keep_template(struct, plan, binding, variant)
      self._rent(struct, rental, plan, logical, tight, binding, variant)
      return plan
    return None

  def _compiled_bucket(self, struct: Structure, rental: Rental, binding: Binding,
                       variant: Variant, logical: dict[str, int]
                       ) -> tuple[Any, ProgramKey, Future[Any]] | None:
    """(bucket key, program key, compiled program) of the smallest compiled
    bucket that holds `logical` for this variant, or None."""
    for bucket in rental.candidates(logical):
      env = rental.envs[bucket]
      if fit_to_constraints(logical, env, variant.scope) != env:
        continue
      key = ProgramKey.masked(struct, variant, padded_shapes(binding, env), env)
      fut = self._cache.peek(key)
      if fut is not None and fut.done() and fut.exception() is None:
        return bucket, key, fut
    return None

  def _call_bucket(self, struct: Structure, binding: Binding, variant: Variant,
                   logical: dict[str, int]) -> dict[str, int]:
    """The padded sizes a call with these logical sizes runs at (what
    `_masked_plan` decides, without compiling: for `lower` and `trace`)."""
    tight = {v: self._bucket(struct, v, n) for v, n in logical.items()}
    rental = self._rental(struct, logical, variant)
    if rental is None:
      return tight
    found = self._compiled_bucket(struct, rental, binding, variant, logical)
    return dict(found[1].bucket) if found is not None else rental.roomy(logical)

  def _rent(self, struct: Structure, rental: Rental, plan: Plan, logical: dict[str, int],
            tight: dict[str, int], binding: Binding, variant: Variant) -> None:
    """When `plan` runs in a larger bucket than its own, its calls pay what
    they waste into the accounts of the smaller buckets that would hold
    them; an account compiles its bucket once it has paid for it."""
    rental.observe(logical)
    tight_key = bucket_key(tight)
    if plan.key.bucket == tight_key:
      return
    key: tuple[Any, ...] | None = (variant.key, tight_key, plan.key.bucket)
    accounts = rental.borrow_accounts.get(key) if not variant.constraints else None
    if accounts is None:
      accounts = []
      for env in rental.smaller(logical, dict(plan.key.bucket)):
        if fit_to_constraints(logical, env, variant.scope) != env:
          continue  # these sizes break a constraint there: no such program
        accounts.append(rental.account(env, functools.partial(
            self._compile_for_waste, struct, binding, variant, env)))
      if not variant.constraints:  # else the list depends on the sizes themselves
        rental.borrow_accounts[key] = accounts
      else:
        key = None
    plan.borrow = plan.provisional = rental.borrow(plan.key.bucket, accounts, key)

  def _compile_for_waste(self, struct: Structure, binding: Binding, variant: Variant,
                         env: dict[str, int], wasted: float,
                         compile_cost: float) -> Future[Any]:
    """Compiles the bucket `env`, whose account has paid for it: here, under
    deterministic estimates (so that the next call's bucket never depends on
    when a thread finishes), else in the background."""
    rental = struct.rental
    assert rental is not None  # (an account of this structure's rental paid)
    what = "" if rental.measured else "estimated "
    cause = Cause("bucket", bucket=dict(env),
                  reason=f"{what}waste {wasted:.3g} s > compile {compile_cost:.3g} s")
    assert struct.masked is not None  # (a bucket of a masked plan)
    key, build = self._masked_program(struct, struct.masked, binding, variant, env, cause)
    if self.background_compile or rental.measured:
      return self._cache.submit(key, build)
    done: Future[Any] = Future()
    done.set_result(self._cache.get(key, build))
    return done

  def _bucket(self, struct: Structure, dim: str, size: int) -> int:
    """The padded size of `dim`: its policy's bucket, rounded up to a multiple
    of the number of shards along it where it is a sharded axis."""
    policy = self.bucket_policy(dim)
    if struct.shardings is not None and isinstance(policy, CostAware):
      # on a mesh the choice is fixed (see `_rental`): powers of two by default
      policy = MESH_BUCKETS if policy is DEFAULT_BUCKETS else policy.grid
    bucket = policy.bucket(size)
    multiple = struct.shard_multiples.get(dim, 1)
    return bucket if multiple == 1 else _sharding.round_up(bucket, multiple)

  def _program(self, key: ProgramKey, build: Callable[[], Any], shapes: Shapes
               ) -> tuple[ProgramKey, Any, Future[Any] | None]:
    """(key, program, provisional): the program for `key`, compiled here if
    needed; or, with `background_compile`, a larger compiled bucket's program
    while `key` compiles in a thread (`provisional` is that future)."""
    if self.background_compile and _sharding.single_process():  # timing-free across processes
      fut = self._cache.peek(key)
      if fut is None or not fut.done():
        borrowed = borrow(self._cache.done(), key, shapes)
        if borrowed is not None:
          return (*borrowed, self._cache.submit(key, build))
    return key, self._cache.get(key, build), None

  def _variant(self, struct: Structure, shapes: Shapes) -> tuple[Masked, Binding, Variant]:
    """The masked function, its binding at these (logical) shapes, and the
    variant of `fun` that these sizes select (`_variants.py`): one per side
    of each size comparison `fun` makes, traced on first use."""
    args = struct.abstract_args(shapes)
    if struct.masked is None:
      fun = self._args.bind_static(struct.static_key)
      struct.masked = Masked(lambda a, k: fun(*a, **k), struct.spec_tree(),
                             constraints=self.constraints)
      # (setattr: a Masked instance has no declared __name__; named like `fun` for JAX)
      setattr(struct.masked, "__name__", getattr(self.fun, "__name__", "fun"))
    binding = struct.masked.bind(args)
    return struct.masked, binding, struct.masked.variant_for(args, binding.padded, binding)

  def _masked_program(self, struct: Structure, masked: Masked, binding: Binding,
                      variant: Variant, env: dict[str, int],
                      cause: Cause) -> tuple[ProgramKey, Callable[[], Any]]:
    """(key, build) of the program of `variant` at the padded sizes `env`."""
    key = ProgramKey.masked(struct, variant, padded_shapes(binding, env), env)
    body = masked_body(struct.treedef, masked, variant, env)
    return key, functools.partial(self._compile, key, body, struct, cause,
                                  len(binding.dim_names))

  def _compile(self, key: ProgramKey, body: Callable[..., Any], struct: Structure,
               cause: Cause, n_dims: int = 0) -> Any:
    donate = self._args.donated_leaves(struct.treedef, struct.static_key)
    _disk_cache.ensure()  # the on-disk cache, on by default (once per process)
    t0 = time.perf_counter()
    if struct.shardings is not None:
      _sharding.agree_on_program(key.padded_shapes, key.bucket, repr(self))
    with count_compiles(this_thread_only=True) as log:
      if struct.shardings is None:
        program = lower_and_compile(body, self._name, key.padded_shapes, struct.avals,
                                    n_dims, donate)
      else:
        program = _sharding.lower_and_compile(
            body, self._name, key.padded_shapes, struct.avals, n_dims, donate,
            struct.shardings, self._shardings.out_shardings)
    seconds = time.perf_counter() - t0
    self.stats.record_compile(key, cause, log,
                              program_name=jc.jit_program_name(self._name),
                              wall_seconds=seconds)
    if struct.rental is not None and not key.exact:
      struct.rental.compiled(key.bucket, dict(key.bucket), seconds)
    return program

  # --- ahead of time ---------------------------------------------------------

  def trace(self, *args: Any, **kwargs: Any) -> _jit_aot.Traced:
    """The program a call with these arguments runs, traced (as `jax.jit`'s `trace`)."""
    return _jit_aot.trace(self, args, kwargs)

  def lower(self, *args: Any, **kwargs: Any) -> _jit_aot.Lowered:
    """The program a call with these arguments runs, lowered (as `jax.jit`'s `lower`)."""
    return _jit_aot.lower(self, args, kwargs)

  def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
    """`jax.jit(fun).eval_shape(*args, **kwargs)`: output shapes, nothing run."""
    return _jit_aot.eval_shape(self, args, kwargs)

  def clear_cache(self) -> None:
    """Drops every compiled program, plan and trace of this function (its
    statistics stay)."""
    self._structures.clear()   # traces, plans and the cost-aware accounts
    self._hot.clear()
    self._by_rank.clear()
    self._cache.clear()

  def precompile(self, *args: Any, sizes: dict[str, Sequence[int]] | None = None,
                 progress: bool = True, **kwargs: Any) -> list[dict[str, int]]:
    """Compiles the buckets that serve `sizes`, in parallel threads.

    `args`/`kwargs` are example arguments (arrays or `jax.ShapeDtypeStruct`s)
    giving the structure, dtypes and fixed dims; `sizes` maps dimension names
    (the spec names, or in automatic mode `<argument>_<axis>`) to the logical
    sizes to serve. Returns the padded sizes compiled.
    """
    # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
    examples = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.typeof(x).dtype)  # type: ignore[no-untyped-call, unused-ignore]
                            if not isinstance(x, jax.ShapeDtypeStruct) else x, (args, kwargs))
    prepared = self._prepare(*examples)
    assert prepared is not None  # (abstract examples, no tracers)
    struct, _, shapes = prepared
    if struct.tracker is not None and sizes and struct.tracker.force_dynamic(list(sizes)):
      struct.reset(tuple(struct.tracker.specs()))
    if struct.specs is None or not sizes:
      self._plan_for(struct, shapes)
      return [{}]
    masked, binding, variant = self._variant(struct, shapes)
    self._rental(struct, binding.padded, variant)  # a cost-aware policy learns of these programs
    unknown = set(sizes) - set(binding.dim_names)
    if unknown:
      raise ShapeError(f"precompile: unknown dimension names {sorted(unknown)}; this "
                       f"function's dimensions are {list(binding.dim_names)}.")
    per_dim = {v: sorted({self.bucket_policy(v).bucket(n)
                          for n in sizes.get(v, [binding.padded[v]])})
               for v in binding.dim_names}
    envs = [dict(zip(per_dim, combo, strict=True)) for combo in itertools.product(*per_dim.values())]
    futures = []
    for env in envs:
      key, build = self._masked_program(struct, masked, binding, variant, env,
                                        Cause("precompile", bucket=env))
      futures.append(self._cache.submit(key, build))
    wait(futures, progress=progress, desc=f"precompiling {getattr(self.fun, '__name__', 'fun')}")
    return envs


def _sizes(logical: dict[str, int]) -> str:
  return ", ".join(f"{v}={n}" for v, n in sorted(logical.items()))


@overload
def jit(fun: Callable[..., Any], *, polymorphic_shapes: ArgSpecs | None = None,
        buckets: PerDimBucketSpec = None, constraints: Sequence[str] = (),
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, cache_size: int = 64,
        background_compile: bool = False, fallback: str = "warn",
        in_shardings: Any = None, out_shardings: Any = None,
        donate_argnames: str | Sequence[str] | None = None, keep_unused: bool = False,
        inline: bool = False, device: Any = None, backend: str | None = None,
        compiler_options: dict[str, Any] | None = None) -> JitFunction: ...


@overload
def jit(fun: None = None, *, polymorphic_shapes: ArgSpecs | None = None,
        buckets: PerDimBucketSpec = None, constraints: Sequence[str] = (),
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, cache_size: int = 64,
        background_compile: bool = False, fallback: str = "warn",
        in_shardings: Any = None, out_shardings: Any = None,
        donate_argnames: str | Sequence[str] | None = None, keep_unused: bool = False,
        inline: bool = False, device: Any = None, backend: str | None = None,
        compiler_options: dict[str, Any] | None = None
        ) -> Callable[[Callable[..., Any]], JitFunction]: ...


def jit(fun: Callable[..., Any] | None = None, *, polymorphic_shapes: ArgSpecs | None = None,
        buckets: PerDimBucketSpec = None, constraints: Sequence[str] = (),
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, cache_size: int = 64,
        background_compile: bool = False, fallback: str = "warn", in_shardings: Any = None,
        out_shardings: Any = None, donate_argnames: str | Sequence[str] | None = None,
        keep_unused: bool = False, inline: bool = False, device: Any = None,
        backend: str | None = None, compiler_options: dict[str, Any] | None = None
        ) -> JitFunction | Callable[[Callable[..., Any]], JitFunction]:
  """A drop-in for `jax.jit` that pads to size buckets and masks.

  Usable as `pj.jit(f)`, `@pj.jit`, `@pj.jit(buckets=...)` or through
  `functools.partial(pj.jit, ...)`. Results, shapes, dtypes and output pytrees
  are those of `jax.jit(f)`.

  Args:
    polymorphic_shapes: one spec per positional argument in `pj.mask`'s syntax
      (None for an argument with a fixed shape). None: automatic mode, where
      axes that change between calls become dynamic.
    buckets: the bucket policy for every dimension (see `polyjit.buckets`), a
      list of sizes, an int k (multiples of k), a callable, or a dict from
      dimension name to any of these ("*" for the rest). Default:
      `pj.buckets.CostAware()`, which compiles a tighter bucket only once the
      padding it saves has paid for its compile, by estimates from the
      function's jaxpr (few programs for cheap functions, tight buckets for
      costly ones; the same choices on every run); powers of two on a mesh.
      `pj.buckets.PowersOfTwo()` is the fixed classic;
      `pj.buckets.fit(sample, max_programs=k)` plans from sizes.
    constraints: `jax.export` constraints such as "n >= 3".
    static_argnums, static_argnames, donate_argnums, donate_argnames: as in
      `jax.jit` (names and positions map to each other the same way).
    keep_unused, inline: as in `jax.jit` (`inline` matters where the function
      is called under another transformation, which inlines it).
    device, backend, compiler_options: refused with the reason (use
      `in_shardings`/`jax.device_put` to place the computation).
    cache_size: the most compiled programs kept (least recently used dropped).
    background_compile: on a new bucket, run on an already compiled larger one
      and compile the tight one in a background thread.
    fallback: what automatic mode does when `fun` cannot run with dynamic
      sizes and it compiles every distinct shape instead: "warn" (a
      `pj.FallbackWarning` once per cause), "error" (raise the reason), or
      "silent" (only `pj.explain` and the "polyjit" logger say it).
    in_shardings, out_shardings: as in `jax.jit`. Sharded arguments (these,
      or a `jax.Array` on several devices) are padded shard by shard, a
      sharded dynamic axis gets buckets that split evenly over its shards,
      and outputs keep their shardings (see `_sharding.py`).
  """
  kw: dict[str, Any] = dict(polymorphic_shapes=polymorphic_shapes, buckets=buckets,
            constraints=constraints, static_argnums=static_argnums,
            static_argnames=static_argnames, donate_argnums=donate_argnums,
            cache_size=cache_size, background_compile=background_compile,
            fallback=fallback, in_shardings=in_shardings, out_shardings=out_shardings,
            donate_argnames=donate_argnames, keep_unused=keep_unused, inline=inline,
            device=device, backend=backend, compiler_options=compiler_options)
  if fun is None:
    return functools.partial(jit, **kw)
  return JitFunction(fun, **kw)
