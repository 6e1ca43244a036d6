"""Which `Ragged` arguments of a `pj.vmap` call share their sizes, and the checks.

Tokens and per-token targets built by two `Ragged.from_list` calls have
equal lengths, example by example, and `fun` needs them equal (`x * y`,
`(pred - y) ** 2`): with one variable per argument JAX cannot trace it
(`mul got incompatible shapes: (n0_0, 3), (n1_0, 1)`). A query sequence and
a key sequence may differ (cross attention) and must keep their own sizes.
`pj.vmap` makes two Ragged arguments share their variables exactly when
`fun` needs their lengths equal, and checks on every call that they are:

* **The rule.** Two Ragged arguments with the same number of ragged axes
  share their size variables (all of them: the first one's `n{i}_{j}`) when
  `fun` traces with them shared, and fails with them separate both when the
  first may be the longer and when the second may (`n1_0 >= n0_0 + 1`, and
  the other way, as constraints). The pairs tried are those whose sizes the
  failure names (`(n0_0, 3), (n1_0, 1)`, or a branch 'n0_0 != n1_0' that
  raises); more pairs may follow for more arguments. So `k[:q.shape[0]]`,
  which needs keys at least as long as queries, never makes them equal:
  that would demand more than `fun` does (it fails as it did). Padded sizes
  may differ (the smaller is padded up inside the program). Finding this
  costs up to four extra traces of `fun`, once per argument structure, and
  only where a trace with separate sizes fails.
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
* **The check.** Shared lengths must be equal on every real example, or a
  `pj.ShapeError` names both arguments, the first differing example and its
  two lengths, and what to do. Concrete lengths (an eager call) are
  compared on the host before anything runs. Traced lengths are compared in
  the program: a `lax.cond` whose taken side calls back to the host
  (`jax.pure_callback`) to raise; equal lengths cost one comparison and no
  callback (a few microseconds per call on CPU; `jax.grad`, `jax.vmap` and
  `pj.jit` pass through it). JAX surfaces an error raised in a callback as a
  `JaxRuntimeError` whose message ends with the `pj.ShapeError` text (and
  logs the callback's traceback).
* **Simplest.** Data of the same examples belongs in one `Ragged`:
  `pj.Ragged.from_list([(tok, tgt), ...])` (a pytree per example); its
  leaves share their lengths by construction, with no check and no probe.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking.errors import ShapeError
from .._masking.mask import Masked
from .ragged import Ragged

#: Groups of Ragged arguments (by number) that share their size variables.
Groups: TypeAlias = tuple[tuple[int, ...], ...]

#: Traces `fun` with these groups, constraints and padded sizes: its error, or None.
Probe: TypeAlias = Callable[..., "BaseException | None"]


_DIM_NAME = re.compile(r"\bn(\d+)_(\d+)\b")


def may_share(raggeds: Sequence[Ragged]) -> bool:
  """Whether two of these Ragged arguments could share size variables."""
  ks = [r.ragged_axes for r in raggeds if r.ragged_axes]
  return len(ks) != len(set(ks))


def group_padded(groups: Groups, raggeds: Sequence[Ragged]) -> list[tuple[int, ...]]:
  """The padded sizes each Ragged argument runs at: a group's largest."""
  out: list[Any] = [None] * len(raggeds)
  for g in groups:
    padded = tuple(max(sizes) for sizes in zip(*[raggeds[o].padded_lengths for o in g]))
    for o in g:
      out[o] = padded
  return out




def find_groups(probe: Probe, raggeds: Sequence[Ragged]
                ) -> tuple[Groups, BaseException | None]:
  """The groups of Ragged arguments that share their size variables, and the
  error of the trace with none shared (None when it traced)."""
  groups: Groups = tuple((o,) for o in range(len(raggeds)))
  separate = groups
  first_error: BaseException | None = None
  while may_share(raggeds):
    error = probe(groups)
    if error is None:
      break
    first_error = first_error or error
    pair = next((pair for pair in _suspects(error, groups, raggeds)
                 if _needs_equal(probe, groups, *pair, raggeds)), None)
    if pair is None:  # sharing is not the fix: separate, and the call raises
      groups = separate
      break
    groups = tuple(sorted([g for g in groups if g not in pair]
                          + [tuple(sorted(pair[0] + pair[1]))]))
  return groups, first_error



def _error_chain(error: BaseException) -> list[BaseException]:
  chain: list[BaseException] = []
  seen: set[int] = set()
  current: BaseException | None = error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    chain.append(current)
    current = current.__cause__ or current.__context__
  return chain


def _error_texts(error: BaseException) -> list[str]:
  return [t for e in _error_chain(error)
          for t in [str(e), *getattr(e, "__notes__", ())]]


