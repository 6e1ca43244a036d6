"""`pj.watch`: why do plain `jax.jit` functions recompile in this block?

JAX explains each tracing cache miss when `jax_explain_cache_misses` is on: it
logs which function missed and, against the closest previous call, which
argument had which new type ("* at x, now f32[7,3] and before f32[5,3]").
Inside `watch()` those explanations are captured (and kept out of the user's
log), compile events come from `jax.monitoring`, and both are summed up per
function: compiles, seconds compiling, the axes that varied and over how many
distinct sizes, and the `pj.jit` that would serve them with its compile count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any, Iterable, Iterator

from .. import _jax as jc
from .._jit.bucket_choice import DEFAULT_BUCKETS
from .._buckets.cost_aware import headroom_programs
from .._caching.compiles import CompileEvent, count_compiles
from ._advice import advise


@dataclasses.dataclass
class FunctionReport:
  """What one `jax.jit` function did inside `watch()`."""
  name: str
  defined_at: str = "?"
  compiles: int = 0
  compile_seconds: float = 0.0
  misses: int = 0
  new_objects: int = 0  # "never seen function" misses: the function object is new
  # (argument path, axis) -> distinct sizes seen
  varying: dict[tuple[str, int], set[int]] = dataclasses.field(default_factory=dict)
  signatures: list[dict[tuple[str, int], int]] = dataclasses.field(default_factory=list)

  def pj_jit_compiles(self) -> int:
    """Programs `pj.jit` with its default (cost-aware) buckets would build for
    the same calls: one for the first call's exact shapes, then one per
    headroom bucket, as long as the function is cheap enough that no tighter
    bucket pays for itself (a costly one buys more; `pj.explain` tells)."""
    if not self.varying:
      return min(self.compiles, 1)
    axes = sorted(self.varying)
    calls = [{f"{p}:{a}": sig.get((p, a), 0) for p, a in axes} for sig in self.signatures]
    return 1 + len(headroom_programs(DEFAULT_BUCKETS, calls[1:], seen=calls[0]))

  def suggestion(self) -> str:
    if self.new_objects > 1:
      return (f"jax.jit of a function created {self.new_objects} times at {self.defined_at} "
              "(jit caches per function object: a lambda or functools.partial made in a "
              "loop compiles every time): create the jitted function once, outside the loop")
    if not self.varying:
      return "no axis varied: the recompiles come from elsewhere (dtypes, static arguments)"
    axes = ", ".join(f"`{p}` axis {a}" for p, a in sorted(self.varying))
    verb = "becomes" if len(self.varying) == 1 else "become"
    return f"pj.jit({self.name}) (automatic mode: {axes} {verb} dynamic)"

  def advice(self) -> list[str]:
    return [advise(f"argument `{p}` axis {a}", sizes)
            for (p, a), sizes in sorted(self.varying.items()) if len(sizes) >= 3]


class WatchReport:
  """Per-function recompilation report; `str(report)` is a readable table."""

  def __init__(self) -> None:
    self.functions: dict[str, FunctionReport] = {}

  def __getitem__(self, name: str) -> FunctionReport:
    return self.functions[name]

  def as_dict(self) -> dict[str, dict[str, Any]]:
    return {name: dict(dataclasses.asdict(f), varying={f"{p} axis {a}": sorted(s)
                                                        for (p, a), s in f.varying.items()},
                       pj_jit_compiles=f.pj_jit_compiles(), suggestion=f.suggestion())
            for name, f in self.functions.items()}

  def __str__(self) -> str:
    if not self.functions:
      return "pj.watch: no jax.jit function compiled in the block."
    rows = [("function", "compiles", "compile s", "varying axes (distinct sizes)",
             "compiles with pj.jit")]
    for f in sorted(self.functions.values(), key=lambda f: -f.compile_seconds):
      varying = "; ".join(f"{p} axis {a} ({len(s)})" for (p, a), s in sorted(f.varying.items()))
      if f.new_objects > 1:
        varying = f"re-created {f.new_objects} times"
      rows.append((f.name, str(f.compiles), f"{f.compile_seconds:.2f}", varying or "-",
                   _pj_jit_column(f) if f.varying else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for f in self.functions.values():
      if f.new_objects > 1:
        lines.append(f"{f.name}: {f.suggestion()}.")
      elif f.varying:
        lines.append(f"{f.name} (defined at {f.defined_at}): use {f.suggestion()}.")
        lines.extend(f"  {a}" for a in f.advice())
    return "\n".join(lines)

  # --- building ------------------------------------------------------------

  def _function(self, name: str) -> FunctionReport:
    if name not in self.functions:
      self.functions[name] = FunctionReport(name)
    return self.functions[name]

  def _add_miss(self, message: str) -> None:
    miss = jc.parse_cache_miss(message)
    if miss is None:
      return
    f = self._function(miss.function)
    f.defined_at = _relative(miss.defined_at)
    f.misses += 1
    f.new_objects += miss.never_seen
    signature = dict(f.signatures[-1]) if f.signatures else {}
    for path, now, before in miss.changes:
      if now is None or before is None or len(now) != len(before):
        continue
      for axis, (n, b) in enumerate(zip(now, before, strict=True)):
        if n != b:
          f.varying.setdefault((path, axis), set()).update((n, b))
          for sig in f.signatures:  # calls before the first change had the old size
            sig.setdefault((path, axis), b)
          signature[(path, axis)] = n
    f.signatures.append(signature)

  def _add_compiles(self, events: Iterable[CompileEvent]) -> None:
    for e in events:
      f = self._function(jc.function_of_program(e.fun_name))
      f.compiles += 1
      f.compile_seconds += e.seconds


def _pj_jit_column(f: FunctionReport) -> str:
  n = f.pj_jit_compiles()
  return f"{n} (the first call's shapes + {n - 1} bucket{'s' * (n != 2)})"


def _relative(where: str) -> str:
  """A source location below the working directory, relative to it (reports
  and examples' outputs then hold no machine's absolute paths)."""
  here = os.getcwd() + os.sep
  return where[len(here):] if where.startswith(here) else where


class _Capture(logging.Filter):
  """A logger filter that takes JAX's cache-miss explanations for the report."""

  def __init__(self, report: WatchReport) -> None:
    super().__init__()
    self.report = report

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if jc.is_cache_miss_explanation(message):
      self.report._add_miss(message)
      return False  # captured: not printed
    return True


@contextlib.contextmanager
def watch() -> Iterator[WatchReport]:
  """Observes plain `jax.jit` functions in a block and reports recompiles.

      with pj.watch() as report:
        train()
      print(report)          # a table; report.as_dict() for the data
  """
  report = WatchReport()
  capture = _Capture(report)
  loggers = [logging.getLogger(name) for name in jc.cache_miss_loggers()]
  for lg in loggers:
    lg.addFilter(capture)
  try:
    with jc.explain_cache_misses(), count_compiles() as events:
      yield report
  finally:
    for lg in loggers:
      lg.removeFilter(capture)
  report._add_compiles(events)
