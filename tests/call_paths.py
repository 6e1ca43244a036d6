"""What the tests of the two call paths and of hot shapes share.

* `path`: a fixture run once on the accelerator path (`POLYJIT_INLINE_CPU=0`:
  programs on JAX's own client, as on a GPU) and once with the defaults
  (polyjit's inline CPU client); the device pad and slice programs are
  forgotten around each test.
* `buy_at_once`: hot shapes (`polyjit/_jit/hot_shapes.py`) buy their own
  program at their first hot call (`RENT = 0`).
* `backend_compiles()`: the XLA compiles `jax.monitoring` has reported in this
  process (one listener, registered once).
* `settle()` waits for the hot shapes' compiles queued so far; `bought(f, *args)`
  calls `f` until its plan for `args` has its own program.
"""

from __future__ import annotations

from typing import Any

import jax
import pytest

from polyjit._jit import hot_shapes, resident

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = [0]


def _count_compile(event: str, *args: object, **kwargs: object) -> None:
  if event == COMPILE_EVENT:
    _compiles[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def backend_compiles() -> int:
  return _compiles[0]


@pytest.fixture(params=["accelerator", "defaults"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
  if request.param == "accelerator":
    monkeypatch.setenv("POLYJIT_INLINE_CPU", "0")
  else:
    monkeypatch.delenv("POLYJIT_INLINE_CPU", raising=False)
  resident.forget()
  yield request.param
  resident.forget()


@pytest.fixture
def buy_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
  """A plan buys its shapes' program at its first hot call (RENT = 0)."""
  monkeypatch.setattr(hot_shapes, "RENT", 0.0)


def settle() -> None:
  """Waits for the hot shapes' compiles queued so far (one thread runs them in order)."""
  hot_shapes._executor().submit(lambda: None).result()


def bought(f: Any, *args: object) -> bool:
  """Calls `f` until its plan for `args` has its own program (or gives up)."""
  for _ in range(50):
    f(*args)
    settle()
    if any(p.exact_call is not None for p in f._hot.values()):
      return True
  return False
