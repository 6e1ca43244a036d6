"""The cost-aware bucket policy: compile a tighter bucket only once it has paid for itself.

A fixed policy (powers of two, a geometric ratio) compiles one program per
bucket the sizes touch. That is right when run time dominates; when the work
takes microseconds and a compile takes 80 ms, every extra program is pure
loss. `CostAware`, `pj.jit`'s default, decides online, per `pj.jit`
structure, from cost estimates:

* A call that fits no compiled bucket compiles one (now, it has to), sized
  with *headroom*: the grid bucket of `headroom` times the largest size seen
  (rounded up to a power of two first, so that nearby sizes agree), so that
  the next larger sizes do not each compile again.
* A call whose tight bucket (the `grid` bucket of its sizes) is not compiled,
  but that fits a compiled larger one, runs in the smallest such bucket, and
  the run time it wastes there is charged to the account of every smaller
  grid bucket that would have held it (up to `MAX_ACCOUNTS` of them): the
  larger bucket's estimated run time minus the smaller one's.
* Once an account's waste reaches the estimated compile cost, its bucket is
  compiled. That is the ski-rental rule: rent (pay the waste) until the rent
  paid equals the price (a compile), then buy; with exact costs never more
  than twice the cost of the best choice made knowing the future, per bucket.
  The calls are counted as they come and charged in batches
  (`Rental.settle_up`), never later than the call that reaches a price: a
  bucket is bought in the same call either way.
* Headroom is skipped when the estimates say it would waste a compile's
  worth of run time within `ROOMY_CALLS` calls: costly programs compile
  their tight bucket when nothing holds a call.
* A size that keeps coming back does not stay loose: a plan that has run
  `REPEATS` times in a bucket more than `LOOSE` times its size along some
  dimension buys its tight bucket then (`Account.insist`), whatever the
  account says (the estimates may be wrong, and a size repeated that often
  is the run's future more surely than the waste so far says). Counted per
  plan, deterministic like the rest.

Where the estimates come from (`estimates=`):

* "model" (the default): `_buckets/cost_model.py`, from the function's jaxpr and the
  padded sizes (work and memory traffic per bucket, equations per compile).
  Nothing is timed, nothing blocks, and the bucket compiled when an account
  is paid is compiled right there, in the call that paid it. So every
  decision depends only on the sequence of calls: the same script runs each
  call in the same bucket every time, and its results repeat bit for bit.
  (Masking is exact in every bucket, but a float reduction over another
  padded size may round differently in the last bit; a timing-dependent
  choice would make results differ between runs.) One thing outside this
  policy is timed on purpose: a shape whose calls' overhead has paid for a
  compile moves to `jax.jit`'s program at exactly its shapes
  (`_jit/hot_shapes.py`); which call is its first there depends on the clock,
  and its results are then `jax.jit`'s.
* "measured": compile times as measured and run times sampled by blocking on
  a few calls of each program (the first `SAMPLES` new shapes that run in it,
  then every `SAMPLE_EVERY`-th, never a repeated shape); a tight bucket's run
  time is interpolated linearly in the bucket's volume between measured
  programs. Paid accounts compile in a background thread; calls keep running
  in the larger bucket until it is ready. Adapts to the machine, but which
  program serves a call then depends on timings.

Across processes (`_caching/disk.py`): the buckets a traced program compiled
are remembered on disk, keyed by that program; a later run starts in the
tightest remembered bucket that holds a call (instead of the headroom
bucket), and a remembered bucket's price is a load (`LOAD_FRACTION` of a
compile). A remembered bucket is a hint read from a file: it is used only
when no dimension of it exceeds the headroom bucket or `REMEMBERED_SLACK`
times the largest size seen, whichever is larger (a file that says 10**12
must not allocate terabytes). The choices are then deterministic given the history and the
cache's contents; with the cache off (`POLYJIT_NO_CACHE=1`), given the history.

Exactness does not depend on the bucket: masking gives the unpadded result
whichever program runs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import itertools
import math
import threading
from typing import Any, Callable

from .fixed import BucketPolicy, PowersOfTwo, as_policy
from .._caching import disk as _disk_cache
from .cost_model import CostModel

SAMPLES = 3          # run-time samples of each program from its first new shapes
SAMPLE_EVERY = 64    # then one sample every this many new shapes
MAX_ACCOUNTS = 8     # smaller buckets a borrowing call pays into
ROOMY_CALLS = 32     # headroom must not waste a compile's run time in fewer calls
LOAD_FRACTION = 0.1  # a program on disk: loading it costs this part of a compile
REMEMBERED_SLACK = 16  # a remembered bucket: at most this times the largest size seen
REPEATS = 100        # a size run this many times in a bucket more than LOOSE x its
LOOSE = 2.0          # own size gets its own bucket, paid for or not (issue 35)
QUIET_MAX = 1 << 20  # calls of borrowing plans charged at least this often

#: A bucket's key (hashable; built by the caller).
BucketKey = tuple[Any, ...]
#: [(account, seconds per call)] a call wastes against smaller buckets.
Charges = list[tuple["Account", float]]


@dataclasses.dataclass(frozen=True)
class CostAware(BucketPolicy):
  """Buckets from `grid`, compiled only when they pay for themselves.

  `bucket(size)` is the tight bucket (`grid`'s); `pj.jit` runs a size there
  only once that program exists, else in the smallest compiled bucket that
  holds it (see the module docstring). `headroom` scales the largest size
  seen when a call fits no compiled bucket. `estimates` is "model"
  (deterministic: from the jaxpr, the default) or "measured" (timings).
  """
  grid: BucketPolicy = PowersOfTwo(steps=4)
  headroom: float = 2.0
  estimates: str = "model"

  def __post_init__(self) -> None:
    if not self.headroom >= 1:
      raise ValueError(f"headroom must be >= 1, got {self.headroom}")
    if self.estimates not in ("model", "measured"):
      raise ValueError(f"estimates must be 'model' or 'measured', got {self.estimates!r}")
    object.__setattr__(self, "grid", as_policy(self.grid))  # a list, an int k, ...
    if isinstance(self.grid, CostAware):
      raise TypeError("the grid of CostAware must be a fixed policy")

  @property
  def minimum(self) -> int:  # type: ignore[override]
    return self.grid.minimum

  @property
  def maximum(self) -> int | None:  # type: ignore[override]
    return self.grid.maximum

  @property
  def overflow(self) -> str:  # type: ignore[override]
    return self.grid.overflow

  def bucket(self, size: int) -> int:
    return self.grid.bucket(size)

  def _bucket(self, size: int) -> int:
    return self.grid.bucket(size)

  def roomy(self, size: int, largest_seen: int) -> int:
    """The bucket to compile for `size` when no compiled bucket holds it: the
    grid's bucket of `headroom` times the largest size seen, first rounded up
    to a power of two so that nearby sizes get the same bucket in whatever
    order they come (concurrent calls then share one compile)."""
    want = max(size, math.ceil(self.headroom * max(size, largest_seen)))
    want = 1 << (want - 1).bit_length()
    if self.grid.maximum is not None:
      want = max(size, min(want, self.grid.maximum))
    return self.grid.bucket(want)


def headroom_programs(policy: CostAware, calls: list[dict[str, int]],
                      seen: dict[str, int] | None = None) -> list[dict[str, int]]:
  """The buckets `policy` compiles for `calls` (sizes per dimension, in call
  order) when no tighter bucket pays for itself (a cheap function): a call
  that no compiled bucket holds compiles the headroom bucket (`Rental.roomy`
  without estimates). `seen`: sizes seen before (automatic mode's first call)."""
  largest = dict(seen or {})
  programs: list[dict[str, int]] = []
  for sizes in calls:
    if not any(all(env[v] >= n for v, n in sizes.items()) for env in programs):
      programs.append({v: policy.roomy(n, largest.get(v, n)) for v, n in sizes.items()})
    for v, n in sizes.items():
      largest[v] = max(largest.get(v, 0), n)
  return programs


def volume(env: dict[str, int]) -> int:
  return math.prod(env.values()) if env else 1


class Account:
  """The run time that calls have wasted for want of one bucket's program."""
  __slots__ = ("rental", "env", "waste", "future", "start", "rate", "price", "due")

  def __init__(self, rental: Rental, env: dict[str, int], start: Callable[..., Any]) -> None:
    self.rental = rental
    self.env = env
    self.waste = 0.0
    self.rate = 0.0             # the most seconds one call has been charged here
    self.price = rental.price(env)  # (`Rental.reprice` keeps it)
    self.due = 0                # the call count by which it may reach its price (`Rental.due`)
    self.future: concurrent.futures.Future[Any] | None = None
    self.start = start          # start(waste, compile_estimate, why) -> Future

  def settle(self, why: str | None = None) -> None:
    """Compiles the bucket once the waste has paid its price (and no other
    compile of this rental is running); with `why`, now, paid or not."""
    rental = self.rental
    if self.future is None and (why is not None or self.waste >= rental.price(self.env)) \
        and not rental.busy:
      with rental.lock:
        if self.future is None and not rental.busy:
          rental.busy = True  # one at a time: the next is chosen knowing this one
          future = self.start(self.waste, rental.price(self.env), why)
          future.add_done_callback(rental.finished)
          self.future = future

  def insist(self, sizes: dict[str, int], bucket: dict[str, int]) -> None:
    """Buys this bucket now: calls with `sizes` ran `REPEATS` times in
    `bucket`, more than `LOOSE` times their size (a no-op once bought; while
    another compile runs, the next call tries again)."""
    if self.future is None:
      self.settle(", ".join(f"{v}={n}" for v, n in sorted(sizes.items()))
                  + f" ran {REPEATS} times in bucket "
                  + ", ".join(f"{v}={n}" for v, n in sorted(bucket.items()))
                  + f", more than {LOOSE:g}x its size")


class Borrow:
  """A plan's stay in a larger bucket than its own (`Plan.provisional`).

  Each call pays what it wastes into the accounts of the smaller buckets
  that would have held it; the plan is given up (`done()`) when the
  structure gets a new program that may be a tighter fit for it, so the
  next call looks for that one (`Rental.bump`). A shared borrow (with a
  `key`) stays while no compiled bucket smaller than `running` holds the
  smallest sizes it serves (`low`): its plans' bucket is then still the
  smallest that holds them, and rebuilding them would change nothing.
  """
  __slots__ = ("rental", "generation", "running", "candidates", "charges", "key", "low",
               "unpaid", "queued")

  def __init__(self, rental: Rental, running: BucketKey, candidates: list[Account],
               key: Any) -> None:
    self.rental = rental
    self.generation = rental.generation
    self.running = running
    self.candidates = candidates
    self.charges: Charges | None = None  # [(account, seconds per call)], once times are known
    self.key = key              # (variant, tight bucket, running bucket): shared charges
    self.low: dict[str, int] = {}  # per dimension, the smallest size of its plans
    self.unpaid = 0             # calls not yet charged to the accounts (`Rental.settle_up`)
    self.queued = False         # in `Rental.unpaid`

  def done(self) -> bool:
    return self.generation != self.rental.generation

  def serve(self, logical: dict[str, int]) -> None:
    """A plan with sizes `logical` borrows through this one."""
    low = self.low
    for v, n in logical.items():
      if n < low.get(v, n + 1):
        low[v] = n

  def pay(self) -> None:
    """A call in the larger bucket: what it wastes is owed to the accounts
    (every call in a larger bucket comes here). The calls are counted here
    and charged in a batch by `Rental.settle_up` when the count reaches the
    first call that might bring an account to its price (`Rental.next_due`):
    each bucket is bought in the same call as if every call were charged as
    it came (only the rounding of the sums may differ in the last bit)."""
    rental = self.rental
    if self.charges is None:
      self.charges = rental.charges(self.running, self.candidates, self.key)
      if self.charges is None:
        return  # (no run time yet: nothing to charge)
      rental.next_due = 0  # new charges (and rates): every account's due call again
    self.unpaid += 1
    if not self.queued:
      self.queued = True
      rental.unpaid.append(self)
    rental.counted += 1
    if rental.counted >= rental.next_due:
      rental.settle_up()


class Rental:
  """The ski-rental state of one `pj.jit` structure under `CostAware`."""

  def __init__(self, policies: dict[str, CostAware]):
    self.policies = policies
    # "model": deterministic estimates (`model`, set from the first traced
    # variant by `use_model`), accounts compile in the paying call.
    self.measured = any(p.estimates == "measured" for p in policies.values())
    self.model: CostModel | None = None
    self.lock = threading.Lock()
    self.generation = 0                               # bumped by each new program
    self.busy = False                                 # a background compile running
    self.largest: dict[str, int] = {}
    self.envs: dict[BucketKey, dict[str, int]] = {}   # bucket key -> env, compiled ones
    self._by_volume: list[tuple[BucketKey, dict[str, int]]] = []  # envs, smallest first
    self.times: dict[BucketKey, list[float]] = {}     # bucket key -> run-time samples
    self.new_shapes: dict[BucketKey, int] = {}        # bucket key -> new shapes run there
    self.accounts: dict[BucketKey, Account] = {}      # bucket key -> its account
    self.compile_seconds: list[float] = []
    self._compile_estimate = math.inf
    # Calls of borrowing plans counted (`Borrow.pay`), the borrows with some
    # not yet charged, and the count at which some account may reach its
    # price (the least `Account.due`, kept in a heap: `settle_up`).
    self.unpaid: list[Borrow] = []
    self.counted = 0
    self.next_due = 0
    self._dues: list[tuple[int, int, Account]] = []
    self._order = itertools.count()  # (ties in the heap)
    self.borrow_accounts: dict[Any, Any] = {}         # Borrow.key -> its accounts
    self.charge_cache: dict[Any, Charges] = {}        # Borrow.key -> charges
    self.borrows: dict[Any, Borrow] = {}              # Borrow.key -> the current one
    # The on-disk bucket memory (`_caching/disk.py`): the traced program's key and
    # the buckets an earlier run of it compiled (their programs load from disk).
    self.memory_key: str | None = None
    self.remembered: list[dict[str, int]] = []

  @property
  def compile_estimate(self) -> float:
    """Estimated seconds a compile takes (an account's price)."""
    return self._compile_estimate

  @compile_estimate.setter
  def compile_estimate(self, seconds: float) -> None:
    self._compile_estimate = seconds
    self.reprice()

  def reprice(self) -> None:
    """The prices changed: each account's (`Account.price`), and the next
    paying call settles up."""
    for account in list(self.accounts.values()):
      account.price = self.price(account.env)
    self.next_due = 0

  # --- sizes and buckets --------------------------------------------------------

  def observe(self, logical: dict[str, int]) -> None:
    for v, n in logical.items():
      if n > self.largest.get(v, 0):
        self.largest[v] = n

  def tight(self, logical: dict[str, int]) -> dict[str, int]:
    return {v: self.policies[v].bucket(n) for v, n in logical.items()}

  def roomy(self, logical: dict[str, int]) -> dict[str, int]:
    """The bucket to compile when none holds `logical`: with headroom, unless
    the measurements say the headroom would waste a compile's worth of run
    time within `ROOMY_CALLS` calls (a costly program gets its tight bucket)."""
    tight = self.tight(logical)
    roomy = {v: self.policies[v].roomy(n, self.largest.get(v, n)) for v, n in logical.items()}
    if self.remembered:
      limit = {v: max(roomy[v], REMEMBERED_SLACK * max(n, self.largest.get(v, n)))
               for v, n in logical.items()}
      known = [env for env in self.remembered if env.keys() == logical.keys()
               and env not in self.envs.values()
               and all(n <= env[v] <= limit[v] for v, n in logical.items())]
      if known:  # an earlier run converged to these: start in the tightest (a load)
        return min(known, key=volume).copy()
    have, want = self.estimate(roomy), self.estimate(tight)
    if have is not None and want is not None and \
        (have - want) * ROOMY_CALLS > self.compile_estimate:
      return tight
    return roomy

  def candidates(self, logical: dict[str, int]) -> list[BucketKey]:
    """Bucket keys of compiled programs that hold `logical`, smallest first."""
    return [key for key, env in self._by_volume
            if all(env.get(v, 0) >= n for v, n in logical.items())]

  def smallest_key(self, logical: dict[str, int]) -> BucketKey | None:
    """`candidates(logical)[0]`, or None, without looking further (every
    call with a new size: plain loops, no generator per bucket)."""
    for key, env in self._by_volume:
      for v, n in logical.items():
        if env.get(v, 0) < n:
          break
      else:
        return key
    return None

  def smaller(self, logical: dict[str, int], running: dict[str, int]) -> list[dict[str, int]]:
    """The buckets below `running` that would hold `logical`: every grid
    bucket between them for one dimension (at most `MAX_ACCOUNTS`, spread
    out), the tight bucket alone for several."""
    tight = self.tight(logical)
    if len(logical) != 1:
      return [tight] if tight != running else []
    (v, n), = logical.items()
    sizes = [b for b in self.policies[v].grid.sizes(n, running[v] - 1) if b < running[v]]
    if len(sizes) > MAX_ACCOUNTS:
      step = len(sizes) / MAX_ACCOUNTS
      sizes = sorted({sizes[int(i * step)] for i in range(MAX_ACCOUNTS)} | {sizes[-1]})
    return [{v: b} for b in sizes]

  # --- estimates ------------------------------------------------------------------

  def use_model(self, jaxpr: Any, platform: str) -> None:
    """Estimates from `jaxpr` (the traced function) unless they are measured."""
    if not self.measured and self.model is None:
      self.model = CostModel(jaxpr, platform)
      self.compile_estimate = self.model.compile_seconds()

  def remember(self, key: str) -> None:
    """Starts from the buckets an earlier run of the traced program `key` compiled."""
    if self.memory_key is None:
      self.memory_key = key
      self.remembered = _disk_cache.load_buckets(key)
      self.reprice()

  def price(self, env: dict[str, int]) -> float:
    """What buying `env` costs: a compile, or a load for a remembered bucket."""
    if env in self.remembered:
      return self.compile_estimate * LOAD_FRACTION
    return self.compile_estimate

  def compiled(self, bucket: BucketKey, env: dict[str, int], wall_seconds: float) -> None:
    self.charge_cache = {}
    self.envs[bucket] = dict(env)
    self._by_volume = [(k, e) for _, k, e in sorted(
        (volume(e), k, e) for k, e in list(self.envs.items()))]
    if self.memory_key is not None:
      _disk_cache.remember_bucket(self.memory_key, env)
    self.compile_seconds.append(wall_seconds)
    if self.measured:
      self.compile_estimate = sum(self.compile_seconds) / len(self.compile_seconds)

  def settle_up(self) -> None:
    """Charges the calls counted by the borrows (`Borrow.pay`) to their
    accounts, settles those that reached their price, and works out how many calls may pass before the
    next: while every account is further from its price than that many
    calls at the most any call charges it (`Account.rate`), none can
    reach it, so charging them later changes no decision. Only the
    accounts due are looked at again: the bound of the others holds
    whatever was charged meanwhile, as it assumed the most."""
    unpaid = self.unpaid
    while True:
      try:
        borrow = unpaid.pop()
      except IndexError:  # (another thread took the last one)
        break
      borrow.queued = False
      calls, borrow.unpaid = borrow.unpaid, 0
      charges = borrow.charges
      if not calls or charges is None:
        continue
      for account, seconds in charges:
        account.waste += seconds if calls == 1 else seconds * calls
        if account.future is None and account.waste >= account.price:
          account.settle()  # (may compile now, and bump: which settles up first)
    now = self.counted
    dues = self._dues
    if self.next_due == 0:  # new charges or prices: every account again
      dues.clear()
      for account in list(self.accounts.values()):
        _schedule(self, account, now)
    else:  # the accounts due now; the others' bounds still hold
      while dues and dues[0][0] <= now:
        due, _, account = heapq.heappop(dues)
        if due == account.due:  # (else a stale entry: rescheduled since)
          _schedule(self, account, now)
    self.next_due = dues[0][0] if dues else now + QUIET_MAX

  def bump(self) -> None:
    """A new program is ready: borrowing plans that it may fit better look
    again. Shared borrows (`borrows`) that no compiled bucket smaller than
    their own may hold (`_beaten`) carry over into the new generation, their
    plans still current; their charges are worked out again on their next
    call, as a new borrow's would be (measured run times may have changed).
    Every other borrow is done: its plans look again."""
    self.settle_up()  # (what the borrows owe, charged as their charges were)
    old = self.generation
    self.generation = old + 1
    for borrow in list(self.borrows.values()):
      if borrow.generation == old and not self._beaten(borrow):
        borrow.charges = None
        borrow.generation = old + 1

  def _beaten(self, borrow: Borrow) -> bool:
    """Whether a compiled bucket before `borrow.running` (in `smallest_key`'s
    order) holds the smallest sizes it serves, so may hold some of its plans
    (one that does not holds none of them)."""
    low = borrow.low
    for key, env in list(self._by_volume):
      if key == borrow.running:
        return False
      if all(env.get(v, 0) >= n for v, n in low.items()):
        return True
    return True  # (its bucket is not among the compiled ones: look again)

  def finished(self, _future: concurrent.futures.Future[Any]) -> None:
    self.busy = False
    self.bump()

  def wants_sample(self, bucket: BucketKey) -> bool:
    """Whether the first run of a new shape in `bucket` should be timed."""
    if not self.measured:
      return False
    seen = self.new_shapes.get(bucket, 0)
    self.new_shapes[bucket] = seen + 1
    return seen < SAMPLES or seen % SAMPLE_EVERY == 0

  def record_time(self, bucket: BucketKey, seconds: float) -> None:
    self.charge_cache = {}
    self.times.setdefault(bucket, []).append(seconds)

  def run_time(self, bucket: BucketKey) -> float | None:
    if self.model is not None:
      return self.model.run_seconds(dict(bucket))
    samples = self.times.get(bucket)
    return min(samples) if samples else None

  def estimate(self, env: dict[str, int]) -> float | None:
    """Estimated seconds per call in a bucket `env`: the model's, or
    interpolated between the measured buckets."""
    if self.model is not None:
      return self.model.run_seconds(env)
    if not self.measured:
      return None  # no model yet (nothing traced): no estimate
    points: list[tuple[int, float]] = sorted(
        (volume(self.envs[b]), min(t)) for b, t in list(self.times.items())
        if b in self.envs and t)
    if not points:
      return None
    v = volume(env)
    below = [p for p in points if p[0] <= v]
    above = [p for p in points if p[0] >= v]
    if below and above:
      (v0, t0), (v1, t1) = below[-1], above[0]
      return t0 if v1 == v0 else t0 + (t1 - t0) * (v - v0) / (v1 - v0)
    if len(points) == 1:
      (v0, t0), = points
      return t0 * v / v0
    (v0, t0), (v1, t1) = (points[:2] if above else points[-2:])
    slope = max(t1 - t0, 0.0) / (v1 - v0) if v1 != v0 else 0.0
    return max(t0 + slope * (v - v0), 0.0)

  def charges(self, running: BucketKey, accounts: list[Account],
              key: Any = None) -> Charges | None:
    """[(account, seconds)] a call in bucket `running` wastes against each
    smaller bucket; None until `running` has a measured run time. Kept per
    `key` until the next measurement."""
    out: Charges | None = self.charge_cache.get(key) if key is not None else None
    if out is not None:
      return out
    have = self.run_time(running)
    if have is None:
      return None
    out = []
    for account in accounts:
      want = self.estimate(account.env)
      if want is not None and have > want:
        out.append((account, have - want))
        if have - want > account.rate:
          account.rate = have - want
    if key is not None:
      self.charge_cache[key] = out
    return out

  def borrow(self, running: BucketKey, accounts: list[Account], key: Any,
             logical: dict[str, int]) -> Borrow:
    """The `Borrow` of a plan with sizes `logical` in bucket `running` that
    pays into `accounts`: one per `key` (variant, tight bucket, running
    bucket) until it is done, shared by every size with that key (None: a
    new one)."""
    if key is None:
      return Borrow(self, running, accounts, None)
    borrow = self.borrows.get(key)
    if borrow is None or borrow.generation != self.generation:  # (`done`, inline: every new size)
      borrow = self.borrows[key] = Borrow(self, running, accounts, key)
    borrow.serve(logical)
    return borrow

  def account(self, env: dict[str, int], start: Callable[..., Any]) -> Account:
    key = tuple(sorted(env.items()))
    with self.lock:
      acc = self.accounts.get(key)
      if acc is None:
        acc = self.accounts[key] = Account(self, dict(env), start)
      return acc


def _schedule(rental: Rental, account: Account, now: int) -> None:
  """Keeps (in `rental`'s heap) the first call count at which `account` may
  reach its price if every call from `now` on charged it its `rate`: until
  then no call can (one call of margin for the rounding)."""
  if account.future is not None or account.rate <= 0:
    account.due = 0
    return
  calls = (account.price - account.waste) / account.rate
  wait = QUIET_MAX if calls >= QUIET_MAX else max(1, min(QUIET_MAX, int(calls) - 1))
  account.due = now + wait
  heapq.heappush(rental._dues, (account.due, next(rental._order), account))
