"""Automatic mode: learn which axes vary from the calls themselves.

`pj.jit(f)` without `polymorphic_shapes` compiles the first call for its exact
shapes. From then on every axis whose size has changed since the first call
is dynamic; axes whose sizes have been equal in every call so far share one
dimension variable (so `x + y` on two vectors of the same varying length
stays expressible), until a call shows them different. This is partition
refinement over all (leaf, axis) pairs: each call splits the groups by the
sizes it brings, so the specs change at most once per axis.

A dimension variable is named after its first axis, `<argument>_<axis>`
(e.g. `x_0`, `batch_tokens_1`), which is how messages and `precompile` refer
to it.
"""

from __future__ import annotations

import re
from typing import Sequence

from .. import _jax as jc
from .._masking.spec import violated_constraint

Dim = tuple[int, int]  # (leaf index, axis)


def sanitize(text: str) -> str:
  name = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_")
  return name if name and name[0].isalpha() else f"a_{name}"


class DimTracker:
  """Which axes of a call signature vary, and which always agree."""

  def __init__(self, leaf_names: Sequence[str], shapes: Sequence[tuple[int, ...]]):
    self.leaf_names = [sanitize(n) for n in leaf_names]
    self.first = [tuple(s) for s in shapes]
    self.dynamic: set[Dim] = set()
    by_size: dict[int, list[Dim]] = {}
    for leaf, shape in enumerate(self.first):
      for axis, size in enumerate(shape):
        by_size.setdefault(size, []).append((leaf, axis))
    self.groups: list[list[Dim]] = list(by_size.values())

  def observe(self, shapes: Sequence[tuple[int, ...]]) -> bool:
    """Records a call's shapes; True when the specs change."""
    changed = False
    for leaf, shape in enumerate(shapes):
      for axis, size in enumerate(shape):
        if size != self.first[leaf][axis] and (leaf, axis) not in self.dynamic:
          self.dynamic.add((leaf, axis))
          changed = True
    refined: list[list[Dim]] = []
    for group in self.groups:
      parts: dict[int, list[Dim]] = {}
      for leaf, axis in group:
        parts.setdefault(shapes[leaf][axis], []).append((leaf, axis))
      refined.extend(parts.values())
    if len(refined) != len(self.groups):
      changed = True
    self.groups = refined
    return changed

  def force_dynamic(self, names: Sequence[str]) -> bool:
    """Makes the named dimensions dynamic ahead of time (for precompile)."""
    known = {self.name(d): d for g in self.groups for d in g}
    missing = [n for n in names if n not in known]
    if missing:
      raise KeyError(f"unknown dimension names {missing}; the axes are named "
                     f"{sorted(known)}")
    before = set(self.dynamic)
    for n in names:
      group = next(g for g in self.groups if known[n] in g)
      self.dynamic.update(group)
    return self.dynamic != before

  def assume(self, groups: Sequence[Sequence[str]]) -> bool:
    """Makes dynamic the named dimensions that an earlier run of the same
    function learned (`_caching/axes.py`), each listed group one dimension
    variable where the first call's sizes agree; True when any axis became
    dynamic. A name this call structure does not have makes it assume nothing."""
    known = {self.name(d): d for g in self.groups for d in g}
    if any(n not in known for g in groups for n in g):
      return False
    label = {known[n]: i for i, g in enumerate(groups) for n in g}
    refined: list[list[Dim]] = []
    for group in self.groups:  # split each group by the remembered groups (order kept)
      parts: dict[int, list[Dim]] = {}
      for d in group:
        parts.setdefault(label.get(d, -1), []).append(d)
      refined.extend(parts.values())
    self.groups = refined
    before = set(self.dynamic)
    self.dynamic.update(label)
    return self.dynamic != before

  def dynamic_groups(self) -> list[list[str]]:
    """The dynamic dimensions by name, grouped as they share a variable."""
    return [[self.name(d) for d in g if d in self.dynamic]
            for g in self.groups if any(d in self.dynamic for d in g)]

  def name(self, dim: Dim) -> str:
    leaf, axis = dim
    return f"{self.leaf_names[leaf]}_{axis}"

  def symbol(self, dim: Dim) -> str | None:
    """The dimension variable of an axis, or None if the axis is fixed."""
    if dim not in self.dynamic:
      return None
    group = next(g for g in self.groups if dim in g)
    return self.name(group[0])

  def specs(self) -> list[str | None]:
    """One spec per leaf, in `pj.mask` syntax ("_" for fixed axes)."""
    out: list[str | None] = []
    for leaf, shape in enumerate(self.first):
      symbols = [self.symbol((leaf, axis)) for axis in range(len(shape))]
      if not any(symbols):
        out.append(None)
      else:
        out.append("(" + ", ".join(s or "_" for s in symbols) + ("," if len(symbols) == 1 else "") + ")")
    return out

  @property
  def any_dynamic(self) -> bool:
    return bool(self.dynamic)


# --- fitting buckets to constraints --------------------------------------------

def fit_to_constraints(logical: dict[str, int], padded: dict[str, int],
                       scope: jc.SymbolicScope) -> dict[str, int]:
  """Padded sizes, lowered where needed so that the constraints hold.

  Each dimension in turn gets the largest size between its logical and its
  bucket size that satisfies the constraints (bisection); if that is not
  enough, the logical sizes themselves (which satisfy them) are used.
  """
  env = dict(padded)
  if violated_constraint(env, scope) is None:
    return env
  for var in sorted(env):
    lo, hi = logical[var], env[var]
    env[var] = lo
    if violated_constraint(env, scope) is not None:
      continue
    while lo < hi:
      mid = (lo + hi + 1) // 2
      env[var] = mid
      lo, hi = (mid, hi) if violated_constraint(env, scope) is None else (lo, mid - 1)
    env[var] = lo
  return env if violated_constraint(env, scope) is None else dict(logical)
