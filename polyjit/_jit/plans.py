"""`pj.jit`'s bookkeeping from a call's shapes to the program that runs it.

A *structure* is everything a call fixes besides its sizes: static values,
pytree, dtypes and ranks. Within it, a *plan* serves one tuple of argument
shapes: the program, the padded shape of every argument, the logical sizes
passed to the program at run time and each output's logical shape, so a
repeated shape costs a dict lookup. A *template* is a bucket's plan kept for
the sizes that bucket has not seen yet: when every dynamic axis is a bare
dimension, the sizes are read off the shapes and only the logical sizes and
output shapes are new (no binding, tracing or constraint solving):
`templates.py`.

Programs are keyed by `ProgramKey` in the executable cache (`_caching/executables.py`): a
masked program by structure, specs, variant and padded shapes; `jax.jit`'s own
program at exact shapes (the first call in automatic mode, a fallback, an
empty dynamic axis) by structure and shapes. A program's body takes the padded
leaves and a tuple of int32 logical sizes, one per dimension in binding order.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import math
from typing import Any, Callable, Hashable, NamedTuple

import jax
import numpy as np

from .._masking import dims as _dims
from .. import _jax as jc
from .auto import DimTracker
from .inline import size_sharding
from .templates import Template
from .._masking.mask import Masked
from .._masking.padding import pad_into
from . import resident as _resident
from .._buckets.cost_aware import REPEATS, Account, Borrow, Rental
from .._sharding import placement as _placement

#: Per leaf, a shape (padded or logical).
Shapes = tuple[tuple[int, ...], ...]

PLANS_PER_STRUCTURE = 16384
#: Hot calls of a resized plan with its sizes on the host (`Plan.host_call`).
HOST_CALLS = 3
#: Plans built from scratch in this process (a bucket's first plan; a new size
#: in a bucket with a template reuses its plan: `Plan.resized`). Tests read it.
plans_built = 0
EXACT = "exact"   # `ProgramKey.specs` of jax.jit's own program at exact shapes


class StructureKey(NamedTuple):
  """What a call fixes besides its sizes: a structure's key (`Structure.key`)."""
  static: Any             # the static arguments' values (`ArgLayout.flatten`)
  treedef: Any            # the pytree of the dynamic arguments (args, kwargs)
  avals: tuple[Any, ...]  # per leaf: (dtype, weak_type)
  ranks: tuple[int, ...]  # per leaf: its rank
  shardings: tuple[Any, ...] | None = None  # per leaf on a mesh; None: one device
  # What jax.jit keys on besides the arguments (`jc.trace_context()`: x64, dtype
  # promotion, matmul precision, ...): a trace under one is wrong under another.
  context: tuple[Any, ...] | None = None


class ProgramKey(NamedTuple):
  """A program's key in the executable cache."""
  structure: StructureKey  # `Structure.key`
  specs: Any              # the structure's per-leaf specs, or EXACT
  variant: Hashable       # the variant's key (None at exact shapes)
  padded_shapes: Shapes   # per leaf, the shape the program takes
  bucket: tuple[Any, ...] # `bucket_key` of the padded sizes (() at exact shapes)

  @classmethod
  def exact_shapes(cls, struct: Structure, shapes: Any) -> ProgramKey:
    return cls(struct.key, EXACT, None, shapes, ())

  @classmethod
  def masked(cls, struct: Structure, variant: Any, padded_shapes: Any,
             env: dict[str, int]) -> ProgramKey:
    return cls(struct.key, struct.specs, variant.key, padded_shapes, bucket_key(env))

  @property
  def exact(self) -> bool:
    return bool(self.specs == EXACT)


