"""Which bucket a `pj.jit` call runs in: its policy's, or a compiled one that holds it.

Each dimension has a bucket policy (`buckets=`; `pj.buckets.CostAware()` by
default), made once per dimension name. Under a fixed policy a call's bucket
is the policy's bucket of each size (its *tight* bucket), rounded up to a
multiple of the shard count on a sharded axis.

When every dimension's policy is cost-aware, the structure keeps a `Rental`
(`_buckets/cost_aware.py`, the ski-rental state and its accounts), and this
module is its bookkeeping on the call path: a call whose tight bucket is not
compiled runs in the smallest compiled bucket that holds it (`borrowed_plan`)
and pays the run time it wastes there into the accounts of the smaller buckets
(`rent`); an account that has paid for a compile compiles its bucket
(`_compile_for_waste`). With no compiled bucket that holds it, a call compiles
the rental's roomy bucket (headroom over the largest size seen). On a mesh the
processes must choose alike and the cost-aware choice depends on timings, so
there the policy's fixed grid decides (powers of two by default).

The rental lives in `_buckets/` (no `pj.jit` types); this bookkeeping needs
structures, templates and programs, so it lives here, beside them.
"""

from __future__ import annotations

import bisect
import functools
from concurrent.futures import Future
from typing import Any, Callable

import jax

from .._buckets.cost_aware import LOOSE, CostAware, Rental
from .._buckets.fixed import (BucketPolicy, Exact, Explicit, Multiples, PerDimBucketSpec,
                             PowersOfTwo, as_policy)
from .._caching import disk as _disk_cache
from .._masking.errors import PolyjitError
from .._masking.spec import Binding
from .._masking.variants import Variant
from .._sharding import placement as _sharding
from . import data_dependent
from .auto import fit_to_constraints
from .compile import Compiler
from .plans import (Plan, ProgramKey, Shapes, Structure, bucket_key, logical_values, padded_shapes,
                    plan_in, waste)
from .stats import Cause

#: Policies whose bucket is monotone in the size, so that where b(n) is its own
#: bucket (b(b(n)) == b(n), checked) up to their `maximum`, every size in
#: [n, b(n)] has the bucket b(n) (`IntervalMemo`; above the maximum an overflow
#: is exact or refused: not kept).
MONOTONE = (PowersOfTwo, Multiples, Explicit, Exact)
DEFAULT_BUCKETS = CostAware()  # pj.jit's policy when `buckets` is not given
MESH_BUCKETS = PowersOfTwo()   # in place of a cost-aware policy on a mesh


