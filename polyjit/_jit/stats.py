"""What a `pj.jit` function has done: its calls, and each program it built and why.

Every program is recorded as a `CompileRecord`: its key, its `Cause` (the
first call, an axis that changed and became dynamic, a new bucket, a fallback
to exact shapes, an empty dynamic axis, `precompile`), and the backend compiles
`jax.monitoring` reported for it (`_caching/compiles.py`), so the counts are measured,
never assumed. Every call adds to the bucket it ran in and to the padding it
carried; the distinct logical sizes of a dimension are kept with the argument
axis they came from, exactly up to `2 * SizeRecord.LIMIT` (2,048) of them and as a
bounded sketch past that. Every record is O(1) per call: a long run of
never-seen sizes does not grow it. `pj.stats` and `pj.explain` (`diagnostics/_explain.py`) read these
records; nothing here writes text.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import operator
from typing import Any, Collection, Iterable, Iterator, Literal, Sequence

from .._masking import dims as _dims
from .._caching.compiles import CompileLog
from .plans import ProgramKey
from .._masking.spec import Binding

CauseKind = Literal["first call", "exact", "bucket", "fallback", "zero size", "failing side",
                    "precompile", "hot shape"]


@dataclasses.dataclass(frozen=True)
class Cause:
  """Why a program was built.

  `kind` is one of: "first call" (automatic mode compiles the first shapes
  exactly), "exact" (new shapes while no axis is dynamic), "bucket" (new sizes
  in a bucket without a program), "fallback" (exact shapes because `fun`
  cannot be masked; `error` says why), "zero size" (exact shapes because a
  dynamic axis is empty), "failing side" (exact shapes because `fun` fails
  traced at these sizes, on one side of a size comparison, while other sizes
  mask: `lax.top_k(x, 3)` at n <= 2), "precompile" (asked for ahead of time),
  "hot shape" (shapes called so often in their bucket that its overhead paid
  for their own program: `hot_shapes.py`).
  """
  kind: CauseKind
  shapes: tuple[tuple[int, ...], ...] | None = None  # the call's argument shapes (None: precompile)
  changed: tuple[tuple[str, int, int, int], ...] = ()  # (argument, axis, old, new size)
  became_dynamic: tuple[str, ...] = ()   # dimensions this call made dynamic
  bucket: dict[str, int] | None = None   # dimension -> padded size compiled
  sizes: dict[str, int] | None = None    # dimension -> the call's logical size
  variant: str | None = None             # the side of `fun`'s size comparisons compiled
  error: str | None = None               # why `fun` cannot be masked ("fallback")
  reason: str | None = None              # why this bucket (a cost-aware policy's decision)


@dataclasses.dataclass(frozen=True)
class CompileRecord:
  """One program built: its key, its cause, and what `jax.monitoring` measured."""
  key: ProgramKey
  cause: Cause
  events: int           # backend compiles reported for it (0: loaded from the disk cache)
  seconds: float        # their duration
  wall_seconds: float   # lowering and compiling, as the caller waited

  @property
  def padded_shapes(self) -> tuple[tuple[int, ...], ...]:
    return self.key.padded_shapes

  @property
  def exact(self) -> bool:
    return self.key.exact


class SizeRecord(Collection[int]):
  """The distinct sizes a dimension took, in bounded memory.

  Exact up to `2 * LIMIT` distinct sizes; past that a bottom-k sketch
  (k-minimum values, k = `LIMIT`): the sizes whose hashes are below a
  threshold, at least `LIMIT` and at most `2 * LIMIT` of them (pruned back to
  the `LIMIT` smallest when full), a uniform sample of the distinct sizes
  whatever their order or repetition; the `LIMIT`-th smallest hash estimates
  how many there are (relative error about 1/sqrt(LIMIT), 3%). The smallest
  and largest sizes stay exact. `pj.explain`'s bucket advice (one program per
  bucket, padding per distinct size) reads the sample as it read the set, so
  a long run of never-seen sizes holds tens of kilobytes, not 33 bytes per
  size forever; a size costs a hash and a comparison. Two records merge by
  adding one's sample to the other (`update`): same hash, same sketch.
  """
  __slots__ = ("_hashes", "_top", "low", "high", "exact")
  LIMIT = 1024

  def __init__(self, sizes: Iterable[int] = ()) -> None:
    self._hashes: dict[int, int] = {}   # sampled size -> its hash (0 while exact)
    self._top = _SPAN                   # sizes whose hash is not below it are not kept
    self.low: int | None = None
    self.high: int | None = None
    self.exact = True                   # every distinct size is in the sample
    self.update(sizes)

  def add(self, n: int) -> None:
    hashes = self._hashes
    if n in hashes:
      return
    if self.low is None or n < self.low:
      self.low = n
    if self.high is None or n > self.high:
      self.high = n
    if self.exact:
      if len(hashes) < 2 * self.LIMIT:
        hashes[n] = 0  # (hashed only once the sketch starts: a plain set until then)
        return
      self.exact = False
      self._hashes = {m: _mix(m) for m in hashes}
      self._prune()
    h = _mix(n)
    if h < self._top:
      hashes = self._hashes  # (`_prune` replaces the dict)
      hashes[n] = h
      if len(hashes) >= 2 * self.LIMIT:
        self._prune()

  def _prune(self) -> None:
    """Keeps the `LIMIT` smallest hashes; the largest of them is the new threshold."""
    kept = heapq.nsmallest(self.LIMIT, self._hashes.items(), key=operator.itemgetter(1))
    self._hashes = dict(kept)
    self._top = kept[-1][1]

  def update(self, sizes: Iterable[int]) -> None:
    if isinstance(sizes, SizeRecord) and not sizes.exact:  # a sketch: merge thresholds
      for n in (sizes.low, sizes.high):
        if n is not None:
          self.add(n)
      if self.exact:
        self.exact = False
        self._hashes = {m: _mix(m) for m in self._hashes}
      # each sample holds every size it saw below its threshold: below the lower
      # one, the union of the two samples is the sample of the union
      self._top = top = min(self._top, sizes._top)
      self._hashes = {m: h for m, h in (self._hashes | sizes._hashes).items() if h < top}
      if len(self._hashes) >= 2 * self.LIMIT:
        self._prune()
      return
    for n in sizes:
      self.add(int(n))

  def __len__(self) -> int:
    """The number of distinct sizes (an estimate once not `exact`)."""
    if self.exact:
      return len(self._hashes)
    kth = heapq.nsmallest(self.LIMIT, self._hashes.values())[-1]
    return max(self.LIMIT + 1, round((self.LIMIT - 1) * _SPAN / max(kth, 1)))

  def __iter__(self) -> Iterator[int]:
    """The sampled sizes, and the smallest and largest."""
    yield from self._hashes
    for n in {self.low, self.high} - self._hashes.keys():
      if n is not None:
        yield n

  def __contains__(self, n: object) -> bool:
    return n in self._hashes or n == self.low or n == self.high


_SPAN = 1 << 64
_MASK = _SPAN - 1
_SALT = 0x2545F4914F6CDD1D


def _mix(n: int) -> int:
  """A 64-bit hash of a size, spread uniformly enough for the sketch (CPython's
  tuple hash mixes its items xxHash-style; an int alone hashes to itself)."""
  return hash((n, _SALT)) & _MASK


@dataclasses.dataclass
class DimRecord:
  """The logical sizes a dimension took, and where it first appears."""
  where: tuple[str, int] | None   # (argument name, axis) whose size is exactly the dim
  sizes: SizeRecord


class Stats:
  """What a `pj.jit` function has done; see `pj.stats` and `pj.explain`."""

  def __init__(self) -> None:
    self.calls = 0
    self.fallback_calls = 0
    self.cache_loads = 0                  # programs loaded from the persistent cache
    self.compile_events: list[CompileRecord] = []
    # bucket key -> calls
    self.bucket_hits: collections.Counter[tuple[Any, ...]] = collections.Counter()
    self.dims: dict[str, DimRecord] = {}
    self.waste_sum = 0.0     # (bucketed calls: their padding fractions summed, and counted;
                             # `Plan.call` adds to them on the hot path)
    self.waste_calls = 0

  @property
  def compiles(self) -> int:
    return sum(e.events for e in self.compile_events)

  @property
  def compile_seconds(self) -> float:
    return sum(e.seconds for e in self.compile_events)

  @property
  def padding_waste(self) -> float:
    """The mean fraction of a bucketed call's argument elements that were padding."""
    return self.waste_sum / self.waste_calls if self.waste_calls else 0.0

  def record_call(self, bucket: tuple[Any, ...] | None, waste: float, fallback: bool) -> None:
    """A call ran in `bucket` (None: at exact shapes) with `waste` of padding."""
    self.calls += 1
    if fallback:
      self.fallback_calls += 1
    if bucket is not None:
      self.bucket_hits[bucket] += 1
      self.waste_sum += waste
      self.waste_calls += 1

  def record_compile(self, key: ProgramKey, cause: Cause, log: CompileLog, *,
                     program_name: str, wall_seconds: float) -> None:
    """The program `key` was built for `cause`; `log` holds the compiles measured
    meanwhile in this thread, those of `program_name` being its own."""
    mine = [e for e in log if e.fun_name == program_name]
    self.cache_loads += len(log.cache_loads)
    self.compile_events.append(CompileRecord(
        key, cause, len(mine), sum(e.seconds for e in mine), wall_seconds))

  def record_sizes(self, binding: Binding, leaf_names: Sequence[str],
                   logical: dict[str, int]) -> None:
    for dim, size in logical.items():
      entry = self.dims.get(dim)
      if entry is None:
        entry = self.dims[dim] = DimRecord(_where(binding, leaf_names, dim), SizeRecord())
      entry.sizes.add(size)


def _where(binding: Binding, leaf_names: Sequence[str], dim: str) -> tuple[str, int] | None:
  """(argument name, axis) of the first axis whose size is exactly `dim`."""
  for leaf, name in zip(binding.leaves, leaf_names, strict=True):
    for axis, d in enumerate(leaf.symbolic_shape):
      if _dims.dim_vars(d) == {dim} and _dims.linear_form(d) == ({dim: 1}, 0):
        return name, axis
  return None
