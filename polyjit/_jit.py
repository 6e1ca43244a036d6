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
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import _jax_compat as jc
from . import _spec
from ._auto import DimTracker, fit_to_constraints, sanitize
from ._buckets import BucketPolicy, as_policy
from ._cache import ExecutableCache
from ._errors import FallbackWarning, MaskingError, PolyjitError, ShapeError, warn_user
from ._mask import Masked
from ._padding import Padded, is_padded, logical_shape, pad, unpad
from .diagnostics._compiles import count_compiles

logger = logging.getLogger("polyjit")
logger.addHandler(logging.NullHandler())  # a library prints nothing unless asked

_PLANS_PER_STRUCTURE = 4096


class _Structure:
  """Everything known about one call structure (static values, tree, dtypes)."""

  def __init__(self, key, treedef, avals, leaf_names):
    self.key = key
    self.treedef = treedef
    self.avals = avals                  # per leaf: (dtype, weak_type)
    self.leaf_names = leaf_names
    self.tracker: DimTracker | None = None
    self.specs: tuple | None = None     # per-leaf specs in use (None: exact)
    self.masked: Masked | None = None   # `fun` masked with the specs in use
    self.last_shapes = None             # shapes of the latest new plan
    self.exact_only = False
    self.fallback_reason: str | None = None   # why exact_only, for messages
    self.plans: collections.OrderedDict = collections.OrderedDict()
    self.templates: dict = {}           # bucket -> _Template (see JitFunction._fast_plan)


class _Plan:
  __slots__ = ("key", "program", "padded_shapes", "dtypes", "logical", "out_shapes",
               "bucket", "waste", "provisional", "fallback")

  def __init__(self, key, program, padded_shapes, dtypes, logical, out_shapes, bucket,
               waste, provisional=None, fallback=False):
    self.key = key                      # the program's key in the executable cache
    self.program = program
    self.padded_shapes = padded_shapes
    self.dtypes = dtypes
    self.logical = logical              # tuple of int32 scalars for the program
    self.out_shapes = out_shapes        # per output leaf logical shape, or None
    self.bucket = bucket                # {dim: padded size}, for stats
    self.waste = waste                  # fraction of input elements that are padding
    self.provisional = provisional      # future of the tighter bucket, if borrowing
    self.fallback = fallback            # exact shapes because masking failed


class _Template:
  """A bucket's plan, kept so that a new size in that bucket needs no binding,
  tracing or constraint solving: only its logical sizes change."""
  __slots__ = ("plan", "binding", "variant", "out_dims", "places", "fixed")

  def __init__(self, plan, binding, variant, out_dims, places, fixed):
    self.plan = plan
    self.binding = binding
    self.variant = variant              # the sizes it serves must select it
    self.out_dims = out_dims            # per output leaf, its symbolic shape
    self.places = places                # dim -> [(leaf, axis)] where it is the axis size
    self.fixed = fixed                  # [((leaf, axis), size)] of the fixed axes


def _simple_places(binding):
  """(dim -> [(leaf, axis)], fixed axes) when every axis is a fixed size or a
  bare dim; None when an axis is an expression (`2*n`, `n + 1`) whose sizes
  only binding can solve."""
  places: dict[str, list] = {}
  fixed = []
  for i, leaf in enumerate(binding.leaves):
    for axis, d in enumerate(leaf.symbolic_shape):
      if not jc.is_symbolic_dim(d):
        fixed.append(((i, axis), int(d)))
        continue
      form = jc.linear_form(d)
      if form is None or form[1] != 0 or len(form[0]) != 1 or set(form[0].values()) != {1}:
        return None
      places.setdefault(next(iter(form[0])), []).append((i, axis))
  if set(places) != set(binding.dim_names):
    return None
  return places, tuple(fixed)


class Stats:
  """What a `pj.jit` function has done; see `pj.stats` and `pj.explain`."""

  def __init__(self):
    self.calls = 0
    self.fallback_calls = 0
    self.cache_loads = 0                  # programs loaded from the persistent cache
    self.compile_events: list[dict] = []  # one per program built, with its cause
    self.bucket_hits: collections.Counter = collections.Counter()
    self.dims: dict[str, dict] = {}       # dim -> {"where": (name, axis), "sizes": set}
    self._waste_sum = 0.0
    self._waste_calls = 0

  @property
  def compiles(self) -> int:
    return sum(e["events"] for e in self.compile_events)

  @property
  def compile_seconds(self) -> float:
    return sum(e["seconds"] for e in self.compile_events)

  @property
  def padding_waste(self) -> float:
    return self._waste_sum / self._waste_calls if self._waste_calls else 0.0

  def record_sizes(self, binding, leaf_names, logical: dict[str, int]) -> None:
    for dim, size in logical.items():
      entry = self.dims.get(dim)
      if entry is None:
        entry = self.dims[dim] = {"where": _where(binding, leaf_names, dim), "sizes": set()}
      entry["sizes"].add(size)