class Plan:
  """How a call with given shapes runs: pad, run the program, and unpad.

  Everything a repeated call needs is computed here once: which leaves need
  padding (and the region their data goes to), the logical sizes already on
  the device, the bucket, and whether any output has a dynamic dim (if none,
  the outputs are returned as the program made them: nothing blocks).
  """
  __slots__ = ("key", "program", "dtypes", "logical", "out_shapes", "waste",
               "provisional", "fallback", "bucket", "pads", "dynamic_outputs", "live",
               "borrow", "padded_out", "shardings", "unpad_leaf", "loose", "calls",
               "host_calls", "resident", "pad_leaf", "hot_shape", "exact_call", "sizes_on")

  def __init__(self, key: ProgramKey, program: Any, dtypes: Any, logical: Any,
               out_shapes: Any, waste: float, provisional: Any = None,
               fallback: bool = False, shapes: Any = None, padded_out: Any = None) -> None:
    global plans_built
    plans_built += 1
    self.key = key
    self.program = program
    self.dtypes = dtypes
    self.shardings = key.structure.shardings  # per leaf on a mesh; None: one device
    # The one device other than the default that the arguments are committed
    # to (`_sharding.placement`: the program runs there, as jax.jit's), or None
    committed = _placement.one_device(self.shardings)
    # The program's size arguments, put on the device once: a committed
    # array costs JAX's dispatch less than a NumPy scalar does, every call.
    # (an inline program's own client: `inline.py`; the device the arguments
    # are committed to, not the default one, which the program would copy
    # them from every call; asked only where there are sizes: a program on a
    # mesh has none here, and the default device may not be this process's,
    # so a resized plan on a mesh keeps its sizes on the host)
    self.sizes_on = committed   # (None: `size_sharding(program)`)
    self.logical: tuple[Any, ...] = tuple(
        jc.host_to_device(v, size_sharding(program) if committed is None else committed)
        for v in logical)
    self.out_shapes = out_shapes        # per output leaf logical shape, or None
    self.waste = waste                  # fraction of input elements that are padding
    # future of the tighter bucket, if borrowing (a cost-aware policy: its `Borrow`)
    self.provisional: concurrent.futures.Future[Any] | Borrow | None = provisional
    self.fallback = fallback            # exact shapes because masking failed
    self.bucket = None if key.exact else key.bucket
    shapes = key.padded_shapes if shapes is None else shapes
    self.pads = tuple((i, p, d, tuple(slice(0, n) for n in s))
                      for i, (s, p, d) in enumerate(zip(shapes, key.padded_shapes, dtypes, strict=True))
                      if tuple(s) != tuple(p))
    self.padded_out = program_out_shapes(program) if padded_out is None else padded_out
    self.dynamic_outputs = out_shapes is not None and any(
        tuple(o) != tuple(p) for o, p in zip(out_shapes, self.padded_out, strict=True))
    self.live = True                    # False once its structure dropped it
    self.borrow: Borrow | None = None   # a cost-aware policy's `Borrow`: pays per call
    # (its tight bucket's account, its sizes) when borrowing more than LOOSE x
    # its size: bought after REPEATS calls (`pay`); `calls` counts them
    self.loose: tuple[Account, dict[str, int]] | None = None
    self.calls = 0
    self.host_calls = 0                 # (a resized plan's: `host_call`)
    # One device on the accelerator path (the default one, or one the
    # arguments are committed to): `jax.Array`s are padded and unpadded on
    # their device (`resident.py`); else on the host, or shard by shard.
    self.resident = ((self.shardings is None or committed is not None)
                     and _resident.accelerator_path())
    self.unpad_leaf = (_resident.unpad if self.resident
                       else _placement.unpad_for(self.shardings))  # keeps shardings on a mesh
    self.pad_leaf: Callable[..., Any] = (
        pad_into if not self.resident else _resident.pad if committed is None
        else functools.partial(_resident.pad, where=committed))
    # A hot shape's account toward its own program, and that program once
    # bought (`jax.jit` itself: `hot_shapes.py`); set where the hot path keeps it.
    self.hot_shape: Any = None
    self.exact_call: Callable[..., Any] | None = None

  @property
  def padded_shapes(self) -> Shapes:
    return self.key.padded_shapes

  def resized(self, logical: tuple[np.ndarray[Any, Any], ...], out_shapes: Any,
              pads: tuple[Any, ...], waste: float, dynamic_outputs: bool) -> Plan:
    """This bucket's plan for other logical shapes in the same bucket: the
    program, padded shapes and output layout are shared; only the padding
    regions, the size scalars, the output shapes and the waste are new
    (`Template.plan_at` works them out). Nothing is compiled, traced or put
    on the device here: a never-seen size costs little. Its sizes go as
    host int32 scalars (about 1.2 us a call more than on the device) until
    the hot path has called it `HOST_CALLS` times (`host_call`)."""
    new = object.__new__(Plan)
    new.key, new.program, new.dtypes = self.key, self.program, self.dtypes
    new.fallback, new.bucket, new.padded_out = self.fallback, self.bucket, self.padded_out
    new.shardings, new.unpad_leaf = self.shardings, self.unpad_leaf
    new.resident, new.pad_leaf, new.sizes_on = self.resident, self.pad_leaf, self.sizes_on
    new.logical = logical
    new.out_shapes = out_shapes
    new.pads = pads
    new.waste = waste
    new.dynamic_outputs = dynamic_outputs
    new.live = True
    new.borrow = new.provisional = new.loose = None
    new.hot_shape = new.exact_call = None
    new.calls = 0
    on_mesh = self.shardings is not None and self.sizes_on is None
    new.host_calls = 0 if on_mesh else HOST_CALLS
    if new.host_calls and jc.transfers_guarded():  # (host scalars would be implicit transfers: on the device now)
      new.host_calls = 1
      new.host_call()
    return new

  def host_call(self) -> None:
    """A hot call of a resized plan whose sizes are host scalars: after
    `HOST_CALLS` of them, its sizes go on the device, once (the ski-rental
    rule again: the host scalars have then cost about what putting them on
    the device does, 4 us against 1.2 us a call). Concurrent calls may both
    put them there: the same values either way."""
    self.host_calls -= 1
    if self.host_calls <= 0:
      where = size_sharding(self.program) if self.sizes_on is None else self.sizes_on
      self.logical = tuple(jc.host_to_device(v, where) for v in self.logical)
      self.host_calls = 0

  def borrow_from(self, borrow: Borrow) -> None:
    """Runs in a larger bucket than its own: each call pays into `borrow`'s
    accounts, and the plan is superseded once a smaller bucket that may hold
    it has compiled (one of those accounts' buckets, say: `Borrow`)."""
    self.borrow = self.provisional = borrow

  def pay(self) -> None:
    """A call of a borrowing plan: pays the waste into its accounts, and once
    it has run `REPEATS` times more than `LOOSE` x its size, buys its own bucket."""
    assert self.borrow is not None  # (called only for a borrowing plan)
    self.borrow.pay()
    loose = self.loose
    if loose is not None:
      self.calls += 1
      if self.calls >= REPEATS:
        account, sizes = loose
        account.insist(sizes, dict(self.key.bucket))
        if account.future is not None:  # bought (else another compile runs: next call)
          self.loose = None

  @property
  def superseded(self) -> bool:
    """Borrowing a larger bucket's program, and the tight one is now compiled."""
    return self.provisional is not None and self.provisional.done()

  @property
  def current(self) -> bool:
    """Still the plan for its shapes (the hot path checks this every call)."""
    return self.live and (self.provisional is None or not self.provisional.done())

  def run(self, leaves: Any) -> Any:
    """The padded outputs: pads the leaves (on the host, or shard by shard on
    a mesh) and runs the program. Leaves may be `pj.Padded`, device or host
    arrays, or scalars."""
    if self.host_calls:  # a resized plan's sizes go on the device after a few calls:
      self.host_call()   # here too (with several devices every call comes here)
    if jc.transfers_guarded():  # (the user's host values, as jax.jit's guard sees them)
      jc.guard_user_uploads(leaves)
    if self.resident:
      ins = [x if type(x) is jc.ARRAY_TYPE and x.shape == p and x.dtype == d
             else self.pad_leaf(x, p, d)
             for x, p, d in zip(leaves, self.padded_shapes, self.dtypes, strict=True)]
      return jc.explicitly(self.program, *ins, self.logical)
    return jc.explicitly(_placement.run, self.program, leaves, self.padded_shapes, self.dtypes,
                         self.logical, self.shardings)

  def call(self, args: Any, stats: Any) -> Any:
    """A hot call in the bucket (`pj.jit`'s hot path; a plan whose shapes
    bought their own program is called there, `hot_shapes.py`): `run_hot`,
    its overhead timed while the shapes pay toward their own program."""
    account = self.hot_shape
    if account is not None:
      return account.timed(self, args, stats)
    return self.run_hot(args, stats, self.program)

  def run_hot(self, args: Any, stats: Any, program: Callable[..., Any]) -> Any:
    """A hot call in the bucket: counts it in `stats`, pays a borrowed
    bucket, pads the leaves that need it, runs `program` (this plan's, or it
    timed) and slices dynamic outputs. One method, read once per call: the
    attribute reads and calls of `record_call`, `pay`, `run_plain` and
    `unpad_outputs` in one frame."""
    stats.calls += 1
    bucket = self.bucket
    if bucket is not None:
      stats.bucket_hits[bucket] += 1
      stats.waste_sum += self.waste
      stats.waste_calls += 1
      if self.borrow is not None:  # in a larger bucket than its own: pay for it
        self.pay()
    if self.fallback:
      stats.fallback_calls += 1
    if self.host_calls:  # a resized plan: its sizes go on the device after a few calls
      self.host_call()
    if jc.transfers_guarded():  # (the user's host values, as jax.jit's guard sees them)
      jc.guard_user_uploads(args)
    pads = self.pads
    if pads:
      leaves = list(args)
      pad = self.pad_leaf
      for i, padded, dtype, region in pads:
        leaves[i] = pad(leaves[i], padded, dtype, region)
      # (the host buffers are polyjit's: their upload is an explicit transfer;
      # a resident plan's leaves are on the device already)
      outs = (program(*leaves, self.logical) if self.resident
              else jc.explicitly(program, *leaves, self.logical))
    else:
      outs = program(*args, self.logical)
    # (a method: a data-dependent plan's outputs carry sizes and checks to read)
    return self.unpad_outputs(outs)

  def run_plain(self, leaves: Any) -> Any:
    """`run` for leaves that are arrays or scalars (never `pj.Padded`): only
    the leaves this plan pads are touched."""
    if jc.transfers_guarded():  # (the user's host values, as jax.jit's guard sees them)
      jc.guard_user_uploads(leaves)
    if self.pads:
      leaves = list(leaves)
      pad = self.pad_leaf
      for i, padded, dtype, region in self.pads:
        leaves[i] = pad(leaves[i], padded, dtype, region)
      # (the host buffers are polyjit's: their upload is an explicit transfer)
      return jc.explicitly(self.program, *leaves, self.logical)
    return self.program(*leaves, self.logical)

  def unpad_outputs(self, outs: Any) -> Any:
    """The outputs at their logical shapes (host slices only where needed)."""
    if not self.dynamic_outputs:
      return outs
    return self.map_outputs(outs, self.unpad_leaf)

  def map_outputs(self, outs: Any, convert: Callable[[Any, Any], Any]) -> Any:
    """Applies `convert(output, logical shape)` to outputs that have dynamic dims."""
    if self.out_shapes is None:
      return outs
    leaves, tree = jax.tree.flatten(outs)
    # jaxlib's PyTreeDef is not visible to mypy (a stub gap): its methods are unknown.
    return tree.unflatten(  # type: ignore[attr-defined]
        [convert(o, s) for o, s in zip(leaves, self.out_shapes, strict=True)])


