"""The cost-aware bucket policy: compile a tighter bucket only once it has paid for itself.

A fixed policy (powers of two, a geometric ratio) compiles one program per
bucket the sizes touch. That is right when run time dominates; when the work
takes microseconds and a compile takes 80 ms, every extra program is pure
loss. `CostAware` decides online, per `pj.jit` structure, from measurements:

* A call that fits no compiled bucket compiles one (now, it has to), sized
  with *headroom*: the grid bucket of `headroom` times the largest size seen,
  so that the next larger sizes do not each compile again.
* A call whose tight bucket (the `grid` bucket of its sizes) is not compiled,
  but that fits a compiled larger one, runs in the smallest such bucket, and
  the run time it wastes there is charged to the account of every smaller
  grid bucket that would have held it (up to `MAX_ACCOUNTS` of them): the
  larger bucket's measured run time minus an estimate of the smaller one's.
* Once an account's waste reaches the measured compile cost (the mean wall
  time of this structure's compiles), its bucket is compiled in a
  background thread; calls keep running in the larger bucket until it is
  ready. That is the ski-rental rule: rent (pay the waste) until the rent
  paid equals the price (a compile), then buy; never more than twice the
  cost of the best choice made knowing the future, per bucket.
* Headroom is skipped when the measurements say it would waste a compile's
  worth of run time within `ROOMY_CALLS` calls: costly programs compile
  their tight bucket when nothing holds a call.

Run times are measured by blocking on a few calls of each program: the first
`SAMPLES` new shapes that run in it and then every `SAMPLE_EVERY`-th, never a
repeated shape (the hot path never blocks). A tight bucket's run time is
interpolated, linear in the bucket's volume (the product of its padded
sizes), between measured programs; below the smallest measured one, the line
through the two smallest is extrapolated (a fixed per-call cost is never
wasted), or with one measurement, proportionally (which overestimates the
waste, so a tight bucket is compiled sooner rather than later). So a cheap
program (a likelihood over 10,000 values: microseconds) keeps one or two
buckets, and a costly one (a wide MLP, quadratic attention) gets tight
buckets after a few calls.

Exactness does not depend on the bucket: masking gives the unpadded result
whichever program runs. Decisions depend on measured times, so which program
serves a call can differ between runs; results do not.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import threading
from typing import Any, Callable

from ._buckets import BucketPolicy, Geometric, as_policy

SAMPLES = 3          # run-time samples of each program from its first new shapes
SAMPLE_EVERY = 64    # then one sample every this many new shapes
MAX_ACCOUNTS = 8     # smaller buckets a borrowing call pays into
ROOMY_CALLS = 32     # headroom must not waste a compile's run time in fewer calls

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
  seen when a call fits no compiled bucket.
  """
  grid: BucketPolicy = Geometric(ratio=1.25, minimum=16, align=8)
  headroom: float = 2.0

  def __post_init__(self) -> None:
    if not self.headroom >= 1:
      raise ValueError(f"headroom must be >= 1, got {self.headroom}")
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
    """The bucket to compile for `size` when no compiled bucket holds it."""
    want = max(size, math.ceil(self.headroom * max(size, largest_seen)))
    if self.grid.maximum is not None:
      want = max(size, min(want, self.grid.maximum))
    return self.grid.bucket(want)


def volume(env: dict[str, int]) -> int:
  return math.prod(env.values()) if env else 1


class Account:
  """The run time that calls have wasted for want of one bucket's program."""
  __slots__ = ("rental", "env", "waste", "future", "start")

  def __init__(self, rental: Rental, env: dict[str, int], start: Callable[..., Any]) -> None:
    self.rental = rental
    self.env = env
    self.waste = 0.0
    self.future: concurrent.futures.Future[Any] | None = None
    self.start = start          # start(waste, compile_estimate) -> Future

  def add(self, seconds: float) -> None:
    """A call ran elsewhere and wasted `seconds`; compile once it adds up."""
    self.waste += seconds
    rental = self.rental
    if self.future is None and self.waste >= rental.compile_estimate and not rental.busy:
      with rental.lock:
        if self.future is None and not rental.busy:
          rental.busy = True  # one at a time: the next is chosen knowing this one
          future = self.start(self.waste, rental.compile_estimate)
          future.add_done_callback(rental.finished)
          self.future = future


