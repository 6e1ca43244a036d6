"""Which `Ragged` arguments of a `pj.vmap` call share their size variables.

Tokens and per-token targets built by two `Ragged.from_list` calls have
equal lengths, example by example, and `fun` needs them equal (`x * y`,
`(pred - y) ** 2`): with one variable per argument JAX cannot trace it
(`mul got incompatible shapes: (n0_0, 3), (n1_0, 1)`). A query sequence and
a key sequence may differ (cross attention) and must keep their own sizes.
`pj.vmap` makes Ragged arguments share their variables exactly when `fun`
needs their lengths equal (`plan.py` then checks on every call that they
are):

* **The rule.** Ragged arguments with the same number of ragged axes share
  their size variables (all of them: the first one's `n{i}_{j}`) when `fun`
  cannot be traced with them apart: neither with the first longer than the
  second on every ragged axis, nor the other way (`n1_0 >= n0_0 + 1` as a
  constraint). So `k[:q.shape[0]]`, which needs keys at least as long as
  queries, never makes them equal: that would demand more than `fun` does
  (it fails as it did). Padded sizes may differ (the smaller is padded up
  inside the program).
* **Decided by tracing, never by reading an error.** Only whether a trace
  of `fun` succeeds counts, not what a failure says: JAX's wording, and
  which sizes a message happens to name, decide nothing. The search goes
  from the most sharing to the least. Nothing is probed when `fun` traces
  with every argument apart (one trace: the common case), or when it fails
  with every candidate sharing too (sharing is not the fix: the call then
  raises `fun`'s own error). Otherwise, starting from one group per number
  of ragged axes, a group is split in two whenever `fun` traces with one
  half longer than the other (the halves keep that order, and so every
  later trace keeps the orders found before: each group of a kind is
  strictly longer than the one before it). A group no split of which
  traces is one whose members `fun` needs equal. For two arguments that is
  at most four traces; for m arguments of one kind whose lengths must all
  be equal, 2 * (2**(m-1) - 1) splits are tried. It happens once per
  argument structure, and only where a trace with separate sizes fails.
* **Why from `fun`, not from the data.** Whether `fun` needs equal lengths
  is a property of `fun`, the same for every batch: one program per
  argument structure, concrete and traced lengths alike, and a batch whose
  lengths happen to agree never changes how another batch runs. Deciding
  from the lengths of the call (share when equal) would give traced lengths
  (`jax.jit(jax.grad(loss))(params, tokens, targets)`, the common case)
  nothing to decide on; sharing whenever the padded shapes agree would
  break queries and keys of one bucket. As with a Python loop over the
  unpadded examples, every batch `fun` accepts runs, and a batch fails (a
  `pj.ShapeError`) exactly when some example would fail `fun` itself.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence, TypeAlias

from .ragged import Ragged

#: Groups of Ragged arguments (by number) that share their size variables.
Groups: TypeAlias = tuple[tuple[int, ...], ...]

#: Traces `fun` with these groups, constraints and padded sizes (one per Ragged
#: argument): its error, or None when it traced.
Probe: TypeAlias = Callable[[Groups, Sequence[str], Sequence[tuple[int, ...]]],
                            "BaseException | None"]


def may_share(raggeds: Sequence[Ragged]) -> bool:
  """Whether two of these Ragged arguments could share size variables."""
  ks = [r.ragged_axes for r in raggeds if r.ragged_axes]
  return len(ks) != len(set(ks))


def group_padded(groups: Groups, raggeds: Sequence[Ragged]) -> list[tuple[int, ...]]:
  """The padded sizes each Ragged argument runs at: a group's largest."""
  out: list[Any] = [None] * len(raggeds)
  for g in groups:
    padded = tuple(max(sizes) for sizes in zip(*[raggeds[o].padded_lengths for o in g],
                                               strict=True))
    for o in g:
      out[o] = padded
  return out


def find_groups(probe: Probe, raggeds: Sequence[Ragged]
                ) -> tuple[Groups, BaseException | None]:
  """The groups of Ragged arguments that share their size variables, and the
  error of the trace with none shared (None when it traced or was not needed)."""
  separate: Groups = tuple((o,) for o in range(len(raggeds)))
  if not may_share(raggeds):
    return separate, None
  error = probe(separate, (), group_padded(separate, raggeds))
  if error is None:
    return separate, None
  chains = _Chains(raggeds)
  if not chains.traces(probe):   # not even the most sharing traces: not the fix
    return separate, error
  pending = [chain[0] for chain in chains.chains]
  while pending:
    group = pending.pop()
    halves = chains.split(probe, group)
    pending.extend(half for half in halves if len(half) > 1)
  return chains.groups(), error


class _Chains:
  """The search's state: per number of ragged axes, its groups ordered from
  the shortest to the longest (each strictly longer than the one before on
  every ragged axis); the Ragged arguments with a number of axes no other
  has (or none) are apart."""

  def __init__(self, raggeds: Sequence[Ragged]) -> None:
    self.raggeds = raggeds
    by_k: dict[int, list[int]] = {}
    for o, r in enumerate(raggeds):
      if r.ragged_axes:
        by_k.setdefault(r.ragged_axes, []).append(o)
    #: one chain per kind with two or more members; it starts as one group
    self.chains: list[list[tuple[int, ...]]] = [[tuple(m)] for m in by_k.values()
                                                if len(m) > 1]
    chained = {o for chain in self.chains for g in chain for o in g}
    self.apart: list[tuple[int, ...]] = [(o,) for o in range(len(raggeds))
                                         if o not in chained]

  def groups(self) -> Groups:
    return tuple(sorted([*self.apart, *(g for chain in self.chains for g in chain)]))

  def traces(self, probe: Probe) -> bool:
    """Whether `fun` traces with these groups, each longer than the one before."""
    groups = self.groups()
    padded = group_padded(groups, self.raggeds)
    constraints: list[str] = []
    for chain in self.chains:
      k = self.raggeds[chain[0][0]].ragged_axes
      top = [max(padded[o][j] for g in chain for o in g) for j in range(k)]
      for rank, g in enumerate(chain):
        for o in g:  # room for every group to be longer than the one before
          padded[o] = tuple(t + rank for t in top)
      # (consecutive pairs: the constraints are the chain's order, shifted by one)
      for shorter, longer in zip(chain[:-1], chain[1:], strict=True):
        constraints += [f"n{longer[0]}_{j} >= n{shorter[0]}_{j} + 1" for j in range(k)]
    return probe(groups, constraints, padded) is None

  def split(self, probe: Probe, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Splits `group` in two halves, the shorter first in its chain, at the
    first split (and order) with which `fun` traces: the halves, or () when
    none traces (`fun` needs the lengths of `group` equal)."""
    chain = next(c for c in self.chains if group in c)
    at = chain.index(group)
    for a, b in _halves(group):
      for shorter, longer in ((a, b), (b, a)):
        chain[at:at + 1] = [shorter, longer]
        if self.traces(probe):
          return shorter, longer
        chain[at:at + 2] = [group]
    return ()


def _halves(group: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """Every way to split `group` in two non-empty halves (each once), the
  smaller half first: one argument apart before two."""
  out = []
  for size in range(1, len(group) // 2 + 1):
    for part in itertools.combinations(group, size):
      if size * 2 == len(group) and group[0] not in part:
        continue  # (an even split is listed once: from the half holding group[0])
      out.append((part, tuple(o for o in group if o not in part)))
  return out