class BucketChoice:
  """The bucket policies of one `pj.jit` function, and its cost-aware bookkeeping."""

  def __init__(self, spec: PerDimBucketSpec, compiler: Compiler) -> None:
    self.spec = spec
    self._compiler = compiler
    self._policies: dict[str, BucketPolicy] = {}  # dim -> its policy (`policy`)
    # dim -> its policy's `bucket`, the grid's for a cost-aware one (`tight_key`)
    self._grids: dict[str, Callable[[int], int]] = {}
    # dimensions (in a call's order) -> True where some policy is fixed: no rental
    self._fixed: dict[tuple[str, ...], bool] = {}

  def policy(self, dim: str) -> BucketPolicy:
    """The bucket policy that pads the dimension `dim` (made once per dimension)."""
    policy = self._policies.get(dim)
    if policy is None:
      spec = self.spec
      if isinstance(spec, dict):
        spec = spec.get(dim, spec.get("*"))
      policy = self._policies[dim] = DEFAULT_BUCKETS if spec is None else as_policy(spec)
    return policy

  def tight(self, struct: Structure, logical: dict[str, int]) -> dict[str, int]:
    """Each dimension's padded size under its policy: the bucket of its size,
    rounded up to a multiple of the number of shards along it where it is a
    sharded axis."""
    return {v: self._bucket(struct, v, n) for v, n in logical.items()}

  def tight_key(self, struct: Structure, logical: dict[str, int]) -> tuple[Any, ...]:
    """`bucket_key` of `tight`: every never-seen size asks (`Planner.fast_plan`),
    so off a mesh each dimension goes straight to its grid's `bucket`."""
    if struct.on_mesh:
      return bucket_key(self.tight(struct, logical))
    grids = self._grids
    if len(logical) == 1:  # (the common case, without a list to sort)
      (v, n), = logical.items()
      return ((v, (grids.get(v) or self._grid(v))(n)),)
    return tuple(sorted([(v, (grids.get(v) or self._grid(v))(n)) for v, n in logical.items()]))

  def _grid(self, dim: str) -> Callable[[int], int]:
    policy = self.policy(dim)
    fixed = policy.grid if isinstance(policy, CostAware) else policy
    grid = self._grids[dim] = (IntervalMemo(fixed.bucket, fixed.maximum)
                               if type(fixed) in MONOTONE else fixed.bucket)
    return grid

  def _bucket(self, struct: Structure, dim: str, size: int) -> int:
    policy = self._policies.get(dim) or self.policy(dim)  # (every new size comes here)
    if struct.on_mesh and isinstance(policy, CostAware):
      # on a mesh the choice is fixed (see `rental`): powers of two by default
      policy = MESH_BUCKETS if policy is DEFAULT_BUCKETS else policy.grid
    bucket = policy.bucket(size)
    multiple = struct.shard_multiples.get(dim, 1)
    return bucket if multiple == 1 else _sharding.round_up(bucket, multiple)

  def rental(self, struct: Structure, logical: dict[str, int],
             variant: Variant | None = None) -> Rental | None:
    """The structure's ski-rental state when every dimension's policy is cost-aware.
    On a mesh the policies are the fixed ones: the processes must pick the
    same buckets, and the cost-aware choice depends on timings. With
    `variant`, its traced jaxpr gives the estimates (the first one does)."""
    if struct.on_mesh:
      struct.fixed_buckets = True
      return None
    rental = struct.rental
    if rental is None:
      dims = tuple(logical)
      if self._fixed.get(dims):  # (known: every never-seen size of a fixed policy asks)
        struct.fixed_buckets = True
        return None
      policies = {v: self.policy(v) for v in logical}
      cost_aware = {v: p for v, p in policies.items() if isinstance(p, CostAware)}
      if not policies or len(cost_aware) != len(policies):
        self._fixed[dims] = True
        struct.fixed_buckets = True
        return None
      rental = struct.start_rental(Rental(cost_aware))
      if struct.tracker is not None and struct.masked is not None:
        # Automatic mode compiled the first call exactly: its sizes count
        # for the headroom too.
        try:
          rental.observe(struct.masked.bind(struct.abstract_args(struct.tracker.first)).padded)
        except PolyjitError:
          pass  # first shapes this variant cannot bind: only later sizes count
    if variant is not None and variant.traced is not None:
      if rental.model is None and not rental.measured:
        rental.remember(_disk_cache.program_key(variant.traced.jaxpr, struct.specs))
      rental.use_model(variant.traced.jaxpr, jax.default_backend())
    return rental

  def call_bucket(self, struct: Structure, binding: Binding, variant: Variant,
                  logical: dict[str, int]) -> dict[str, int]:
    """The padded sizes a call with these logical sizes runs at (what a call
    decides, without compiling: for `lower` and `trace`)."""
    tight = self.tight(struct, logical)
    rental = self.rental(struct, logical, variant)
    if rental is None:
      return tight
    found = self._compiled_bucket(struct, rental, binding, variant, logical)
    return dict(found[1].bucket) if found is not None else rental.roomy(logical)

  def borrowed_plan(self, struct: Structure, shapes: Shapes, rental: Rental, binding: Binding,
                    variant: Variant, logical: dict[str, int],
                    tight: dict[str, int]) -> Plan | None:
    """A plan in the smallest compiled bucket that holds `logical`, or None."""
    found = self._compiled_bucket(struct, rental, binding, variant, logical)
    if found is None:
      return None
    bucket, key, fut = found
    plan = data_dependent.plan_for(variant, key, fut.result(), struct.dtypes,
                                   logical_values(binding, logical), logical,
                                   waste(shapes, key.padded_shapes), None, shapes)
    if plan is None:  # (output shapes known after the run: no template)
      plan = plan_in(struct, key, fut.result(), binding, variant, logical, shapes)
      if not variant.constraints and struct.templates.get(bucket) is None:
        struct.keep_template(plan, binding, variant)
    self.rent(struct, rental, plan, logical, bucket_key(tight), binding, variant)
    return plan

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
      fut = self._compiler.cache.peek(key)
      if fut is not None and fut.done() and fut.exception() is None:
        return bucket, key, fut
    return None

  def rent(self, struct: Structure, rental: Rental, plan: Plan, logical: dict[str, int],
           tight_key: tuple[Any, ...], binding: Binding, variant: Variant) -> None:
    """When `plan` runs in a larger bucket than its own (`tight_key`: the
    `bucket_key` of its own), its calls pay what they waste into the
    accounts of the smaller buckets that would hold them; an account
    compiles its bucket once it has paid for it."""
    rental.observe(logical)
    program_key = plan.key  # (a NamedTuple: each field read is a call; every new size)
    running = program_key.bucket
    if running == tight_key:
      return
    # (`program_key.variant` is `variant.key`, already built)
    key: tuple[Any, ...] | None = (program_key.variant, tight_key, running)
    accounts = rental.borrow_accounts.get(key) if not variant.constraints else None
    if accounts is None:
      accounts = []
      for env in rental.smaller(logical, dict(running)):
        if fit_to_constraints(logical, env, variant.scope) != env:
          continue  # these sizes break a constraint there: no such program
        accounts.append(rental.account(env, functools.partial(
            self._compile_for_waste, struct, binding, variant, env)))
      if not variant.constraints:  # else the list depends on the sizes themselves
        rental.borrow_accounts[key] = accounts
      else:
        key = None
    plan.borrow_from(rental.borrow(running, accounts, key, logical))
    for v, b in running:
      if b > LOOSE * logical[v]:
        # more than LOOSE x its size: buys its own bucket after REPEATS calls
        # (`Plan.pay`), through its tight bucket's account (keyed by `tight_key`)
        account = rental.accounts.get(tight_key)
        if account is not None and account.future is None:
          plan.loose = (account, logical)  # (the caller's dict, made for this plan)
        break

  def _compile_for_waste(self, struct: Structure, binding: Binding, variant: Variant,
                         env: dict[str, int], wasted: float,
                         compile_cost: float, why: str | None = None) -> Future[Any]:
    """Compiles the bucket `env`, whose account has paid for it (or insists:
    `why`): here, under deterministic estimates (so that the next call's
    bucket never depends on when a thread finishes), else in the background."""
    rental = struct.rental
    assert rental is not None  # (an account of this structure's rental paid)
    what = "" if rental.measured else "estimated "
    cause = Cause("bucket", bucket=dict(env),
                  reason=why or f"{what}waste {wasted:.3g} s > compile {compile_cost:.3g} s")
    assert struct.masked is not None  # (a bucket of a masked plan)
    key, build = self._compiler.masked(struct, struct.masked, binding, variant, env, cause)
    if self._compiler.background or rental.measured:
      return self._compiler.cache.submit(key, build)
    done: Future[Any] = Future()
    done.set_result(self._compiler.cache.get(key, build))
    return done


