"""Counting compiles with `jax.monitoring`.

JAX reports each XLA backend compile as a duration event
(`_jax.BACKEND_COMPILE_EVENT`), tagged with the function name. The same
event also wraps a load from the persistent compilation cache, which JAX
announces just before, in the same thread, with another event
(`_jax.CACHE_HIT_EVENT`): such loads are recorded apart
(`CompileLog.cache_loads`), since nothing was compiled; so are the programs
polyjit loads from its own on-disk cache (`record_load`, called by
`_caching/disk.py`, as no JAX event announces them). One listener pair is
registered for the process (listeners cannot be scoped); it forwards events to
the recorders active at that moment.

It sits below both of its users: `pj.jit` measures what each program it builds
cost (`_jit/stats.py`), and `pj.diagnostics` exports `count_compiles` and
builds `watch` and `assert_max_compiles` on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Iterator

import jax.monitoring

from .. import _jax as jc


@dataclasses.dataclass(frozen=True)
class CompileEvent:
  fun_name: str
  seconds: float
  wall_time: float


class CompileLog(list[CompileEvent]):
  """The compiles recorded in a block (a list of `CompileEvent`), and apart,
  the programs loaded from the persistent cache instead (`cache_loads`)."""

  def __init__(self) -> None:
    super().__init__()
    self.cache_loads: list[CompileEvent] = []


_lock = threading.Lock()
_recorders: list[tuple[CompileLog, int | None]] = []  # (log, thread or None)
_installed = False
_hits = threading.local()


def _on_event(event: str, **kwargs: Any) -> None:
  if event == jc.CACHE_HIT_EVENT:
    _hits.pending = True


def _on_duration(event: str, duration_secs: float, **kwargs: Any) -> None:
  if event != jc.BACKEND_COMPILE_EVENT:
    return
  record = CompileEvent(jc.compile_event_function(kwargs), float(duration_secs), time.time())
  loaded = getattr(_hits, "pending", False)
  _hits.pending = False
  thread = threading.get_ident()
  with _lock:
    for log, only in _recorders:
      if only is None or only == thread:
        (log.cache_loads if loaded else log).append(record)


def record_load(fun_name: str, seconds: float) -> None:
  """polyjit loaded the program `fun_name` from its own on-disk cache (no JAX
  event announces it): recorded as a load by the recorders active now."""
  record = CompileEvent(fun_name, float(seconds), time.time())
  thread = threading.get_ident()
  with _lock:
    for log, only in _recorders:
      if only is None or only == thread:
        log.cache_loads.append(record)


def _install() -> None:
  global _installed
  with _lock:
    if not _installed:
      jax.monitoring.register_event_listener(_on_event)
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      _installed = True


def watched() -> bool:
  """Whether a recorder of every thread's compiles is active (`count_compiles()`,
  `pj.assert_max_compiles`, `pj.watch`): a compile polyjit may choose to
  make (a hot shape's own program) waits until none is."""
  return any(only is None for _, only in _recorders)


@contextlib.contextmanager
def count_compiles(this_thread_only: bool = False) -> Iterator[CompileLog]:
  """Records the backend compiles that happen inside the block.

      with pj.diagnostics.count_compiles() as compiles:
        f(x)
      print(len(compiles))

  With `this_thread_only`, compiles running at the same time in other threads
  are left out (XLA compiles in the thread that asked for the program).
  """
  _install()
  events = CompileLog()
  entry = (events, threading.get_ident() if this_thread_only else None)
  with _lock:
    _recorders.append(entry)
  try:
    yield events
  finally:
    with _lock:  # by identity: two recorders with equal contents are different
      _recorders[:] = [r for r in _recorders if r is not entry]