def _suspects(error: BaseException, groups: Groups, raggeds: Sequence[Ragged]
              ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """Pairs of groups of Ragged arguments (as many ragged axes) whose sizes
  `error`, from tracing `fun` with `groups`, names (`mul got incompatible
  shapes: (n0_0, 3), (n1_0, 1)`, or a note 'n0_0 != n1_0'). An error that
  names fewer than two, with just two such groups: that pair."""
  head = {g[0]: g for g in groups}
  named = sorted({int(m.group(1)) for t in _error_texts(error)
                  for m in _DIM_NAME.finditer(t)})
  hit = [head[i] for i in named if i in head]
  if len(hit) < 2:
    hit = [g for g in groups if raggeds[g[0]].ragged_axes]
    if len(hit) != 2:
      return []
  def k(g: Any) -> Any:
    return raggeds[g[0]].ragged_axes

  return [(a, b) for i, a in enumerate(hit) for b in hit[i + 1:] if k(a) == k(b) and k(a)]


def _needs_equal(probe: Callable[..., BaseException | None], groups: Groups,
                 a: tuple[int, ...], b: tuple[int, ...], raggeds: Sequence[Ragged]) -> bool:
  """Whether `fun` fails when either of groups `a`, `b` is the longer (on
  every ragged axis), so that it needs their lengths equal. A function that
  needs only an order (`k[:q.shape[0]]`: keys at least as long as queries)
  passes one of the two, and its arguments stay separate: equal lengths
  would demand more than it does."""
  padded = group_padded(groups, raggeds)
  top = tuple(max(x, y) for x, y in zip(padded[a[0]], padded[b[0]]))
  for short, long in ((a, b), (b, a)):
    sizes = list(padded)
    for o in short:
      sizes[o] = top
    for o in long:
      sizes[o] = tuple(p + 1 for p in top)
    constraints = [f"n{long[0]}_{j} >= n{short[0]}_{j} + 1" for j in range(len(top))]
    if probe(groups, constraints, sizes) is None:
      return False
  return True


def _names(i: int, shared: list[str]) -> str:
  """The dim names Ragged argument number `i` has when it shares nothing."""
  return ", ".join(f"n{i}_{j}" for j in range(len(shared)))


def _root_cause(error: BaseException) -> str:
  root = _error_chain(error)[-1]
  text = f"{type(root).__name__}: {root}".strip().splitlines()[0]
  where = jc.user_line_of(root)
  return text + (f" (at {where})" if where else "")


class Plan:
  """How one argument structure runs: the masked function, each Ragged
  argument's dim names and padded sizes, and the groups that share them."""

  def __init__(self, masked: Masked, names: list[list[str]], fun_name: str,
               groups: Groups, raggeds: Sequence[Ragged], paths: list[str],
               error: BaseException | None) -> None:
    self.groups = groups
    self.masked, self.names = masked, names
    self.padded = group_padded(groups, raggeds)
    self.paths = paths
    self.shared = [g for g in groups if len(g) > 1]
    self.shares = bool(self.shared)
    self.fun_name = fun_name
    # (sharing only ever follows an error)
    self.reason = _root_cause(error) if self.shares and error is not None else None
    named = [f"{n} is {p} axis {j}" for ns, p in zip(self.names, self.paths)
             for j, n in enumerate(ns)]
    self.note = (f"(pj.vmap names the lengths of the pj.Ragged arguments: "
                 f"{'; '.join(named)}.)" if named else None)

  def mismatch(self, lengths: Sequence[np.ndarray]) -> ShapeError | None:
    """The error for the first example whose shared lengths differ, or None."""
    for g in self.shared:
      a = np.asarray(lengths[g[0]])
      for o in g[1:]:
        b = np.asarray(lengths[o])
        bad = np.flatnonzero(np.any((a != b).reshape(len(a), -1), axis=1))
        if bad.size:
          return self._error(g[0], o, int(bad[0]), a[bad[0]], b[bad[0]])
    return None

  def _error(self, i: int, o: int, row: int, la: Any, lb: Any) -> ShapeError:
    pa, pb = self.paths[i], self.paths[o]
    def show(l: Any) -> str:
      return (f"length {int(l)}" if np.ndim(l) == 0
              else f"lengths {tuple(int(v) for v in l)}")

    return ShapeError(
        f"pj.vmap({self.fun_name}): {pa} and {pb} are pj.Ragged arguments that "
        f"{self.fun_name} needs with equal lengths, example by example, but example "
        f"{row} has {show(la)} in {pa} and {show(lb)} in {pb}.\n"
        f"Why equal: traced with separate lengths ({_names(i, self.names[i])} for {pa}, "
        f"{_names(o, self.names[o])} for {pb}), {self.fun_name} fails: {self.reason}\n"
        "What to do: if both hold data of the same examples (tokens and per-token "
        "targets), make them one pj.Ragged, whose leaves share their lengths: "
        "pj.Ragged.from_list([(tok, tgt), ...]) (or a dict per example); otherwise "
        f"give every example equal lengths in both, or write {self.fun_name} for "
        "different ones.")

  def check_on_host(self, lengths: Sequence[Any]) -> None:
    error = self.mismatch(lengths)
    if error is not None:
      raise error

  def check_in_program(self, lengths: list[Any]) -> list[Any]:
    """The lengths, each shared group's replaced by its first member's after
    a check that they are equal: `lax.cond` on the comparison, whose taken
    side calls back to the host to raise the pj.ShapeError, so equal lengths
    cost one comparison and no callback."""
    if not self.shares:
      return lengths
    heads = [lengths[g[0]] for g in self.shared]
    differ = jnp.any(jnp.stack([jnp.any(lengths[o] != lengths[g[0]])
                                for g in self.shared for o in g[1:]]))

    def host(*values: Any) -> list[np.ndarray]:
      self.check_on_host(values)
      return [np.asarray(values[g[0]]) for g in self.shared]

    def fail(lengths: list[Any]) -> Any:
      # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
      shapes = [jax.ShapeDtypeStruct(h.shape, h.dtype) for h in heads]  # type: ignore[no-untyped-call, unused-ignore]
      return jax.pure_callback(host, shapes, *lengths, vmap_method="sequential")

    checked = lax.cond(differ, fail, lambda lengths: [lengths[g[0]] for g in self.shared],
                       lengths)
    out = list(lengths)
    for g, c in zip(self.shared, checked):
      for o in g:
        out[o] = c
    return out