def _where(binding, leaf_names, dim) -> tuple[str, int] | None:
  """(argument name, axis) of the first axis whose size is exactly `dim`."""
  for leaf, name in zip(binding.leaves, leaf_names):
    for axis, d in enumerate(leaf.symbolic_shape):
      if jc.dim_vars(d) == {dim} and jc.linear_form(d) == ({dim: 1}, 0):
        return name, axis
  return None


def _changed_axes(struct, shapes) -> list[tuple[str, int, int, int]]:
  """(argument, axis, old size, new size) against the structure's last new plan."""
  previous = struct.last_shapes
  if previous is None:
    return []
  return [(name, axis, old, new)
          for name, p, s in zip(struct.leaf_names, previous, shapes)
          for axis, (old, new) in enumerate(zip(p, s)) if old != new]


class JitFunction:
  """A function compiled by `pj.jit`."""

  def __init__(self, fun: Callable, *, polymorphic_shapes=None, buckets=None,
               constraints: Sequence[str] = (), static_argnums=None,
               static_argnames=None, donate_argnums=None, cache_size: int = 64,
               background_compile: bool = False, fallback: str = "warn"):
    if not callable(fun):
      raise TypeError(f"pj.jit expects a callable, got {type(fun).__name__}")
    if fallback not in ("warn", "error", "silent"):
      raise ValueError(f"fallback must be 'warn', 'error' or 'silent', got {fallback!r}")
    self.fallback = fallback
    self._warned: set[str] = set()
    self.fun = fun
    self.polymorphic_shapes = (None if polymorphic_shapes is None
                               else _as_tuple(polymorphic_shapes))
    self.buckets = buckets
    self.constraints = tuple(constraints)
    self.static_argnums = _normalize_argnums(static_argnums)
    self.static_argnames = tuple(_as_tuple(static_argnames or ()))
    self.donate_argnums = _normalize_argnums(donate_argnums)
    self.background_compile = background_compile
    self.stats = Stats()
    self._cache = ExecutableCache(cache_size, on_evict=self._forget_program)
    self._structures: dict[Any, _Structure] = {}
    self._signature = _signature(fun)
    # Deterministic across processes: the name is part of the persistent
    # compilation cache's key.
    self._name = "pj_" + sanitize(getattr(fun, "__qualname__", None) or "fun")
    self._inline = jax.jit(fun, static_argnums=self.static_argnums or None,
                           static_argnames=self.static_argnames or None)
    functools.update_wrapper(self, fun, updated=())

  def __repr__(self):
    return f"pj.jit({getattr(self.fun, '__name__', self.fun)})"

  def __get__(self, obj, objtype=None):  # methods: bind like a function would
    return self if obj is None else functools.partial(self, obj)

  # --- calls -----------------------------------------------------------------

  def __call__(self, *args, **kwargs):
    done = self._execute(args, kwargs)
    if done is None:  # under a transformation: inline
      return self._inline(*_strip_padded(args), **_strip_padded(kwargs))
    return _map_outputs(*done, unpad)

  def call_padded(self, *args, **kwargs):
    """Like calling the function, but outputs with dynamic dims come back as
    `pj.Padded` (padded data on the device plus logical shape): no host round
    trip, and another `pj.jit` function takes them as they are."""
    done = self._execute(args, kwargs)
    if done is None:
      raise TypeError("call_padded cannot be used inside a JAX transformation; "
                      "call the function itself there.")
    return _map_outputs(*done, lambda o, s: o if tuple(o.shape) == s else Padded(o, s))

  def _execute(self, args, kwargs):
    """(plan, padded outputs) for a call, or None under a transformation."""
    prepared = self._prepare(args, kwargs)
    if prepared is None:
      return None
    struct, leaves, shapes = prepared
    plan = self._plan_for(struct, shapes)
    return plan, self._run(plan, leaves)

  def _forget_program(self, key):
    """Drops the plans that run an evicted program, so that it can be freed."""
    for struct in list(self._structures.values()):
      stale = [s for s, p in struct.plans.items() if p.key == key]
      for shapes in stale:
        struct.plans.pop(shapes, None)
      for bucket in [b for b, t in struct.templates.items() if t.plan.key == key]:
        del struct.templates[bucket]

  def _run(self, plan: _Plan, leaves):
    self.stats.calls += 1
    if plan.fallback:
      self.stats.fallback_calls += 1
    if plan.bucket is not None:
      self.stats.bucket_hits[_bucket_key(plan.bucket)] += 1
      self.stats._waste_sum += plan.waste
      self.stats._waste_calls += 1
    ins = [pad(x, s, d) for x, s, d in zip(leaves, plan.padded_shapes, plan.dtypes)]
    return plan.program(*ins, plan.logical)

  def _prepare(self, args, kwargs):
    """(structure, leaves, logical shapes), or None when a leaf is a tracer."""
    static_key, dyn_args, dyn_kwargs = self._split(args, kwargs)
    leaves, treedef = jax.tree.flatten((dyn_args, dyn_kwargs), is_leaf=is_padded)
    avals = tuple(_aval_key(x) for x in leaves)
    if None in avals:
      return None
    shapes = tuple(logical_shape(x) for x in leaves)
    key = (static_key, treedef, avals, tuple(len(s) for s in shapes))
    struct = self._structures.get(key)
    if struct is None:
      struct = self._new_structure(key, treedef, avals, shapes, static_key)
    return struct, leaves, shapes

  def _plan_for(self, struct: _Structure, shapes) -> _Plan:
    plan = struct.plans.get(shapes)
    if plan is not None and (plan.provisional is None or not plan.provisional.done()):
      struct.plans.move_to_end(shapes)
      return plan
    plan = self._new_plan(struct, shapes)
    if plan.provisional is None or not plan.provisional.done():
      struct.plans[shapes] = plan
      if len(struct.plans) > _PLANS_PER_STRUCTURE:
        struct.plans.popitem(last=False)
    return plan

  # --- structures and plans ----------------------------------------------------

  def _split(self, args, kwargs):
    if not self.static_argnums and not self.static_argnames:
      return _NO_STATIC, args, kwargs
    nums = {a % len(args) if a < 0 else a for a in self.static_argnums if -len(args) <= a < len(args)}
    static = [(i, args[i]) for i in sorted(nums)]
    static_kw = [(k, kwargs[k]) for k in sorted(kwargs) if k in self.static_argnames]
    dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
    static_key = (tuple(static), tuple(static_kw))
    try:
      hash(static_key)
    except TypeError:
      raise TypeError(
          f"static arguments of {self!r} must be hashable, got {static_key!r}; "
          "pass arrays as ordinary (non-static) arguments.") from None
    return static_key, dyn_args, dyn_kwargs

  def _new_structure(self, key, treedef, avals, shapes, static_key) -> _Structure:
    names = self._leaf_names(treedef, static_key)
    struct = _Structure(key, treedef, avals, names)
    if self.polymorphic_shapes is not None:
      struct.specs = self._explicit_specs(treedef, static_key)
    else:
      struct.tracker = DimTracker(names, shapes)
    self._structures[key] = struct
    return struct

  def _explicit_specs(self, treedef, static_key) -> tuple:
    """Per-leaf specs from `polymorphic_shapes` (keyword arguments: fixed)."""
    specs = self.polymorphic_shapes
    positions = self._dynamic_positions(static_key, treedef)
    n_positional = len(positions) + len(static_key[0])
    if len(specs) != n_positional:
      raise ShapeError(
          f"polymorphic_shapes has {len(specs)} spec(s) but {self!r} was called with "
          f"{n_positional} positional argument(s); give one spec per positional "
          "argument (None for an argument with a fixed shape).")
    args_tree, kwargs_tree = treedef.children()
    leaf_specs = []
    for pos, sub in zip(positions, args_tree.children()):
      dummy = sub.unflatten([0] * sub.num_leaves)
      leaf_specs.extend(sub.flatten_up_to(
          jax.tree.broadcast(specs[pos], dummy, is_leaf=_spec.is_spec_leaf)))
    return tuple(leaf_specs) + (None,) * kwargs_tree.num_leaves

  @staticmethod
  def _dynamic_positions(static_key, treedef) -> list[int]:
    """The original positions of the dynamic positional arguments."""
    static_nums = {i for i, _ in static_key[0]}
    n_dynamic = len(treedef.children()[0].children())
    total = n_dynamic + len(static_nums)
    return [i for i in range(total) if i not in static_nums]

  def _leaf_names(self, treedef, static_key) -> list[str]:
    params = self._signature
    dummy = treedef.unflatten(list(range(treedef.num_leaves)))
    paths = jax.tree_util.tree_flatten_with_path(dummy)[0]
    positions = self._dynamic_positions(static_key, treedef)
    names = []
    for path, _ in paths:
      group, key, rest = path[0].idx, path[1], path[2:]
      if group == 0:
        pos = positions[key.idx]
        base = params[pos] if pos < len(params) else f"arg{pos}"
      else:
        base = str(key.key)
      names.append(base + jax.tree_util.keystr(rest))
    return names

  def _new_plan(self, struct: _Structure, shapes) -> _Plan:
    why = {"shapes": shapes, "changed": _changed_axes(struct, shapes)}
    struct.last_shapes = shapes
    if struct.tracker is not None and not struct.exact_only:
      if struct.tracker.observe(shapes) or (struct.specs is None and struct.tracker.any_dynamic):
        struct.specs = tuple(struct.tracker.specs()) if struct.tracker.any_dynamic else None
        struct.masked = None
        struct.plans.clear()
        struct.templates.clear()
        why["became_dynamic"] = sorted({struct.tracker.symbol(d) for d in struct.tracker.dynamic})
    if struct.specs is None or struct.exact_only:
      kind = "fallback" if struct.exact_only else (
          "first call" if not why["changed"] else "exact")
      return self._exact_plan(struct, shapes, dict(why, kind=kind, error=struct.fallback_reason))
    if _zero_sized(struct.specs, shapes):
      # A masked trace assumes sizes >= 1; jax.jit's own program for the empty
      # shapes gives exactly its shapes, values and exceptions.
      return self._exact_plan(struct, shapes, dict(why, kind="zero size"))
    try:
      return self._masked_plan(struct, shapes, dict(why, kind="bucket"))
    except Exception as e:
      if struct.tracker is None:  # explicit mode: the user asked for masking
        raise
      self._fall_back(struct, e)
      return self._exact_plan(struct, shapes,
                              dict(why, kind="fallback", error=struct.fallback_reason))

  def _fall_back(self, struct: _Structure, error: Exception):
    """Automatic mode cannot mask this structure: run exact shapes, and say so."""
    name = getattr(self.fun, "__name__", "fun")
    text = str(error).strip()
    reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    if self.fallback == "error":
      if isinstance(error, PolyjitError):
        raise error
      raise MaskingError(f"pj.jit({name}) cannot run with dynamic sizes: {reason}") from error
    struct.exact_only = True
    struct.fallback_reason = reason
    struct.plans.clear()
    struct.templates.clear()
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

  def _exact_plan(self, struct: _Structure, shapes, why: dict) -> _Plan:
    dtypes = tuple(a[0] for a in struct.avals)
    key = (struct.key, "exact", shapes)
    program = self._cache.get(key, lambda: self._compile(
        key, self._exact_body(struct), shapes, struct, cause=why))
    return _Plan(key, program, shapes, dtypes, (), None, None, 0.0,
                 fallback=struct.exact_only)

  def _fast_plan(self, struct: _Structure, shapes) -> _Plan | None:
    """The plan for new sizes in a bucket that already has one, or None.

    The common case on the call path (every call with a new length): the
    sizes are read off the shapes, the bucket's program and padded shapes are
    reused, and only the logical sizes and output shapes are computed. The
    full path (`_masked_plan`) runs for anything else, and is the only one
    that records templates: no constraints or guards to check, no background
    compile, and a program still in the cache.
    """
    template = next(iter(struct.templates.values()), None)
    if template is None:
      return None
    logical: dict[str, int] = {}
    for dim, places in template.places.items():
      for leaf, axis in places:
        if logical.setdefault(dim, shapes[leaf][axis]) != shapes[leaf][axis]:
          return None
      if logical[dim] == 0:  # empty: jax.jit's exact program (`_new_plan`)
        return None
    template = struct.templates.get(
        tuple(sorted((v, self._policy(v).bucket(n)) for v, n in logical.items())))
    if template is None or any(shapes[i][a] != n for (i, a), n in template.fixed):
      return None
    plan = template.plan
    fut = self._cache.peek(plan.key)
    if fut is None or not fut.done() or not template.variant.holds(logical):
      return None
    self.stats.record_sizes(template.binding, struct.leaf_names, logical)
    return _Plan(plan.key, plan.program, plan.padded_shapes, plan.dtypes,
                 _logical_values(template.binding, logical),
                 _out_shapes(template.out_dims, logical), plan.bucket,
                 _waste(shapes, plan.padded_shapes))

  def _masked_plan(self, struct: _Structure, shapes, why: dict) -> _Plan:
    fast = self._fast_plan(struct, shapes)
    if fast is not None:
      return fast
    masked, binding, variant = self._variant(struct, shapes)
    logical = binding.padded  # solved from unpadded shapes: the logical sizes
    buckets = {v: self._policy(v).bucket(n) for v, n in logical.items()}
    padded_env = fit_to_constraints(logical, buckets, variant.scope)
    self.stats.record_sizes(binding, struct.leaf_names, logical)
    why = dict(why, bucket=dict(padded_env), sizes=dict(logical))
    if variant.decisions:
      why["variant"] = variant.describe()
    padded_shapes = _padded_shapes(binding, padded_env)
    key = self._program_key(struct, variant, padded_shapes, padded_env)
    build = functools.partial(
        self._compile, key, self._masked_body(struct, masked, variant, padded_env),
        padded_shapes, struct, cause=why, logical=len(binding.dim_names))
    provisional = None
    fut = self._cache.peek(key)
    if self.background_compile and (fut is None or not fut.done()):
      borrowed = self._borrow(key, shapes)
      if borrowed is not None:
        provisional = self._cache.submit(key, build)
        key, program = borrowed
        padded_shapes, padded_env = key[3], dict(key[4])
    if provisional is None:
      program = self._cache.get(key, build)
    out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
    plan = _Plan(key, program, padded_shapes, tuple(a[0] for a in struct.avals),
                 _logical_values(binding, logical), _out_shapes(out_dims, logical),
                 dict(padded_env), _waste(shapes, padded_shapes), provisional)
    simple = _simple_places(binding)
    if (simple is not None and provisional is None and not variant.constraints
        and dict(padded_env) == buckets):
      struct.templates[_bucket_key(buckets)] = _Template(plan, binding, variant, out_dims,
                                                         *simple)
    return plan

  @staticmethod
  def _program_key(struct, variant, padded_shapes, padded_env):
    return (struct.key, struct.specs, variant.key, padded_shapes,
            _bucket_key(padded_env))

  def _borrow(self, key, shapes):
    """A compiled program of the same variant whose padded shapes hold `shapes`."""
    best = None
    for other, program in self._cache.done():
      if other[:3] != key[:3]:
        continue
      padded = other[3]
      if all(all(a >= b for a, b in zip(p, s)) for p, s in zip(padded, shapes)):
        size = sum(int(np.prod(p)) for p in padded)
        if best is None or size < best[0]:
          best = (size, other, program)
    return None if best is None else best[1:]

  def _abstract_args(self, struct: _Structure, shapes) -> list:
    return list(struct.treedef.unflatten(
        [jax.ShapeDtypeStruct(s, a[0], weak_type=a[1]) for s, a in zip(shapes, struct.avals)]))

  def _spec_tree(self, struct: _Structure):
    return list(struct.treedef.unflatten(list(struct.specs)))

  def _variant(self, struct: _Structure, shapes):
    """The masked function, its binding at these (logical) shapes, and the
    variant of `fun` that these sizes select (`_variants.py`): one per side
    of each size comparison `fun` makes, traced on first use."""
    args = self._abstract_args(struct, shapes)
    if struct.masked is None:
      struct.masked = self._new_masked(struct, self.constraints)
    binding = struct.masked.bind(args)
    return struct.masked, binding, struct.masked.variant_for(args, binding.padded, binding)

  def _new_masked(self, struct: _Structure, constraints) -> Masked:
    fun = self._bound_fun(struct.key[0])
    masked = Masked(lambda a, k: fun(*a, **k), self._spec_tree(struct),
                    constraints=constraints)
    masked.__name__ = getattr(self.fun, "__name__", "fun")
    return masked

  def _bound_fun(self, static_key):
    """`fun` with the static arguments filled in, taking the dynamic ones."""
    static_args, static_kwargs = dict(static_key[0]), dict(static_key[1])

    def bound(*dyn_args, **dyn_kwargs):
      it = iter(dyn_args)
      n = len(dyn_args) + len(static_args)
      args = [static_args[i] if i in static_args else next(it) for i in range(n)]
      return self.fun(*args, **static_kwargs, **dyn_kwargs)
    return bound

  def _masked_body(self, struct, masked, variant, padded_env):
    treedef = struct.treedef
    padded_env = dict(padded_env)
    names = sorted(padded_env)  # the order of `_logical_values`

    def body(*leaves_and_logical):
      *leaves, logical = leaves_and_logical
      return masked.call_variant(variant, treedef.unflatten(leaves), padded_env,
                                 dict(zip(names, logical)))
    return body

  def _exact_body(self, struct):
    treedef = struct.treedef
    fun = self._bound_fun(struct.key[0])

    def body(*leaves_and_logical):
      *leaves, _ = leaves_and_logical
      dyn_args, dyn_kwargs = treedef.unflatten(leaves)
      return fun(*dyn_args, **dyn_kwargs)
    return body

  def _compile(self, key, body, padded_shapes, struct, *, cause, logical=0):
    body.__name__ = self._name
    donate = self._donated_leaves(struct)
    avals = [jax.ShapeDtypeStruct(s, a[0], weak_type=a[1])
             for s, a in zip(padded_shapes, struct.avals)]
    logical_avals = tuple(jax.ShapeDtypeStruct((), jc.dim_value_dtype())
                          for _ in range(logical))
    t0 = time.perf_counter()
    with count_compiles(this_thread_only=True) as events:
      program = jax.jit(body, donate_argnums=donate).lower(*avals, logical_avals).compile()
    mine = [e for e in events if e.fun_name == f"jit({self._name})"]
    self.stats.cache_loads += len(events.cache_loads)
    self.stats.compile_events.append({
        "key": key, "cause": cause, "events": len(mine),
        "seconds": sum(e.seconds for e in mine), "wall_seconds": time.perf_counter() - t0,
        "padded_shapes": padded_shapes, "exact": key[1] == "exact"})
    return program

  def _donated_leaves(self, struct) -> tuple[int, ...]:
    if not self.donate_argnums:
      return ()
    static_nums = {i for i, _ in struct.key[0][0]}
    positions = self._dynamic_positions(struct.key[0], struct.treedef)
    out, start = [], 0
    for child, pos in zip(struct.treedef.children()[0].children(), positions):
      if pos in self.donate_argnums and pos not in static_nums:
        out.extend(range(start, start + child.num_leaves))
      start += child.num_leaves
    return tuple(out)

  def _policy(self, dim: str) -> BucketPolicy:
    spec = self.buckets
    if isinstance(spec, dict):
      spec = spec.get(dim, spec.get("*"))
    return as_policy(spec)

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
    if struct.tracker is not None and sizes:
      if struct.tracker.force_dynamic(list(sizes)):
        struct.specs = tuple(struct.tracker.specs())
        struct.masked = None
        struct.plans.clear()
        struct.templates.clear()
    if struct.specs is None or not sizes:
      self._plan_for(struct, shapes)
      return [{}]
    masked, binding, variant = self._variant(struct, shapes)
    unknown = set(sizes) - set(binding.dim_names)
    if unknown:
      raise ShapeError(f"precompile: unknown dimension names {sorted(unknown)}; this "
                       f"function's dimensions are {list(binding.dim_names)}.")
    per_dim = {v: sorted({self._policy(v).bucket(n) for n in sizes.get(v, [binding.padded[v]])})
               for v in binding.dim_names}
    envs = [dict(zip(per_dim, combo)) for combo in _product(list(per_dim.values()))]
    futures = []
    for env in envs:
      padded_shapes = _padded_shapes(binding, env)
      key = self._program_key(struct, variant, padded_shapes, env)
      futures.append(self._cache.submit(key, functools.partial(
          self._compile, key, self._masked_body(struct, masked, variant, env),
          padded_shapes, struct, cause={"kind": "precompile", "bucket": env},
          logical=len(binding.dim_names))))
    _wait(futures, progress, f"precompiling {getattr(self.fun, '__name__', 'fun')}")
    return envs


