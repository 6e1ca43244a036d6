"""Counting compiles with `jax.monitoring`.

JAX reports each XLA backend compile as the duration event
`/jax/core/compile/backend_compile_duration`, tagged with the function name.
One listener is registered for the process (listeners cannot be scoped), and
it forwards events to the recorders active at that moment, on any thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Iterator

import jax.monitoring

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass(frozen=True)
class CompileEvent:
  fun_name: str
  seconds: float
  wall_time: float


_lock = threading.Lock()
_recorders: list[list[CompileEvent]] = []
_installed = False


def _listener(event: str, seconds: float, **kwargs) -> None:
  if event != BACKEND_COMPILE_EVENT:
    return
  record = CompileEvent(str(kwargs.get("fun_name", "?")), float(seconds), time.time())
  with _lock:
    for recorder in _recorders:
      recorder.append(record)


def _install() -> None:
  global _installed
  with _lock:
    if not _installed:
      jax.monitoring.register_event_duration_secs_listener(_listener)
      _installed = True


@contextlib.contextmanager
def count_compiles() -> Iterator[list[CompileEvent]]:
  """Records the backend compiles that happen inside the block.

      with pj.diagnostics.count_compiles() as compiles:
        f(x)
      print(len(compiles))
  """
  _install()
  events: list[CompileEvent] = []
  with _lock:
    _recorders.append(events)
  try:
    yield events
  finally:
    with _lock:  # by identity: two recorders with equal contents are different
      _recorders[:] = [r for r in _recorders if r is not events]
