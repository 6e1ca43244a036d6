"""Bounds on the lengths that `fun` needs, learned by `pj.vmap` from `fun`.

`lax.top_k(x, 3)` needs `n >= 3`, `lax.dynamic_slice(x, (i,), (2,))` needs
`n >= 2`, `dynamic_update_slice(x, u, ...)` needs x at least as long as u:
JAX's shape rules ask these comparisons, and polyjit traces each side
(`_masking/variants.py`). With concrete sizes (`pj.jit`) only the side the
sizes are on is traced, so `pj.jit` masks every size where `fun` works and
runs the others as `jax.jit` does (raising there). `pj.vmap` runs every
example of a batch in one program with traced lengths, where every side up
to the padded length must trace; the side where `fun` fails used to refuse
the whole call.

Learned, not declared
---------------------
Where the only failing sides are ones a single constraint excludes (the
error's `exclude_with`: 'n0_0 >= 3', 'n0_0 >= n1_0'), `pj.vmap` traces `fun`
again with that constraint, and keeps it for the argument structure (`learn`:
up to `MAX_LEARNED` of them). Like the sharing of sizes (`sharing.py`) it is
decided from `fun`, not from a batch: the excluded lengths are those where
`fun`'s trace fails, as `jax.jit` of `fun` fails on such an example (as a
rule: a side whose symbolic trace fails although `fun` works at its concrete
lengths is refused, never computed wrongly). So one program serves every
batch, whatever its shortest example. A batch that has an example on the
excluded side fails with a `pj.ShapeError` that names the example, its
lengths, the bound and the error `fun` gives there (`check`): with concrete
lengths on the host, before anything runs; with lengths the caller's own
`jax.jit` traces, and for grouped batches, in the program, as the check of
shared lengths does (`plan.py`: a `lax.cond` whose taken side calls back to
the host to raise; JAX wraps it in a `JaxRuntimeError`). The masked function
also carries the bounds as its constraints, so outputs computed at lengths
that break them would be poisoned (`_masking/size_range.py`), never wrong.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .._masking import spec as _spec
from .._masking.errors import ShapeError

#: Constraints learned for one argument structure before giving up.
MAX_LEARNED = 8


def learn(probe: Callable[[tuple[str, ...]], BaseException | None],
          constraints: tuple[str, ...] = ()) -> tuple[tuple[str, ...], BaseException | None]:
  """(the constraints learned, None) when `probe` (a trace of `fun` with the
  given constraints: its error or None) traces with them added; else ((), the
  error of the trace with `constraints` alone)."""
  learned: list[str] = []
  first = None
  while True:
    error = probe(constraints + tuple(learned))
    if error is None:
      return tuple(learned), None
    first = first or error
    exclude = getattr(error, "exclude_with", None)
    if exclude is None or exclude in learned or len(learned) >= MAX_LEARNED:
      return (), first
    learned.append(exclude)


def check(fun_name: str, names: Sequence[Sequence[str]], paths: Sequence[str],
          lengths: Sequence[np.ndarray], learned: tuple[str, ...], why: str | None,
          examples: Any = None) -> None:
  """Raises a ShapeError for the first example whose concrete lengths violate
  a learned constraint. `lengths`: per Ragged argument, one row per example
  (padded-out rows already row 0's); `examples`: see `Plan.mismatch`."""
  if not learned:
    return
  scope = _spec.make_scope(learned)
  rows = len(np.asarray(lengths[0]))
  order = range(rows) if examples is None else np.argsort(np.asarray(examples), kind="stable")
  for row in order:
    sizes: dict[str, int] = {}
    for ns, ls in zip(names, lengths, strict=True):
      values = np.asarray(ls)[row].reshape(-1)
      sizes.update({n: int(v) for n, v in zip(ns, values, strict=True)})
    broken = _spec.violated_constraint(sizes, scope)
    if broken is None:
      continue
    example = int(row) if examples is None else int(np.asarray(examples)[row])
    shown = "; ".join(f"{n} = {sizes[n]} ({p} axis {j})"
                      for ns, p in zip(names, paths, strict=True) for j, n in enumerate(ns))
    raise ShapeError(
        f"pj.vmap({fun_name}): example {example} has lengths {shown}, where {fun_name} "
        f"fails: traced at such lengths it raises {why or 'an error'}. pj.vmap runs "
        f"every example in one program, and learned from {fun_name} that it needs "
        f"'{broken}'; this example does not satisfy it.\nWhat to do: leave out (or "
        f"lengthen) the examples that break '{broken}' (jax.jit of {fun_name} on such "
        f"an example fails too, as a rule), or make {fun_name} work at those lengths.")
