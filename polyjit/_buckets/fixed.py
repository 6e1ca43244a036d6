"""Bucket policies: which padded size serves a given logical size.

A policy maps a logical size to the padded size of its bucket; every size in a
bucket shares one compiled program. Powers of two (`pj.Ragged.from_list`'s
default) keep the number of programs at about log2(largest / smallest) + 1;
`steps=k` puts k - 1 more sizes in each octave; a geometric ratio below 2
trades more programs for less padding; multiples of k and explicit lists fit
known distributions. Above the largest bucket a policy either compiles the
exact size (`overflow="exact"`) or raises `ShapeError` (`overflow="raise"`).

These policies are fixed: a size always gets the same bucket. `CostAware`
(`_buckets/cost_aware.py`, `pj.jit`'s default) decides from estimated compile and run
times which of its grid's buckets to compile, and `fit` (`_buckets/fit.py`) plans
buckets from a sample of sizes.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Callable, Sequence, TypeAlias

from .._masking.errors import ShapeError

_OVERFLOW = ("exact", "raise")


class BucketPolicy:
  """Maps a logical size to a padded size >= it. Subclasses define `_bucket`."""

  minimum: int = 1
  maximum: int | None = None
  overflow: str = "exact"

  def __call__(self, size: int) -> int:
    return self.bucket(size)

  def bucket(self, size: int) -> int:
    size = int(size)
    if size < 0:
      raise ShapeError(f"a size must be >= 0, got {size}")
    if self.maximum is not None and size > self.maximum:
      if self.overflow == "raise":
        raise ShapeError(
            f"size {size} is above the largest bucket ({self.maximum}) of {self!r}; "
            "raise `maximum`, or use overflow='exact' to compile such sizes exactly.")
      return size
    return max(self._bucket(max(size, self.minimum)), size)

  def _bucket(self, size: int) -> int:
    raise NotImplementedError

  def sizes(self, low: int, high: int) -> list[int]:
    """Every bucket that serves some size in [low, high], ascending."""
    out, size = [], max(int(low), 0)
    while size <= high:
      b = self.bucket(size)
      out.append(b)
      size = b + 1
    return out

  def _check(self) -> None:
    if self.overflow not in _OVERFLOW:
      raise ValueError(f"overflow must be one of {_OVERFLOW}, got {self.overflow!r}")
    if self.minimum < 1:
      raise ValueError(f"minimum must be >= 1, got {self.minimum}")
    if self.maximum is not None and self.maximum < self.minimum:
      raise ValueError(f"maximum {self.maximum} is below minimum {self.minimum}")


@dataclasses.dataclass(frozen=True)
class PowersOfTwo(BucketPolicy):
  """The next power of two, at least `minimum`; with `steps=k`, also `k - 1`
  evenly spaced sizes between consecutive powers of two (`steps=4`: 32, 40,
  48, 56, 64, 80, ...: at most 25% padding, and every power of two kept)."""
  minimum: int = 16
  maximum: int | None = None
  overflow: str = "exact"
  steps: int = 1

  def __post_init__(self) -> None:
    self._check()
    if self.steps < 1:
      raise ValueError(f"steps must be >= 1, got {self.steps}")

  def _bucket(self, size: int) -> int:
    power = 1 << max(size - 1, 0).bit_length()
    half = power // 2
    if self.steps == 1 or half < self.steps:
      return power
    step = half // self.steps  # exact: both are powers of two
    return half + -(-(size - half) // step) * step


@dataclasses.dataclass(frozen=True)
class Geometric(BucketPolicy):
  """Sizes `minimum * ratio**k`, rounded up to a multiple of `align`."""
  ratio: float = 1.5
  minimum: int = 16
  maximum: int | None = None
  overflow: str = "exact"
  align: int = 8

  def __post_init__(self) -> None:
    self._check()
    if not self.ratio > 1:
      raise ValueError(f"ratio must be > 1, got {self.ratio}")

  def _bucket(self, size: int) -> int:
    k = max(0, math.ceil(math.log(size / self.minimum, self.ratio) - 1e-9))
    while True:
      b = _round_up(math.ceil(self.minimum * self.ratio ** k), self.align)
      if b >= size:
        return b
      k += 1


@dataclasses.dataclass(frozen=True)
class Multiples(BucketPolicy):
  """The next multiple of `k`."""
  k: int = 64
  minimum: int = 1
  maximum: int | None = None
  overflow: str = "exact"

  def __post_init__(self) -> None:
    self._check()
    if self.k < 1:
      raise ValueError(f"k must be >= 1, got {self.k}")

  def _bucket(self, size: int) -> int:
    return _round_up(size, self.k)


@dataclasses.dataclass(frozen=True)
class Explicit(BucketPolicy):
  """The smallest of the given sizes that fits; above the largest, `overflow`."""
  buckets: tuple[int, ...] = ()
  overflow: str = "exact"

  def __post_init__(self) -> None:
    object.__setattr__(self, "buckets", tuple(sorted({int(b) for b in self.buckets})))
    if not self.buckets or self.buckets[0] < 1:
      raise ValueError(f"explicit buckets must be positive sizes, got {self.buckets}")
    self._check()

  @property
  def minimum(self) -> int:  # type: ignore[override]
    return 1

  @property
  def maximum(self) -> int:  # type: ignore[override]
    return self.buckets[-1]

  def _bucket(self, size: int) -> int:
    return self.buckets[bisect.bisect_left(self.buckets, size)]


@dataclasses.dataclass(frozen=True)
class Exact(BucketPolicy):
  """No padding: every size is its own bucket (what jax.jit does)."""

  def _bucket(self, size: int) -> int:
    return size


def _round_up(x: int, k: int) -> int:
  return -(-x // k) * k


#: What `buckets=` takes for one padded size: a policy, an int k (multiples of
#: k), a sequence of sizes (explicit buckets), a callable size -> padded size,
#: or None (the default: `pj.jit`'s cost-aware policy, `pj.Ragged.from_list`'s
#: powers of two from 16). See `as_policy`.
BucketSpec: TypeAlias = "BucketPolicy | int | Sequence[int] | Callable[[int], int] | None"

#: `pj.jit`'s `buckets=`: one `BucketSpec` for every dimension, or a dict from
#: dimension name to its `BucketSpec` ("*" for the dimensions not named).
PerDimBucketSpec: TypeAlias = "BucketSpec | dict[str, BucketSpec]"


def default() -> BucketPolicy:
  """The stateless default (powers of two from 16): `pj.Ragged.from_list`'s,
  and `as_policy(None)`'s. `pj.jit`'s default is `CostAware()` (`_buckets/cost_aware.py`),
  which this module cannot import."""
  return PowersOfTwo()


def as_policy(spec: object) -> BucketPolicy:
  """A policy from what users pass as `buckets=`.

  None: the stateless default (powers of two from 16; `pj.jit` maps None to
  `CostAware()` itself); a policy; a sequence of sizes
  (explicit buckets); an int k (multiples of k); a callable size -> padded size.
  """
  if spec is None:
    return default()
  if isinstance(spec, BucketPolicy):
    return spec
  if isinstance(spec, bool):
    raise TypeError("buckets must be a policy, a list of sizes, an int or a callable")
  if isinstance(spec, int):
    return Multiples(spec)
  if isinstance(spec, Sequence) and not isinstance(spec, str):
    return Explicit(tuple(spec))
  if callable(spec):
    return _Callable(spec)
  raise TypeError(f"cannot use {spec!r} as a bucket policy: give a polyjit.buckets "
                  "policy, a list of sizes, an int k (multiples of k) or a callable")


@dataclasses.dataclass(frozen=True)
class _Callable(BucketPolicy):
  fn: Callable[[int], int] = int

  def _bucket(self, size: int) -> int:
    b = int(self.fn(size))
    if b < size:
      raise ShapeError(f"the bucket function {self.fn!r} gave {b} for size {size}; "
                       "a bucket must be at least the size it serves")
    return b
