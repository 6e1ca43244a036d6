"""`pj.jit`: a drop-in for `jax.jit` that compiles once per bucket, not per shape.

A call goes through these steps, all on the host:

1. split static arguments off and flatten the rest (a `pj.Padded` is a leaf);
2. look up the *structure* (static values, pytree, dtypes, ranks) and, within
   it, the *plan* for these exact shapes; a plan knows the padded shape of
   every argument, the logical sizes, the compiled program and how to unpad
   the outputs, so a repeated shape costs a dict lookup;
3. pad the arguments to the bucket (on the host, `_masking/padding.py`; on
   the accelerator path, `jax.Array`s on their device, `resident.py`; on a
   mesh shard by shard, `_sharding/placement.py`: one path, whose one-device
   case has no shardings), run the program with the logical sizes as runtime
   values, slice outputs with dynamic dims back to their logical shapes (on
   the accelerator path on the device, keeping the padded buffer for a
   chained `pj.jit` call).

polyjit's own transfers (size scalars, host buffers) are explicit, as
`jax.device_put`'s, so calls run under `jax.transfer_guard("disallow")`.

Everything is keyed, as `jax.jit` keys its caches, by the trace context too
(`jc.trace_context()`: `jax_enable_x64`, dtype promotion, matmul precision,
`jax.disable_jit()`, ...): a structure's `StructureKey.context`, and the hot
path's plans per context (`_HotCalls`), so that a trace made under one
configuration never serves a call under another.

A repeated call skips steps 1-2: positional arrays and scalars are keyed by
`call_signature` (dtype, weak type, shape each) straight to their plan, which
pads only the leaves that need it (into an aligned host buffer XLA:CPU uses
in place: `_masking/padding.py`), passes logical sizes already on the device
(a resized plan's after its first few calls: `Plan.host_call`), and returns
outputs without dynamic dims as the program made them (nothing blocks the
host). Only outputs with dynamic dims are sliced (on the host; on the
accelerator path on the device: `resident.py`).
A signature not seen before, of a structure seen before (same types and
ranks, `rank_signature`), whose sizes fall in a compiled bucket with a
template, takes that bucket's plan resized (`Plan.resized`): new padding
regions and size scalars, no new plan, trace or compile (`_resized_plan`).

On a plan miss, the logical size of every dimension variable is solved from the
argument shapes, rounded up by the bucket policy, and the program for those
padded sizes comes from the executable cache (`_caching/executables.py`),
compiled there once (`compile.py`): `jax.jit` of `pj.mask(fun)` lowered at the
padded shapes.

Explicit mode (`polymorphic_shapes=`) uses the given specs. Automatic mode
learns them (`auto.py`): the first call compiles the exact shapes, and axes
that vary become dynamic. Python branching on a size gets one variant per
side of the comparison (`_masking/variants.py`): the sizes of a call select
the variant on their side, traced once, and each variant has its own program
per bucket.
If `fun` still cannot be traced or masked with symbolic sizes (a primitive
without a masking rule), the structure falls back to exact shapes, like
`jax.jit`, and says so: a `pj.FallbackWarning` once per function and cause
(`fallback="warn"`, the default), an error (`fallback="error"`), or only
`pj.explain` and the "polyjit" logger (`fallback="silent"`).

Under `pj.buckets.CostAware` (`_buckets/cost_aware.py`, its bookkeeping in
`bucket_choice.py`), the default, the bucket of a call is the smallest
compiled one that holds it; a tighter one compiles once the run time its
absence wastes has paid for a compile (both estimated from the function's
jaxpr, `_buckets/cost_model.py`, so the choice is the same on every run).
On a mesh the default is powers of two: a fixed policy.

Called under another transformation (`jax.jit`, `jax.grad`, `jax.vmap`), a
`pj.jit` function is inlined: the outer trace has fixed shapes anyway.

This module holds `JitFunction`, the call path only: the hot path, the
resized plans, and dispatch to the parts it ties together: `planner.py`
(structures, and the policy of when to mask, fall back and warn),
`bucket_choice.py` (bucket policies and the cost-aware bookkeeping),
`compile.py` (programs through the executable cache), `args.py` (static
arguments, leaves, leaf names, explicit specs, donation), `plans.py`
(structures, plans, program keys and bodies), `templates.py` (a bucket's
plan resized for new sizes), `aot.py` (the ahead-of-time stages) and
`stats.py` (the typed record `pj.stats` and `pj.explain` read).
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any, Callable, Sequence, Unpack, overload

import jax
import numpy as np

from .. import _jax as jc
from .._buckets.fixed import BucketPolicy
from .._caching.executables import ExecutableCache
from .._masking import verify as _verify
from .._masking.padding import Padded
from .._sharding import placement as _sharding
from . import annotations as _annotations, aot as _jit_aot
from .args import ArgLayout, call_signature, rank_signature, split_signature, strip_padded
from .auto import sanitize
from .bucket_choice import BucketChoice
from .compile import Compiler
from .hot_shapes import HotShapes
from .options import JitOptions, check as check_options, default, with_signature
from .planner import Planner
from .plans import Plan, ProgramKey, Structure
from .stats import Stats

HOT_PLANS = 16384 # call signatures kept for the hot path (then it starts over)


class _HotCalls:
  """The hot path's state under one trace context."""
  __slots__ = ("hot", "by_rank")

  def __init__(self) -> None:
    # call_signature -> plan; None (no signature) is looked up, never stored
    self.hot: dict[tuple[Any, ...] | None, Plan] = {}
    # rank_signature -> its structure, for new sizes of hot signatures (`_resized_plan`)
    self.by_rank: dict[tuple[Any, ...], Structure] = {}

  def keep(self, key: tuple[Any, ...], plan: Plan) -> None:
    if len(self.hot) >= HOT_PLANS:
      self.hot.clear()
    self.hot[key] = plan


