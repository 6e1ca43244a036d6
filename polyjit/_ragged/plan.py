"""How one argument structure of a `pj.vmap` call runs, and the length check.

`sharing.py` decides, once per argument structure, which Ragged arguments
share their size variables; a `Plan` holds what follows from it: the masked
function, each Ragged argument's dim names and padded sizes, and the check
that shared lengths are equal on every call.

Shared lengths must be equal on every real example, or a `pj.ShapeError`
names both arguments, the first differing example and its two lengths, and
what to do. Concrete lengths (an eager call) are compared on the host before
anything runs. Traced lengths are compared in the program: a `lax.cond` whose
taken side calls back to the host (`jax.pure_callback`) to raise; equal
lengths cost one comparison and no callback (a few microseconds per call on
CPU; `jax.grad`, `jax.vmap` and `pj.jit` pass through it). JAX surfaces an
error raised in a callback as a `JaxRuntimeError` whose message ends with the
`pj.ShapeError` text (and logs the callback's traceback).

Simplest: data of the same examples belongs in one `Ragged`:
`pj.Ragged.from_list([(tok, tgt), ...])` (a pytree per example); its leaves
share their lengths by construction, with no check and no probe.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking import size_range as _size_range, spec as _spec
from .._masking.errors import ShapeError
from .._masking.mask import Masked
from .ragged import Ragged
from .sharing import Groups, group_padded
from . import bounds as _bounds


def _error_chain(error: BaseException) -> list[BaseException]:
  chain: list[BaseException] = []
  seen: set[int] = set()
  current: BaseException | None = error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    chain.append(current)
    current = current.__cause__ or current.__context__
  return chain


def _names(i: int, shared: list[str]) -> str:
  """The dim names Ragged argument number `i` has when it shares nothing."""
  return ", ".join(f"n{i}_{j}" for j in range(len(shared)))


def _root_cause(error: BaseException) -> str:
  """The first line of what failed first, and where in the user's code: shown
  in the error message only (it decides nothing)."""
  root = _error_chain(error)[-1]
  text = f"{type(root).__name__}: {root}".strip().splitlines()[0]
  where = jc.user_line_of(root)
  return text + (f" (at {where})" if where else "")


class Plan:
  """How one argument structure runs: the masked function, each Ragged
  argument's dim names and padded sizes, and the groups that share them."""

  def __init__(self, masked: Masked, names: list[list[str]], fun_name: str,
               groups: Groups, raggeds: Sequence[Ragged], paths: list[str],
               error: BaseException | None, learned: tuple[str, ...] = (),
               learned_from: BaseException | None = None) -> None:
    self.groups = groups
    #: constraints on the lengths learned from `fun` (`bounds.py`), and what
    #: `fun` raises where they fail
    self.learned = learned
    self.learned_from = _root_cause(learned_from) if learned_from is not None else None
    self.masked, self.names = masked, names
    self.padded = group_padded(groups, raggeds)
    self.paths = paths
    self.shared = [g for g in groups if len(g) > 1]
    self.shares = bool(self.shared)
    self.fun_name = fun_name
    # (sharing only ever follows an error)
    self.reason = _root_cause(error) if self.shares and error is not None else None
    named = [f"{n} is {p} axis {j}" for ns, p in zip(self.names, self.paths, strict=True)
             for j, n in enumerate(ns)]
    self.note = (f"(pj.vmap names the lengths of the pj.Ragged arguments: "
                 f"{'; '.join(named)}.)" if named else None)

  def mismatch(self, lengths: Sequence[np.ndarray], examples: Any = None
               ) -> ShapeError | None:
    """The error for the first example whose shared lengths differ, or None.

    `examples` (None: the rows themselves) is each row's index in the user's
    batch: a grouped batch runs its blocks longest first, so that row i of a
    block is example `examples[i]` of the list the batch was built from."""
    index = None if examples is None else np.asarray(examples)
    for g in self.shared:
      a = np.asarray(lengths[g[0]])
      for o in g[1:]:
        b = np.asarray(lengths[o])
        bad = np.flatnonzero(np.any((a != b).reshape(len(a), -1), axis=1))
        if bad.size:
          row = int(bad[0] if index is None else bad[np.argmin(index[bad])])
          example = row if index is None else int(index[row])
          return self._error(g[0], o, example, a[row], b[row])
    return None

  def _error(self, i: int, o: int, example: int, la: Any, lb: Any) -> ShapeError:
    pa, pb = self.paths[i], self.paths[o]
    def show(l: Any) -> str:
      return (f"length {int(l)}" if np.ndim(l) == 0
              else f"lengths {tuple(int(v) for v in l)}")

    return ShapeError(
        f"pj.vmap({self.fun_name}): {pa} and {pb} are pj.Ragged arguments that "
        f"{self.fun_name} needs with equal lengths, example by example, but example "
        f"{example} has {show(la)} in {pa} and {show(lb)} in {pb}.\n"
        f"Why equal: traced with separate lengths ({_names(i, self.names[i])} for {pa}, "
        f"{_names(o, self.names[o])} for {pb}), {self.fun_name} fails: {self.reason}\n"
        "What to do: if both hold data of the same examples (tokens and per-token "
        "targets), make them one pj.Ragged, whose leaves share their lengths: "
        "pj.Ragged.from_list([(tok, tgt), ...]) (or a dict per example); otherwise "
        f"give every example equal lengths in both, or write {self.fun_name} for "
        "different ones.")

  def check_on_host(self, lengths: Sequence[Any], examples: Any = None) -> None:
    error = self.mismatch(lengths, examples)
    if error is not None:
      raise error

  def check_bounds(self, lengths: Sequence[Any], examples: Any = None) -> None:
    """Raises for the first example whose lengths break a learned bound."""
    _bounds.check(self.fun_name, self.names, self.paths, lengths, self.learned,
                  self.learned_from, examples)

  def check_bounds_in_program(self, lengths: list[Any], examples: Any = None) -> list[Any]:
    """The lengths, after a check that every example keeps the learned bounds
    (`bounds.py`): as `check_in_program`, a `lax.cond` whose taken side calls
    back to the host to raise the pj.ShapeError (grouped batches, and lengths
    traced by the caller's own `jax.jit`, get no host check before)."""
    if not self.learned:
      return lengths
    env: dict[str, Any] = {}
    for ns, ls in zip(self.names, lengths, strict=True):
      env.update({n: (ls if len(ns) == 1 and jnp.ndim(ls) == 1 else ls[:, j])
                  for j, n in enumerate(ns)})
    hold = _size_range.constraints_hold(env, _spec.make_scope(self.learned))
    broken = jnp.any(~hold)
    n = len(lengths)

    def host(*values: Any) -> list[np.ndarray]:
      self.check_bounds(values[:n], None if examples is None else values[n])
      return [np.asarray(v) for v in values[:n]]

    def fail(lengths: list[Any]) -> Any:
      # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
      shapes = [jax.ShapeDtypeStruct(jnp.shape(l), jnp.result_type(l)) for l in lengths]  # type: ignore[no-untyped-call, unused-ignore]
      extra = [] if examples is None else [examples]
      return jax.pure_callback(host, shapes, *lengths, *extra, vmap_method="sequential")

    return list(lax.cond(broken, fail, lambda lengths: list(lengths), list(lengths)))

  def check_in_program(self, lengths: list[Any], examples: Any = None) -> list[Any]:
    """The lengths, each shared group's replaced by its first member's after
    a check that they are equal: `lax.cond` on the comparison, whose taken
    side calls back to the host to raise the pj.ShapeError, so equal lengths
    cost one comparison and no callback. `examples`: see `mismatch` (an int32
    array of one index per row, traced or not)."""
    if not self.shares:
      return lengths
    heads = [lengths[g[0]] for g in self.shared]
    differ = jnp.any(jnp.stack([jnp.any(lengths[o] != lengths[g[0]])
                                for g in self.shared for o in g[1:]]))

    n = len(lengths)

    def host(*values: Any) -> list[np.ndarray]:
      self.check_on_host(values[:n], None if examples is None else values[n])
      return [np.asarray(values[g[0]]) for g in self.shared]

    def fail(lengths: list[Any]) -> Any:
      # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
      shapes = [jax.ShapeDtypeStruct(h.shape, h.dtype) for h in heads]  # type: ignore[no-untyped-call, unused-ignore]
      extra = [] if examples is None else [examples]
      return jax.pure_callback(host, shapes, *lengths, *extra, vmap_method="sequential")

    checked = lax.cond(differ, fail, lambda lengths: [lengths[g[0]] for g in self.shared],
                       lengths)
    out = list(lengths)
    for g, c in zip(self.shared, checked, strict=True):
      for o in g:
        out[o] = c
    return out
