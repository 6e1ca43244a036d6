"""What a `pj.jit` function has done: its calls, and each program it built and why.

Every program is recorded as a `CompileRecord`: its key, its `Cause` (the
first call, an axis that changed and became dynamic, a new bucket, a fallback
to exact shapes, an empty dynamic axis, `precompile`), and the backend compiles
`jax.monitoring` reported for it (`_caching/compiles.py`), so the counts are measured,
never assumed. Every call adds to the bucket it ran in and to the padding it
carried; every logical size of a dimension is kept with the argument axis it
came from. `pj.stats` and `pj.explain` (`diagnostics/_explain.py`) read these
records; nothing here writes text.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Literal, Sequence

from .._masking import dims as _dims
from .._caching.compiles import CompileLog
from .plans import ProgramKey
from .._masking.spec import Binding

CauseKind = Literal["first call", "exact", "bucket", "fallback", "zero size", "precompile"]


@dataclasses.dataclass(frozen=True)
class Cause:
  """Why a program was built.

  `kind` is one of: "first call" (automatic mode compiles the first shapes
  exactly), "exact" (new shapes while no axis is dynamic), "bucket" (new sizes
  in a bucket without a program), "fallback" (exact shapes because `fun`
  cannot be masked; `error` says why), "zero size" (exact shapes because a
  dynamic axis is empty), "precompile" (asked for ahead of time).
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


@dataclasses.dataclass
class DimRecord:
  """The logical sizes a dimension took, and where it first appears."""
  where: tuple[str, int] | None   # (argument name, axis) whose size is exactly the dim
  sizes: set[int]


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
    self._waste_sum = 0.0
    self._waste_calls = 0

  @property
  def compiles(self) -> int:
    return sum(e.events for e in self.compile_events)

  @property
  def compile_seconds(self) -> float:
    return sum(e.seconds for e in self.compile_events)

  @property
  def padding_waste(self) -> float:
    """The mean fraction of a bucketed call's argument elements that were padding."""
    return self._waste_sum / self._waste_calls if self._waste_calls else 0.0

  def record_call(self, bucket: tuple[Any, ...] | None, waste: float, fallback: bool) -> None:
    """A call ran in `bucket` (None: at exact shapes) with `waste` of padding."""
    self.calls += 1
    if fallback:
      self.fallback_calls += 1
    if bucket is not None:
      self.bucket_hits[bucket] += 1
      self._waste_sum += waste
      self._waste_calls += 1

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
        entry = self.dims[dim] = DimRecord(_where(binding, leaf_names, dim), set())
      entry.sizes.add(size)


def _where(binding: Binding, leaf_names: Sequence[str], dim: str) -> tuple[str, int] | None:
  """(argument name, axis) of the first axis whose size is exactly `dim`."""
  for leaf, name in zip(binding.leaves, leaf_names, strict=True):
    for axis, d in enumerate(leaf.symbolic_shape):
      if _dims.dim_vars(d) == {dim} and _dims.linear_form(d) == ({dim: 1}, 0):
        return name, axis
  return None