class JitFunction:
  """A function compiled by `pj.jit`."""

  def __init__(self, fun: Callable[..., Any], **options: Unpack[JitOptions]) -> None:
    if not callable(fun):
      raise TypeError(f"pj.jit expects a callable, got {type(fun).__name__}")
    check_options(options)
    self.fun = fun
    # Each option's default is given here, where it is read (`options.py`).
    self.buckets = default(options, "buckets")
    self.constraints = tuple(default(options, "constraints"))
    self.background_compile = default(options, "background_compile")
    self.fallback = default(options, "fallback")
    self.stats = Stats()
    # jaxtyping annotations name the dynamic dims unless specs are given; being
    # inferred, like automatic mode's, they fall back to exact shapes if need be.
    specs = default(options, "polymorphic_shapes")
    annotated = _annotations.annotated_specs(fun) if specs is None else None
    specs = annotated if annotated is not None else specs
    # `pj.jit(jnp.unique)` traces as `pj.jit(lambda v: jnp.unique(v))` does
    traced = jc.as_called_by_name(fun)
    self._args = ArgLayout(traced, repr(self), polymorphic_shapes=specs,
                           static_argnums=default(options, "static_argnums"),
                           static_argnames=default(options, "static_argnames"),
                           donate_argnums=default(options, "donate_argnums"),
                           donate_argnames=default(options, "donate_argnames"))
    self._args.specs_per_parameter = annotated is not None
    self._static = self._args.has_static  # (read on every call)
    self._cache = ExecutableCache(default(options, "cache_size"), on_evict=self._forget_program)
    in_shardings = default(options, "in_shardings")
    out_shardings = default(options, "out_shardings")
    self._shardings = _sharding.ShardingLayout(in_shardings, out_shardings)
    # Deterministic across processes: the name is part of the persistent
    # compilation cache's key.
    name = "pj_" + sanitize(getattr(fun, "__qualname__", None) or "fun")
    compiler = Compiler(name, repr(self), self._args, self.stats, self._cache,
                        out_shardings=out_shardings, background=self.background_compile)
    self._buckets = BucketChoice(self.buckets, compiler)
    self._hot_shapes = HotShapes(fun, self.stats, compiler.seconds,
                                 donate_argnums=self._args.donate_argnums or None,
                                 donate_argnames=self._args.donate_argnames or None,
                                 keep_unused=default(options, "keep_unused"),
                                 inline=default(options, "inline"),
                                 in_shardings=in_shardings, out_shardings=out_shardings)
    self._planner = Planner(traced, self._args, self._shardings, compiler, self._buckets,
                            self.stats, constraints=self.constraints, fallback=self.fallback,
                            specs_may_fall_back=annotated is not None)
    self._structures = self._planner.structures  # (the same dict: tests and benchmarks read it)
    # trace context (`jc.trace_context()`: x64, dtype promotion, ...) -> the
    # hot path's plans and structures under it, as jax.jit keys its caches
    self._contexts: dict[Any, _HotCalls] = {}
    # (context, its _HotCalls) last looked up: a call under the same context
    # compares its 46-item tuple with that one instead of hashing it (0.15 us)
    self._last_context: tuple[Any, _HotCalls] | None = None
    self._inline = jax.jit(fun, static_argnums=self._args.static_argnums or None,
                           static_argnames=self._args.static_argnames or None,
                           keep_unused=default(options, "keep_unused"),
                           inline=default(options, "inline"),
                           **_sharding.jit_options(in_shardings, out_shardings))
    functools.update_wrapper(self, fun, updated=())

  @property
  def _hot(self) -> dict[tuple[Any, ...] | None, Plan]:
    """The hot path's plans under the current trace context (tests read it)."""
    calls = self._contexts.get(jc.trace_context())
    return {} if calls is None else calls.hot

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
    return self._buckets.policy(dim)

  # --- calls -----------------------------------------------------------------

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    # (a try costs nothing until it catches: the hot path stays as it was)
    try:
      if _verify.enabled():  # the checking mode: jax.jit at the exact shapes agrees
        return _verify.checked_call(repr(self), self._reference, self, args, kwargs)
      # The hot path: positional arrays and scalars whose signature was seen
      # under this trace context (what jax.jit keys on besides the arguments).
      context = jc.trace_context()
      last = self._last_context
      if last is not None and last[0] == context:
        calls: _HotCalls | None = last[1]
      else:
        calls = self._contexts.get(context)
        if calls is not None:
          self._last_context = (context, calls)  # (one assignment: threads see either)
      key = None if kwargs or self._static else call_signature(args)
      if calls is not None:
        plan = calls.hot.get(key)
        if plan is not None:
          exact = plan.exact_call
          if exact is not None:  # shapes that bought their own program (`hot_shapes.py`)
            self.stats.calls += 1
            return exact(*args)
          if plan.current:
            return plan.call(args, self.stats)  # (the hot call: everything in one method)
        if key is not None:  # a never-seen size in a compiled bucket: the bucket's plan, resized
          plan = self._resized_plan(calls, key)
          if plan is not None:
            self.stats.record_call(plan.bucket, plan.waste, plan.fallback)
            if plan.borrow is not None:
              plan.pay()
            return plan.unpad_outputs(plan.run_plain(args))
      if jc.jit_disabled():  # jax.disable_jit(): run `fun` eagerly, as jax.jit does
        return self._inline(*strip_padded(args), **strip_padded(kwargs))
      done = self._execute(args, kwargs, key)
      if done is None:  # under a transformation (or `Structure.uncanonical`): inline
        return self._inline(*strip_padded(args), **strip_padded(kwargs))
      plan, outs = done
      return plan.unpad_outputs(outs)
    except jc.InternalFloatingPointError:
      # jax_debug_nans/debug_infs found NaN or inf in the padded outputs
      return self._call_checking_floats(args, kwargs)

  def _call_checking_floats(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """A call whose program put NaN or inf in its padded outputs while
    jax_debug_nans or jax_debug_infs is on. The padding holds what the
    user's program never computes (a sort rule's fill, 0/0 or log 0 of
    padding), so the call runs again with the checks off and its outputs at
    their logical shapes are checked as jax.jit checks its outputs; where
    they hold what the flags look for, jax.jit runs on the same arguments
    with the checks on, and raises JAX's own FloatingPointError (naming
    the operation that made it, as jax.jit does)."""
    nans, infs = jc.float_checks()
    with jc.float_checks_off():
      outs = self(*args, **kwargs)
    found = jc.floats_found(jax.tree.leaves(outs), nans, infs)
    if found is not None:
      self._reference(*args, **kwargs)
      raise FloatingPointError(f"invalid value ({found}) encountered in {self!r}")
    return outs

  def _reference(self, *args: Any, **kwargs: Any) -> Any:
    """`jax.jit(fun)` at the exact shapes (the checking mode's reference)."""
    return self._inline(*strip_padded(args), **strip_padded(kwargs))

  def call_padded(self, *args: Any, **kwargs: Any) -> Any:
    """Like calling the function, but outputs with dynamic dims come back as
    `pj.Padded` (padded data on the device plus logical shape): no host round
    trip, and another `pj.jit` function takes them as they are."""
    done = self._execute(args, kwargs)
    if done is None and not any(isinstance(x, jc.Tracer) for x in jax.tree.leaves((args, kwargs))):
      return self._inline(*strip_padded(args), **strip_padded(kwargs))  # (`Structure.uncanonical`)
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
    prepared = self._planner.prepare(args, kwargs)
    if prepared is None:
      return None
    struct, leaves, shapes = prepared
    if struct.uncanonical is not None:  # jax.jit's own program (`args.uncanonical_array`)
      self._planner.announce.uncanonical(struct, leaves)
      return None
    plan = self._planner.plan_for(struct, shapes)
    if hot_key is not None and plan.current and struct.shardings is None \
        and self._shardings.one_device():
      # Only where no argument can be on a mesh: the hot key has no shardings.
      calls = self._contexts.get(struct.key.context)
      if calls is None:
        calls = self._contexts[struct.key.context] = _HotCalls()
      calls.keep(hot_key, plan)
      calls.by_rank[rank_signature(hot_key)] = struct
      self._hot_shapes.eligible(plan)
    self.stats.record_call(plan.bucket, plan.waste, plan.fallback)
    if plan.borrow is not None:
      plan.pay()
    rental = struct.rental  # (None on a mesh: fixed buckets there)
    if rental is None or plan.bucket is None or not rental.wants_sample(plan.bucket):
      return plan, plan.run(leaves)
    t0 = time.perf_counter()  # a new shape: time it (repeated shapes never block)
    # jax.block_until_ready carries no annotations (strict only)
    outs = jax.block_until_ready(plan.run(leaves))  # type: ignore[no-untyped-call, unused-ignore]
    rental.record_time(plan.bucket, time.perf_counter() - t0)
    return plan, outs

  def _resized_plan(self, calls: _HotCalls, key: tuple[Any, ...]) -> Plan | None:
    """The plan for a call signature not seen before whose structure was (the
    same argument types and ranks, under this trace context), when its sizes
    fall in a compiled bucket with a template: that bucket's plan, resized
    (`Plan.resized`). None sends the call down the general path (`_execute`)."""
    ranks, shapes = split_signature(key)
    struct = calls.by_rank.get(ranks)
    if struct is None or (struct.rental is not None and struct.rental.measured):
      return None  # (measured estimates time a new shape's first run: `_execute`)
    plan = struct.plan(shapes)
    if plan is None:
      plan = self._planner.fast_plan(struct, shapes)
      if plan is None:
        return None
      struct.remember(shapes, plan)
    if plan.current:
      hot = calls.hot  # (`_HotCalls.keep`, inline: every new size)
      if len(hot) >= HOT_PLANS:
        hot.clear()
      hot[key] = plan
      self._hot_shapes.eligible(plan)
    return plan

  def _forget_program(self, key: ProgramKey) -> None:
    """Drops the plans that run an evicted program, so that it can be freed."""
    self._planner.forget_program(key)

  # --- ahead of time ---------------------------------------------------------

  def trace(self, *args: Any, **kwargs: Any) -> _jit_aot.Traced:
    """The program a call with these arguments runs, traced (as `jax.jit`'s `trace`)."""
    return _jit_aot.trace(self._planner, args, kwargs)

  def lower(self, *args: Any, **kwargs: Any) -> _jit_aot.Lowered:
    """The program a call with these arguments runs, lowered (as `jax.jit`'s `lower`)."""
    return _jit_aot.lower(self._planner, args, kwargs)

  def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
    """`jax.jit(fun).eval_shape(*args, **kwargs)`: output shapes, nothing run."""
    return _jit_aot.eval_shape(self._planner, args, kwargs)

  def clear_cache(self) -> None:
    """Drops every compiled program, plan and trace of this function (its
    statistics stay)."""
    self._structures.clear()   # traces, plans and the cost-aware accounts
    self._contexts.clear()
    self._last_context = None
    self._cache.clear()
    self._hot_shapes.jitted.clear_cache()  # (the hot shapes' own programs)

  def precompile(self, *args: Any, sizes: dict[str, Sequence[int]] | None = None,
                 progress: bool = True, **kwargs: Any) -> list[dict[str, int]]:
    """Compiles the buckets that serve `sizes`, in parallel threads.

    `args`/`kwargs` are example arguments (arrays or `jax.ShapeDtypeStruct`s)
    giving the structure, dtypes and fixed dims; `sizes` maps dimension names
    (the spec names, or in automatic mode `<argument>_<axis>`) to the logical
    sizes to serve. Returns the padded sizes compiled.
    """
    def example(x: Any) -> Any:
      # (an array's sharding and weak type kept: they are part of the call's
      # structure, and a program precompiled without them serves no call)
      if isinstance(x, jax.ShapeDtypeStruct):
        return x
      aval = jax.typeof(x)
      sharding = x.sharding if isinstance(x, jax.Array) else None
      # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
      return jax.ShapeDtypeStruct(np.shape(x), aval.dtype, sharding=sharding,  # type: ignore[no-untyped-call, unused-ignore]
                                  weak_type=aval.weak_type)
    examples = jax.tree.map(example, (args, kwargs))
    return self._planner.precompile(examples, sizes, progress)


@overload
def jit(fun: Callable[..., Any], **options: Unpack[JitOptions]) -> JitFunction: ...


@overload
def jit(fun: None = None, **options: Unpack[JitOptions]
        ) -> Callable[[Callable[..., Any]], JitFunction]: ...


def jit(fun: Callable[..., Any] | None = None, **options: Unpack[JitOptions]
        ) -> JitFunction | Callable[[Callable[..., Any]], JitFunction]:
  """A drop-in for `jax.jit` that pads to size buckets and masks.

  Usable as `pj.jit(f)`, `@pj.jit`, `@pj.jit(buckets=...)` or through
  `functools.partial(pj.jit, ...)`. Results, shapes, dtypes and output pytrees
  are those of `jax.jit(f)`.

  The keyword arguments are `JitOptions` (`_jit/options.py`), their one
  definition, which `pj.filter_jit` and `JitFunction` take too.

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
      and outputs keep their shardings (see `_sharding/placement.py`).
  """
  if fun is None:
    check_options(options)  # refused now, as a written-out signature would
    return functools.partial(jit, **options)
  return JitFunction(fun, **options)


# `help(pj.jit)` and IDEs see every keyword with its default, as for jax.jit.
with_signature(jit, inspect.Parameter("fun", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                 annotation="Callable[..., Any] | None"))