class IntervalMemo:
  """A monotone policy's `bucket`, remembered as intervals: each bucket b
  computed is kept with the smallest size seen to map to it (`low`), and
  every size in [low, b] maps to b (b(low) = b = b(b), and b is monotone),
  for buckets up to the policy's maximum that are their own bucket (checked
  once per bucket; the others are computed each time).
  A never-seen size in a known interval costs a bisection, not the policy's
  arithmetic (every never-seen size asks: `BucketChoice.tight_key`)."""
  __slots__ = ("bucket", "maximum", "tops", "low")
  LIMIT = 4096  # intervals kept (then it starts over: an `Exact` policy has one per size)

  def __init__(self, bucket: Callable[[int], int], maximum: int | None) -> None:
    self.bucket = bucket
    self.maximum = maximum
    self.tops: list[int] = []     # the buckets computed, ascending
    self.low: dict[int, int] = {}  # bucket -> the smallest size seen in it

  def __call__(self, n: int) -> int:
    tops = self.tops
    i = bisect.bisect_left(tops, n)
    if i < len(tops):
      top = tops[i]
      if self.low[top] <= n:
        return top
    b = self.bucket(n)
    if (self.maximum is not None and b > self.maximum) or self.bucket(b) != b:
      return b  # (an overflow; a grid point that is not its own bucket: steps=3)
    low = self.low.get(b)
    if low is None:
      if len(tops) >= self.LIMIT:
        tops.clear()
        self.low.clear()
      bisect.insort(tops, b)
      self.low[b] = n
    elif n < low:
      self.low[b] = n
    return b
