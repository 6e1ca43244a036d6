"""Bucket advice: how many programs and how much padding a policy costs.

For the sizes an axis actually took, each candidate policy needs one program
per distinct bucket and wastes `1 - size / bucket` of each call's work. The
advice names the policy in use and an alternative that trades some more
programs for noticeably less padding (or the reverse), with both figures.
"""

from __future__ import annotations

import dataclasses
from typing import Collection, Iterable

from .._buckets import fixed as B

_CANDIDATES = (
    ("powers of two", "pj.buckets.PowersOfTwo()", B.PowersOfTwo()),
    ("geometric buckets, ratio 1.5", "pj.buckets.Geometric(1.5)", B.Geometric(1.5)),
    ("geometric buckets, ratio 1.25", "pj.buckets.Geometric(1.25)", B.Geometric(1.25)),
    ("geometric buckets, ratio 1.1", "pj.buckets.Geometric(1.1)", B.Geometric(1.1)),
)


@dataclasses.dataclass(frozen=True)
class Cost:
  label: str
  code: str
  programs: int
  padding: float  # mean fraction of computed elements that are padding


def cost(policy: B.BucketPolicy, sizes: Iterable[int], label: str = "", code: str = "") -> Cost:
  sizes = list(sizes)
  buckets = [policy.bucket(s) for s in sizes]
  padding = sum(1 - s / b for s, b in zip(sizes, buckets, strict=True)) / len(sizes) if sizes else 0.0
  return Cost(label, code, len(set(buckets)), padding)


def distinct(sizes: Collection[int]) -> str:
  """How many distinct sizes: exact, or "about N" from a bounded sample
  (`_jit/stats.py`'s `SizeRecord` past its limit)."""
  return str(len(sizes)) if getattr(sizes, "exact", True) else f"about {len(sizes)}"


def advise(where: str, sizes: Collection[int], current: B.BucketPolicy | None = None) -> str:
  """One sentence on an axis's sizes, the current cost and a better trade-off.
  `sizes` may be a sample (a `SizeRecord` past its limit): the costs are the
  sample's, the count its estimate."""
  count = distinct(sizes)
  sizes = sorted(set(int(s) for s in sizes))
  current = current or B.PowersOfTwo()
  now = cost(current, sizes, _label(current), "")
  head = (f"{where} took {count} distinct sizes in [{sizes[0]}, {sizes[-1]}]: "
          f"{now.label} need {now.programs} program{'s' * (now.programs != 1)} with "
          f"{now.padding:.0%} mean padding")
  options = [cost(p, sizes, label, code) for label, code, p in _CANDIDATES if p != current]
  better = [c for c in options if c.padding < now.padding * 0.75
            and c.programs <= max(2 * now.programs, now.programs + 4)]
  if better:
    pick = min(better, key=lambda c: (c.padding, c.programs))
    return f"{head}; buckets={pick.code} would need {pick.programs} with {pick.padding:.0%}."
  fewer = [c for c in options if c.programs < now.programs and c.padding < 0.5]
  if fewer:
    pick = min(fewer, key=lambda c: (c.programs, c.padding))
    return f"{head}; buckets={pick.code} would need {pick.programs} with {pick.padding:.0%}."
  return head + "."


def _label(policy: B.BucketPolicy) -> str:
  for label, _, p in _CANDIDATES:
    if p == policy:
      return label
  return f"the buckets {policy!r}"