def plan_in(struct: Structure, key: ProgramKey, program: Any, binding: Any, variant: Any,
            logical: dict[str, int], shapes: Any, provisional: Any = None) -> Plan:
  """The plan that runs `program` (of `variant`, at `key`) for `shapes`, whose
  dimensions have the sizes `logical`."""
  out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
  return Plan(key, program, struct.dtypes, logical_values(binding, logical),
              out_shapes(out_dims, logical), waste(shapes, key.padded_shapes), provisional,
              shapes=shapes)


def program_out_shapes(program: Any) -> list[tuple[int, ...]]:
  """The padded shape of each output leaf of a compiled program."""
  return [tuple(o.shape) for o in jax.tree.leaves(program.out_info)]


class Structure:
  """Everything known about one call structure (static values, tree, dtypes).

  Its state changes only through its methods: what the calls teach (`observe`,
  `reset`, `fall_back`), the plans and templates it keeps, and the masked
  function, rental and shard multiples it learns once."""

  def __init__(self, key: StructureKey, leaf_names: Any, *, specs: tuple[Any, ...] | None = None,
               tracker: DimTracker | None = None) -> None:
    self.key = key
    self.treedef = key.treedef
    self.avals = key.avals              # per leaf: (dtype, weak_type)
    self.dtypes: tuple[Any, ...] = tuple(a[0] for a in key.avals)
    self.shardings = key.shardings      # per leaf on a mesh; None: one device
    self.on_mesh = key.shardings is not None  # (an attribute: read on every new size)
    self.leaf_names = leaf_names
    self.tracker = tracker              # automatic mode: learns the dynamic axes
    self.axes_key: str | None = None    # its remembered axes' key (`_caching/axes.py`)
    self.recalled = False               # specs from remembered axes, no call planned yet
    self.specs = specs                  # per-leaf specs in use (None: exact)
    self.uncanonical: int | None = None  # a jax.Array's dtype x64 mode would not make
    self.masked: Masked | None = None   # `fun` masked with the specs in use
    self.last_shapes: Any = None        # shapes of the latest new plan
    self.exact_only = False
    self.data_dependent = False         # jax.jit cannot trace it (x[x > 0])
    self.fallback_reason: str | None = None   # why exact_only, for messages
    self.plans: collections.OrderedDict[Any, Plan] = collections.OrderedDict()
    self.templates: dict[Any, Template] = {}  # bucket key -> Template
    self.rental: Rental | None = None   # under a cost-aware policy
    # no rental for these specs (a fixed policy, or a mesh): known once asked
    # (`BucketChoice.rental`), so that a never-seen size need not ask again
    self.fixed_buckets = False
    self.shard_multiples: dict[str, int] = {}  # dim -> its buckets' multiple (on a mesh)

  @property
  def static_key(self) -> Any:
    return self.key.static

  def masked_fun(self, make: Callable[[], Masked]) -> Masked:
    """`fun` masked with the specs in use, made by `make` the first time."""
    if self.masked is None:
      self.masked = make()
    return self.masked

  def start_rental(self, rental: Rental) -> Rental:
    """The cost-aware policy's state for this structure (until new specs)."""
    self.rental = rental
    return rental

  def learn_shard_multiples(self, multiples: dict[str, int]) -> None:
    """Dimension -> the multiple its buckets round up to (`_sharding.dim_multiples`)."""
    self.shard_multiples = multiples

  def mark_data_dependent(self) -> None:
    """`jax.jit` cannot trace `fun` (x[x > 0]): exact shapes run it masked."""
    self.data_dependent = True

  def abstract_args(self, shapes: Any) -> list[Any]:
    """The (args, kwargs) pair of abstract arguments at `shapes`."""
    return list(self.treedef.unflatten(abstract_leaves(shapes, self.avals)))

  def spec_tree(self) -> list[Any]:
    # Only called once specs are set (never None here).
    return list(self.treedef.unflatten(list(self.specs)))  # type: ignore[arg-type]

  # --- plans ---------------------------------------------------------------------

  def plan(self, shapes: Any) -> Plan | None:
    """The plan for `shapes`, unless there is none or it is superseded."""
    plan = self.plans.get(shapes)
    if plan is None or plan.superseded:
      return None
    self.plans.move_to_end(shapes)
    return plan

  def remember(self, shapes: Any, plan: Plan) -> None:
    """Keeps `plan` for `shapes`, the latest new plan's shapes."""
    self.last_shapes = shapes
    if not plan.superseded:
      self.plans[shapes] = plan
      if len(self.plans) > PLANS_PER_STRUCTURE:
        self.plans.popitem(last=False)[1].live = False

  def forget(self, key: ProgramKey) -> None:
    """Drops the plans and templates that run the program `key`."""
    for shapes in [s for s, p in self.plans.items() if p.key == key]:
      self.plans.pop(shapes).live = False
    for bucket in [b for b, t in self.templates.items() if t.plan.key == key]:
      del self.templates[bucket]

  def template_sizes(self, shapes: Any) -> dict[str, int] | None:
    """Each dimension's size read off `shapes` by a template; None without one."""
    first = next(iter(self.templates.values()), None)
    return None if first is None else first.sizes(shapes)

  def template(self, shapes: Any, bucket: tuple[Any, ...] | None) -> Template | None:
    """The template of `bucket` when its fixed axes agree with `shapes`."""
    template = self.templates.get(bucket)
    return template if template is not None and template.fits(shapes) else None

  def keep_template(self, plan: Plan, binding: Any, variant: Any) -> None:
    """Keeps `plan` as its bucket's template, when it can be one (`Template.of`)."""
    out_dims = tuple(aval.shape for aval in variant.traced.out_avals)
    template = Template.of(plan, binding, variant, out_dims)
    if template is not None:
      self.templates[plan.key.bucket] = template

  # --- what the calls teach ----------------------------------------------------------

  def observe(self, shapes: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Notes a new plan at `shapes`: (the axes that changed since the last new
    plan, the dimensions that became dynamic). In automatic mode the tracker
    learns from the shapes, and new specs reset the structure."""
    changed = self._changed_axes(shapes)
    self.last_shapes = shapes
    tracker = self.tracker
    if tracker is None or self.exact_only:
      return changed, ()
    if tracker.observe(shapes) or (self.specs is None and tracker.any_dynamic):
      self.reset(tuple(tracker.specs()) if tracker.any_dynamic else None)
      return changed, tuple(sorted({tracker.symbol(d) for d in tracker.dynamic}))
    return changed, ()

  def _changed_axes(self, shapes: Any) -> tuple[tuple[str, int, int, int], ...]:
    """(argument, axis, old size, new size) against the last new plan."""
    previous = self.last_shapes
    if previous is None:
      return ()
    return tuple((name, axis, old, new)
                 for name, p, s in zip(self.leaf_names, previous, shapes, strict=True)
                 for axis, (old, new) in enumerate(zip(p, s, strict=True)) if old != new)

  def reset(self, specs: tuple[Any, ...] | None) -> None:
    """New specs: what was traced, planned or templated for the old ones goes."""
    self.specs = specs
    self.masked = None
    self.rental = None
    self.fixed_buckets = False
    for plan in self.plans.values():
      plan.live = False
    self.plans.clear()
    self.templates.clear()

  def fall_back(self, reason: str) -> None:
    """From now on every shape compiles exactly, because of `reason`."""
    self.exact_only = True
    self.fallback_reason = reason
    self.reset(self.specs)


# --- programs ------------------------------------------------------------------

def masked_body(treedef: Any, masked: Masked, variant: Any,
                padded_env: dict[str, int]) -> Callable[..., Any]:
  """The program of `variant` at the padded sizes `padded_env`."""
  padded_env = dict(padded_env)
  names = sorted(padded_env)  # the order of `logical_values`

  def body(*leaves_and_logical: Any) -> Any:
    *leaves, logical = leaves_and_logical
    return masked.call_variant(variant, treedef.unflatten(leaves), padded_env,
                               dict(zip(names, logical, strict=True)))
  return body


def exact_body(treedef: Any, fun: Callable[..., Any]) -> Callable[..., Any]:
  """The program of `fun` itself (taking the dynamic arguments), as jax.jit runs it."""

  def body(*leaves_and_logical: Any) -> Any:
    *leaves, _ = leaves_and_logical
    dyn_args, dyn_kwargs = treedef.unflatten(leaves)
    return fun(*dyn_args, **dyn_kwargs)
  return body


def borrow(done: Any, key: ProgramKey, shapes: Any) -> Any:
  """(key, program) among `done` (compiled programs) of the same structure,
  specs and variant as `key` whose padded shapes hold `shapes`: the smallest."""
  best: Any = None
  for other, program in done:
    if other[:3] != key[:3]:  # structure, specs, variant
      continue
    padded = other.padded_shapes
    if all(all(a >= b for a, b in zip(p, s, strict=True)) for p, s in zip(padded, shapes, strict=True)):
      size = sum(int(np.prod(p)) for p in padded)
      if best is None or size < best[0]:
        best = (size, other, program)
  return None if best is None else best[1:]


# --- sizes ---------------------------------------------------------------------

def abstract_leaves(shapes: Any, avals: Any) -> list[jax.ShapeDtypeStruct]:
  """Abstract arguments: `avals` ((dtype, weak_type) per leaf) at `shapes`."""
  # jax.ShapeDtypeStruct's __init__ is unannotated in JAX (a stub gap).
  return [jax.ShapeDtypeStruct(s, a[0], weak_type=a[1])  # type: ignore[no-untyped-call, unused-ignore]
          for s, a in zip(shapes, avals, strict=True)]


def bucket_key(bucket: dict[str, int]) -> tuple[tuple[str, int], ...]:
  """A bucket ({dimension: padded size}) as a hashable, ordered key."""
  return tuple(sorted(bucket.items()))


def zero_sized(specs: Any, shapes: Any) -> bool:
  """Whether an argument with dynamic axes has an empty axis in this call."""
  return any(spec is not None and 0 in shape for spec, shape in zip(specs, shapes, strict=True))


def padded_shapes(binding: Any, env: dict[str, int]) -> Shapes:
  return tuple(tuple(_dims.evaluate_dim(d, env) for d in leaf.symbolic_shape)
               for leaf in binding.leaves)


def logical_values(binding: Any, logical: dict[str, int]) -> tuple[np.ndarray[Any, Any], ...]:
  """The program's size arguments: one int scalar per dim, in binding order."""
  dtype = jc.dim_value_dtype()
  return tuple(np.asarray(logical[v], dtype) for v in binding.dim_names)


def out_shapes(out_dims: Any, logical: dict[str, int]) -> tuple[tuple[int, ...], ...]:
  """Each output's logical shape: its symbolic shape at these sizes."""
  return tuple(tuple(_dims.evaluate_dim(d, logical) for d in dims) for dims in out_dims)


def waste(shapes: Any, padded_shapes: Any) -> float:
  logical = sum(math.prod(s) for s in shapes)
  padded = sum(math.prod(p) for p in padded_shapes)
  return 1.0 - logical / padded if padded else 0.0
