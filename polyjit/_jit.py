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
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import _jax_compat as jc
from . import _sharding
from ._auto import DimTracker, fit_to_constraints, sanitize
from ._buckets import BucketPolicy, as_policy
from ._cache import ExecutableCache, wait
from ._compiles import count_compiles
from ._errors import FallbackWarning, MaskingError, PolyjitError, ShapeError, warn_user
from ._jit_args import ArgLayout, aval_key, strip_padded
from ._jit_plans import (Plan, ProgramKey, Structure, Template, borrow, exact_body,
                         logical_values, lower_and_compile, masked_body, out_shapes,
                         padded_shapes, waste, zero_sized)
from ._jit_stats import Cause, Stats
from ._mask import Masked
from ._padding import Padded, logical_shape

logger = logging.getLogger("polyjit")
logger.addHandler(logging.NullHandler())  # a library prints nothing unless asked


class JitFunction:
  """A function compiled by `pj.jit`."""

  def __init__(self, fun: Callable, *, polymorphic_shapes=None, buckets=None,
               constraints: Sequence[str] = (), static_argnums=None,
               static_argnames=None, donate_argnums=None, cache_size: int = 64,
               background_compile: bool = False, fallback: str = "warn",
               in_shardings=None, out_shardings=None):
    if not callable(fun):
      raise TypeError(f"pj.jit expects a callable, got {type(fun).__name__}")
    if fallback not in ("warn", "error", "silent"):
      raise ValueError(f"fallback must be 'warn', 'error' or 'silent', got {fallback!r}")
    self.fun = fun
    self.buckets = buckets
    self.constraints = tuple(constraints)
    self.background_compile = background_compile
    self.fallback = fallback
    self.stats = Stats()
    self._args = ArgLayout(fun, repr(self), polymorphic_shapes=polymorphic_shapes,
                           static_argnums=static_argnums, static_argnames=static_argnames,
                           donate_argnums=donate_argnums)
    self._cache = ExecutableCache(cache_size, on_evict=self._forget_program)
    self._structures: dict[Any, Structure] = {}
    self._shardings = _sharding.ShardingLayout(in_shardings, out_shardings)
    self._warned: set[str] = set()
    # Deterministic across processes: the name is part of the persistent
    # compilation cache's key.
    self._name = "pj_" + sanitize(getattr(fun, "__qualname__", None) or "fun")
    self._inline = jax.jit(fun, static_argnums=self._args.static_argnums or None,
                           static_argnames=self._args.static_argnames or None,
                           **_sharding.jit_options(in_shardings, out_shardings))
    functools.update_wrapper(self, fun, updated=())

  polymorphic_shapes = property(lambda self: self._args.polymorphic_shapes)
  static_argnums = property(lambda self: self._args.static_argnums)
  static_argnames = property(lambda self: self._args.static_argnames)
  donate_argnums = property(lambda self: self._args.donate_argnums)

  def __repr__(self):
    return f"pj.jit({getattr(self.fun, '__name__', self.fun)})"

  def __get__(self, obj, objtype=None):  # methods: bind like a function would
    return self if obj is None else functools.partial(self, obj)

  def bucket_policy(self, dim: str) -> BucketPolicy:
    """The bucket policy that pads the dimension `dim`."""
    spec = self.buckets
    if isinstance(spec, dict):
      spec = spec.get(dim, spec.get("*"))
    return as_policy(spec)

  # --- calls -----------------------------------------------------------------

  def __call__(self, *args, **kwargs):
    done = self._execute(args, kwargs)
    if done is None:  # under a transformation: inline
      return self._inline(*strip_padded(args), **strip_padded(kwargs))
    plan, outs = done
    return plan.map_outputs(outs, _sharding.unpad)

  def call_padded(self, *args, **kwargs):
    """Like calling the function, but outputs with dynamic dims come back as
    `pj.Padded` (padded data on the device plus logical shape): no host round
    trip, and another `pj.jit` function takes them as they are."""
    done = self._execute(args, kwargs)
    if done is None:
      raise TypeError("call_padded cannot be used inside a JAX transformation; "
                      "call the function itself there.")
    plan, outs = done
    return plan.map_outputs(outs, lambda o, s: o if tuple(o.shape) == s else Padded(o, s))

  def _execute(self, args, kwargs):
    """(plan, padded outputs) for a call, or None under a transformation."""
    prepared = self._prepare(args, kwargs)
    if prepared is None:
      return None
    struct, leaves, shapes = prepared
    plan = self._plan_for(struct, shapes)
    self.stats.record_call(bucket=plan.bucket, waste=plan.waste, fallback=plan.fallback)
    if struct.shardings is not None:  # on a mesh: padded shard by shard
      return plan, _sharding.run(plan, leaves, struct.shardings)
    return plan, plan.run(leaves)

  def _prepare(self, args, kwargs):
    """(structure, leaves, logical shapes), or None when a leaf is a tracer."""
    static_key, leaves, treedef = self._args.flatten(args, kwargs)
    avals = tuple(aval_key(x) for x in leaves)
    if None in avals:
      return None
    shapes = tuple(logical_shape(x) for x in leaves)
    key = (static_key, treedef, avals, tuple(len(s) for s in shapes))
    shardings = self._shardings.leaf_shardings(leaves, treedef)
    if shardings is not None:
      key += (shardings,)
    struct = self._structures.get(key)
    if struct is None:
      struct = self._structures[key] = self._new_structure(key, treedef, avals, shapes)
    return struct, leaves, shapes

  def _new_structure(self, key, treedef, avals, shapes) -> Structure:
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

  def _plan_for(self, struct: Structure, shapes) -> Plan:
    plan = struct.plan(shapes)
    if plan is None:
      plan = self._new_plan(struct, shapes)
      struct.remember(shapes, plan)
    return plan

  def _forget_program(self, key: ProgramKey):
    """Drops the plans that run an evicted program, so that it can be freed."""
    for struct in list(self._structures.values()):
      struct.forget(key)

  # --- new plans -----------------------------------------------------------------

  def _new_plan(self, struct: Structure, shapes) -> Plan:
    changed, became = struct.observe(shapes)
    why = functools.partial(Cause, shapes=shapes, changed=changed, became_dynamic=became)
    if struct.specs is None or struct.exact_only:
      kind = "fallback" if struct.exact_only else ("exact" if changed else "first call")
      return self._exact_plan(struct, shapes, why(kind, error=struct.fallback_reason))
    if zero_sized(struct.specs, shapes):
      # A masked trace assumes sizes >= 1; jax.jit's own program for the empty
      # shapes gives exactly its shapes, values and exceptions.
      return self._exact_plan(struct, shapes, why("zero size"))
    try:
      return self._masked_plan(struct, shapes, why("bucket"))
    except Exception as e:
      if struct.tracker is None:  # explicit mode: the user asked for masking
        raise
      self._fall_back(struct, e)
      return self._exact_plan(struct, shapes, why("fallback", error=struct.fallback_reason))

  def _fall_back(self, struct: Structure, error: Exception):
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

  def _exact_plan(self, struct: Structure, shapes, why: Cause) -> Plan:
    key = ProgramKey.exact_shapes(struct, shapes)
    program = self._cache.get(key, lambda: self._compile(
        key, exact_body(struct.treedef, self._args.bind_static(struct.static_key)),
        struct, why))
    return Plan(key, program, struct.dtypes, (), None, 0.0, fallback=struct.exact_only)

  def _fast_plan(self, struct: Structure, shapes) -> Plan | None:
    """The plan for new sizes in a bucket that already has one, or None.

    The common case on the call path (every call with a new length): the
    sizes are read off the shapes, the bucket's program and padded shapes are
    reused, and only the logical sizes and output shapes are computed. The
    full path (`_masked_plan`) runs for anything else, and is the only one
    that records templates: no constraints or guards to check, no background
    compile, and a program still in the cache.
    """
    found = struct.template(shapes, lambda v, n: self._bucket(struct, v, n))
    if found is None:
      return None
    template, logical = found
    fut = self._cache.peek(template.plan.key)
    if fut is None or not fut.done() or not template.variant.holds(logical):
      return None
    self.stats.record_sizes(template.binding, struct.leaf_names, logical)
    return template.plan_at(shapes, logical)

  def _masked_plan(self, struct: Structure, shapes, why: Cause) -> Plan:
    """A plan that runs the masked program of the bucket these sizes fall in."""
    fast = self._fast_plan(struct, shapes)
    if fast is not None:
      return fast
    masked, binding, variant = self._variant(struct, shapes)
    logical = binding.padded  # solved from unpadded shapes: the logical sizes
    if struct.shardings is not None:
      struct.shard_multiples = _sharding.dim_multiples(binding, struct.shardings)
    buckets = {v: self._bucket(struct, v, n) for v, n in logical.items()}
    padded_env = fit_to_constraints(logical, buckets, variant.scope)
    self.stats.record_sizes(binding, struct.leaf_names, logical)
    why = dataclasses.replace(why, bucket=dict(padded_env), sizes=dict(logical),
                              variant=variant.describe() if variant.decisions else None)
    key, build = self._masked_program(struct, masked, binding, variant, padded_env, why)
    key, program, provisional = self._program(key, build, shapes)
    out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
    plan = Plan(key, program, struct.dtypes, logical_values(binding, logical),
                out_shapes(out_dims, logical), waste(shapes, key.padded_shapes), provisional)
    if provisional is None and not variant.constraints and dict(padded_env) == buckets:
      template = Template.of(plan, binding, variant, out_dims)
      if template is not None:
        struct.templates[key.bucket] = template
    return plan

  def _bucket(self, struct: Structure, dim: str, size: int) -> int:
    """The padded size of `dim`: its policy's bucket, rounded up to a multiple
    of the number of shards along it where it is a sharded axis."""
    bucket = self.bucket_policy(dim).bucket(size)
    multiple = struct.shard_multiples.get(dim, 1)
    return bucket if multiple == 1 else _sharding.round_up(bucket, multiple)

  def _program(self, key: ProgramKey, build, shapes):
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

  def _variant(self, struct: Structure, shapes):
    """The masked function, its binding at these (logical) shapes, and the
    variant of `fun` that these sizes select (`_variants.py`): one per side
    of each size comparison `fun` makes, traced on first use."""
    args = struct.abstract_args(shapes)
    if struct.masked is None:
      fun = self._args.bind_static(struct.static_key)
      struct.masked = Masked(lambda a, k: fun(*a, **k), struct.spec_tree(),
                             constraints=self.constraints)
      struct.masked.__name__ = getattr(self.fun, "__name__", "fun")
    binding = struct.masked.bind(args)
    return struct.masked, binding, struct.masked.variant_for(args, binding.padded, binding)

  def _masked_program(self, struct, masked, binding, variant, env, cause: Cause):
    """(key, build) of the program of `variant` at the padded sizes `env`."""
    key = ProgramKey.masked(struct, variant, padded_shapes(binding, env), env)
    body = masked_body(struct.treedef, masked, variant, env)
    return key, functools.partial(self._compile, key, body, struct, cause,
                                  len(binding.dim_names))

  def _compile(self, key: ProgramKey, body, struct: Structure, cause: Cause, n_dims=0):
    donate = self._args.donated_leaves(struct.treedef, struct.static_key)
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
    self.stats.record_compile(key, cause, log,
                              program_name=jc.jit_program_name(self._name),
                              wall_seconds=time.perf_counter() - t0)
    return program

  # --- ahead of time ---------------------------------------------------------

  def precompile(self, *args, sizes: dict[str, Sequence[int]] | None = None,
                 progress: bool = True, **kwargs) -> list[dict[str, int]]:
    """Compiles the buckets that serve `sizes`, in parallel threads.

    `args`/`kwargs` are example arguments (arrays or `jax.ShapeDtypeStruct`s)
    giving the structure, dtypes and fixed dims; `sizes` maps dimension names
    (the spec names, or in automatic mode `<argument>_<axis>`) to the logical
    sizes to serve. Returns the padded sizes compiled.
    """
    examples = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.typeof(x).dtype)
                            if not isinstance(x, jax.ShapeDtypeStruct) else x, (args, kwargs))
    struct, _, shapes = self._prepare(*examples)
    if struct.tracker is not None and sizes and struct.tracker.force_dynamic(list(sizes)):
      struct.reset(tuple(struct.tracker.specs()))
    if struct.specs is None or not sizes:
      self._plan_for(struct, shapes)
      return [{}]
    masked, binding, variant = self._variant(struct, shapes)
    unknown = set(sizes) - set(binding.dim_names)
    if unknown:
      raise ShapeError(f"precompile: unknown dimension names {sorted(unknown)}; this "
                       f"function's dimensions are {list(binding.dim_names)}.")
    per_dim = {v: sorted({self.bucket_policy(v).bucket(n)
                          for n in sizes.get(v, [binding.padded[v]])})
               for v in binding.dim_names}
    envs = [dict(zip(per_dim, combo)) for combo in itertools.product(*per_dim.values())]
    futures = []
    for env in envs:
      key, build = self._masked_program(struct, masked, binding, variant, env,
                                        Cause("precompile", bucket=env))
      futures.append(self._cache.submit(key, build))
    wait(futures, progress=progress, desc=f"precompiling {getattr(self.fun, '__name__', 'fun')}")
    return envs


def jit(fun: Callable | None = None, *, polymorphic_shapes=None, buckets=None,
        constraints: Sequence[str] = (), static_argnums=None, static_argnames=None,
        donate_argnums=None, cache_size: int = 64, background_compile: bool = False,
        fallback: str = "warn", in_shardings=None, out_shardings=None):
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
      dimension name to any of these ("*" for the rest). Default: powers of
      two from 16.
    constraints: `jax.export` constraints such as "n >= 3".
    static_argnums, static_argnames, donate_argnums: as in `jax.jit`.
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
  kw = dict(polymorphic_shapes=polymorphic_shapes, buckets=buckets,
            constraints=constraints, static_argnums=static_argnums,
            static_argnames=static_argnames, donate_argnums=donate_argnums,
            cache_size=cache_size, background_compile=background_compile,
            fallback=fallback, in_shardings=in_shardings, out_shardings=out_shardings)
  if fun is None:
    return functools.partial(jit, **kw)
  return JitFunction(fun, **kw)