class Borrow:
  """A plan's stay in a larger bucket than its own (`Plan.provisional`).

  Each call pays what it wastes into the accounts of the smaller buckets
  that would have held it; the plan is given up (`done()`) whenever the
  structure gets a new program, so the next call looks for a tighter one.
  """
  __slots__ = ("rental", "generation", "running", "candidates", "charges", "key")

  def __init__(self, rental: Rental, running: BucketKey, candidates: list[Account],
               key: Any) -> None:
    self.rental = rental
    self.generation = rental.generation
    self.running = running
    self.candidates = candidates
    self.charges: Charges | None = None  # [(account, seconds per call)], once times are known
    self.key = key              # (variant, tight bucket, running bucket): shared charges

  def done(self) -> bool:
    return self.generation != self.rental.generation

  def pay(self) -> None:
    charges = self.charges
    if charges is None:
      charges = self.charges = self.rental.charges(self.running, self.candidates, self.key)
      if charges is None:
        return
    for account, seconds in charges:
      account.add(seconds)


class Rental:
  """The ski-rental state of one `pj.jit` structure under `CostAware`."""

  def __init__(self, policies: dict[str, CostAware]):
    self.policies = policies
    self.lock = threading.Lock()
    self.generation = 0                               # bumped by each new program
    self.busy = False                                 # a background compile running
    self.largest: dict[str, int] = {}
    self.envs: dict[BucketKey, dict[str, int]] = {}   # bucket key -> env, compiled ones
    self.times: dict[BucketKey, list[float]] = {}     # bucket key -> run-time samples
    self.new_shapes: dict[BucketKey, int] = {}        # bucket key -> new shapes run there
    self.accounts: dict[BucketKey, Account] = {}      # bucket key -> its account
    self.compile_seconds: list[float] = []
    self.compile_estimate = math.inf
    self.borrow_accounts: dict[Any, Any] = {}         # Borrow.key -> its accounts
    self.charge_cache: dict[Any, Charges] = {}        # Borrow.key -> charges

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
    have, want = self.estimate(roomy), self.estimate(tight)
    if have is not None and want is not None and \
        (have - want) * ROOMY_CALLS > self.compile_estimate:
      return tight
    return roomy

  def candidates(self, logical: dict[str, int]) -> list[BucketKey]:
    """Bucket keys of compiled programs that hold `logical`, smallest first."""
    fits = [(volume(env), key) for key, env in list(self.envs.items())
            if all(env.get(v, 0) >= n for v, n in logical.items())]
    return [key for _, key in sorted(fits)]

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

  # --- measurements --------------------------------------------------------------

  def compiled(self, bucket: BucketKey, env: dict[str, int], wall_seconds: float) -> None:
    self.charge_cache = {}
    self.envs[bucket] = dict(env)
    self.compile_seconds.append(wall_seconds)
    self.compile_estimate = sum(self.compile_seconds) / len(self.compile_seconds)

  def bump(self) -> None:
    """A new program is ready: borrowing plans look again."""
    self.generation += 1

  def finished(self, _future: concurrent.futures.Future[Any]) -> None:
    self.busy = False
    self.bump()

  def wants_sample(self, bucket: BucketKey) -> bool:
    """Whether the first run of a new shape in `bucket` should be timed."""
    seen = self.new_shapes.get(bucket, 0)
    self.new_shapes[bucket] = seen + 1
    return seen < SAMPLES or seen % SAMPLE_EVERY == 0

  def record_time(self, bucket: BucketKey, seconds: float) -> None:
    self.charge_cache = {}
    self.times.setdefault(bucket, []).append(seconds)

  def run_time(self, bucket: BucketKey) -> float | None:
    samples = self.times.get(bucket)
    return min(samples) if samples else None

  def estimate(self, env: dict[str, int]) -> float | None:
    """Estimated seconds per call in a bucket `env`, from the measured ones."""
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
    if key is not None:
      self.charge_cache[key] = out
    return out

  def account(self, env: dict[str, int], start: Callable[..., Any]) -> Account:
    key = tuple(sorted(env.items()))
    with self.lock:
      acc = self.accounts.get(key)
      if acc is None:
        acc = self.accounts[key] = Account(self, dict(env), start)
      return acc