# --- helpers -------------------------------------------------------------------

def _as_tuple(x):
  return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def _normalize_argnums(nums) -> tuple[int, ...]:
  if nums is None:
    return ()
  return tuple(int(n) for n in _as_tuple(nums))


def _signature(fun) -> list[str]:
  try:
    params = inspect.signature(fun).parameters.values()
  except (TypeError, ValueError):
    return []
  return [p.name for p in params
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


_NO_STATIC = ((), ())
_canonical_dtypes: dict = {}


def _canonical(dtype) -> np.dtype:
  """JAX's dtype for a NumPy dtype (float64 -> float32 without x64), cached."""
  out = _canonical_dtypes.get(dtype)
  if out is None:
    out = _canonical_dtypes[dtype] = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
  return out


def _aval_key(x):
  """(dtype, weak_type) of an argument as jax.jit sees it; None for a tracer.

  The hot path of every call: the common types are handled without building
  an abstract value.
  """
  if isinstance(x, np.ndarray) or isinstance(x, np.generic):
    return (_canonical(x.dtype), False)
  if isinstance(x, jc.Tracer):
    return None
  if isinstance(x, jax.Array):
    return (x.dtype, x.weak_type)
  if isinstance(x, Padded):
    return (np.dtype(x.dtype), False)
  aval = jax.typeof(x)
  return (np.dtype(aval.dtype), bool(aval.weak_type))


def _strip_padded(tree):
  return jax.tree.map(
      lambda x: x.data[tuple(slice(0, s) for s in x.shape)] if is_padded(x) else x,
      tree, is_leaf=is_padded)


def _map_outputs(plan: _Plan, outs, convert):
  """Applies `convert(output, logical shape)` to outputs that have dynamic dims."""
  if plan.out_shapes is None:
    return outs
  leaves, tree = jax.tree.flatten(outs)
  return tree.unflatten([convert(o, s) for o, s in zip(leaves, plan.out_shapes)])


def _zero_sized(specs, shapes) -> bool:
  """Whether an argument with dynamic axes has an empty axis in this call."""
  return any(spec is not None and 0 in shape for spec, shape in zip(specs, shapes))


def _padded_shapes(binding, env) -> tuple:
  return tuple(tuple(jc.evaluate_dim(d, env) for d in leaf.symbolic_shape)
               for leaf in binding.leaves)


def _logical_values(binding, logical) -> tuple:
  """The program's size arguments: one int scalar per dim, in binding order."""
  dtype = jc.dim_value_dtype()
  return tuple(np.asarray(logical[v], dtype) for v in binding.dim_names)


def _out_shapes(out_dims, logical) -> tuple:
  """Each output's logical shape: its symbolic shape at these sizes."""
  return tuple(tuple(jc.evaluate_dim(d, logical) for d in dims) for dims in out_dims)


def _waste(shapes, padded_shapes) -> float:
  logical = sum(int(np.prod(s)) for s in shapes)
  padded = sum(int(np.prod(p)) for p in padded_shapes)
  return 1.0 - logical / padded if padded else 0.0


def _bucket_key(bucket: dict) -> tuple:
  return tuple(sorted(bucket.items()))


def _product(lists):
  if not lists:
    return [()]
  return [(x, *rest) for x in lists[0] for rest in _product(lists[1:])]


def _wait(futures, progress: bool, desc: str):
  import concurrent.futures
  bar = None
  if progress:
    try:
      from tqdm.auto import tqdm
      bar = tqdm(total=len(futures), desc=desc, unit="program")
    except ImportError:
      bar = None
  try:
    for fut in concurrent.futures.as_completed(futures):
      fut.result()
      if bar is not None:
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()


def jit(fun: Callable | None = None, *, polymorphic_shapes=None, buckets=None,
        constraints: Sequence[str] = (), static_argnums=None, static_argnames=None,
        donate_argnums=None, cache_size: int = 64, background_compile: bool = False,
        fallback: str = "warn"):
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
  """
  kw = dict(polymorphic_shapes=polymorphic_shapes, buckets=buckets,
            constraints=constraints, static_argnums=static_argnums,
            static_argnames=static_argnames, donate_argnums=donate_argnums,
            cache_size=cache_size, background_compile=background_compile,
            fallback=fallback)
  if fun is None:
    return functools.partial(jit, **kw)
  return JitFunction(fun, **kw)
