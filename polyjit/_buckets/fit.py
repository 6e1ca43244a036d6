"""`pj.buckets.fit`: the best buckets for a known sample of sizes.

For users who know their distribution (a data set, a server's traffic log),
the buckets can be planned ahead: at most `max_programs` programs, chosen to
minimise the expected padded cost of the sample. A size runs in the smallest
bucket that holds it, and costs `bucket ** power` (1: linear work, 2:
attention-like). Every optimal bucket is one of the sample's sizes (lowering a
bucket to the largest size it serves only saves), so the problem is a
partition of the sorted distinct sizes into at most `max_programs` runs, each
served by its largest size: dynamic programming over that sorted list,
O(max_programs * m^2) with m distinct sizes, vectorised over one index.

Then `f.precompile(example, sizes={"n": sample})` compiles exactly those
buckets, and with `pj.enable_persistent_cache()` a second process loads them
instead of compiling anything.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .fixed import Explicit

MAX_DISTINCT = 4096  # more distinct sizes are first rounded up onto a fine grid


def fit(sizes: Iterable[int], max_programs: int, *, power: float = 1.0, align: int = 1,
        overflow: str = "exact") -> Explicit:
  """Explicit buckets for `sizes` (a sample, repeats counting as weight) with
  at most `max_programs` programs, minimising the sample's total padded cost
  `sum(bucket(size) ** power)`. Buckets are rounded up to multiples of
  `align`; sizes above the largest bucket follow `overflow`."""
  if max_programs < 1:
    raise ValueError(f"max_programs must be >= 1, got {max_programs}")
  if align < 1:
    raise ValueError(f"align must be >= 1, got {align}")
  data = np.asarray(list(sizes), dtype=np.int64)
  if data.size == 0 or int(np.min(data)) < 1:
    raise ValueError("fit needs a non-empty sample of sizes >= 1")
  data = -(-data // align) * align
  values, counts = np.unique(data, return_counts=True)
  if len(values) > MAX_DISTINCT:  # coarsen: round up onto a geometric grid
    grid = np.unique(np.ceil(np.geomspace(values[0], values[-1], MAX_DISTINCT) / align)
                     .astype(np.int64) * align)
    values, counts = np.unique(grid[np.searchsorted(grid, values)], return_counts=True)
  return Explicit(tuple(int(b) for b in _partition(values, counts, max_programs, power)),
                  overflow=overflow)


def _partition(values: np.ndarray, counts: np.ndarray, k: int, power: float) -> list[int]:
  """The buckets (a subset of `values`, the largest included) minimising
  sum(count * bucket ** power) with at most `k` buckets."""
  m = len(values)
  k = min(k, m)
  weight = values.astype(np.float64) ** power
  prefix = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)
  # best[i]: the least cost of the first i sizes; choice[j][i]: where the last run starts
  best = prefix[1:] * weight           # one run: everything in bucket values[i-1]
  best = np.concatenate([[0.0], best])
  choices = []
  for _ in range(1, k):
    new = best.copy()
    choice = np.zeros(m + 1, dtype=np.int64)
    for i in range(2, m + 1):
      starts = np.arange(1, i)         # the last run is values[a:i], a >= 1
      costs = best[starts] + (prefix[i] - prefix[starts]) * weight[i - 1]
      a = int(np.argmin(costs))
      if costs[a] < new[i]:
        new[i], choice[i] = costs[a], starts[a]
    choices.append(choice)
    best = new
  buckets, i = [], m
  for choice in reversed(choices):   # round r allows r + 2 runs
    if choice[i] > 0:                # else: that round kept the previous solution
      buckets.append(int(values[i - 1]))
      i = int(choice[i])
  buckets.append(int(values[i - 1]))  # the first run: values[0:i]
  return sorted(buckets)
