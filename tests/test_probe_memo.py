"""The JAX probes that passed are remembered next to polyjit's on-disk programs
(`polyjit/_caching/probe_memo.py`): a second process on the same JAX skips
them (the programs probe lowered a program of its own in that process's first
call), and still checks each loaded program's calling convention. A failed
probe is never remembered, a key that changes (another JAX, an editable
install) runs them all, and `registry.forget()` runs them again."""

from __future__ import annotations

import os

import pytest

from polyjit._caching import probe_memo
from polyjit._jax import registry
from tests.test_disk_cache import run

PROGRAMS_PROBE = next(r.name for r in registry.ROWS.values() if r.feature == registry.PROGRAMS)


def test_a_second_process_skips_the_probes_the_first_passed(tmp_path):
  first = run(tmp_path, "square", [40, 17, 90])
  assert PROGRAMS_PROBE in first["probes_run"] and first["compiles"] > 0
  assert os.listdir(tmp_path / "probes")
  second = run(tmp_path, "square", [40, 17, 90])   # (results checked against NumPy)
  assert second["probes_run"] == [] and second["compiles"] == 0 and second["loads"] > 0


@pytest.fixture
def memo(monkeypatch):
  """A memo in a dict, and two rows of the registry's own kind."""
  kept: dict[str, set[str]] = {"names": set()}
  ran: list[str] = []
  monkeypatch.setattr(registry, "_memo", {"load": lambda: set(kept["names"]),
                                          "save": lambda names: kept.update(names=set(names))})
  monkeypatch.setattr(registry, "_remembered", None)
  rows = []
  for name, fails in (("test row passes", False), ("test row fails", True)):
    def probe(name=name, fails=fails):
      ran.append(name)
      assert not fails, "changed"
    rows.append(registry.Internal(name, "a test feature", "read", "a test", probe, "none"))
  yield kept, ran, rows
  registry._passed.difference_update(r.name for r in rows)


def test_a_remembered_probe_is_skipped_and_a_failed_one_never_remembered(memo):
  kept, ran, (passes, fails) = memo
  with pytest.raises(registry.JaxBoundaryError, match="changed"):
    registry.check([passes, fails])
  assert ran == [passes.name, fails.name]
  assert passes.name in kept["names"] and fails.name not in kept["names"]
  # a new process: the remembered probe is skipped, the failed one runs again
  registry._passed.difference_update({passes.name, fails.name})
  registry._remembered = None
  ran.clear()
  with pytest.raises(registry.JaxBoundaryError):
    registry.check([passes, fails])
  assert ran == [fails.name]
  registry.forget()   # (tests) every probe runs again, whatever the memo says
  ran.clear()
  registry.check([passes])
  assert ran == [passes.name]


def test_no_key_without_wheels_and_a_new_key_for_another_jax(monkeypatch, tmp_path):
  monkeypatch.setattr(probe_memo, "_state", {})
  wheel = probe_memo._wheel_record
  key = probe_memo.key()
  assert key is not None   # (the test environment installs jax and jaxlib from wheels)
  monkeypatch.setattr(probe_memo, "_state", {})
  monkeypatch.setattr(probe_memo, "_wheel_record",
                      lambda name: wheel(name) + (b"x" if name == "jaxlib" else b""))
  assert probe_memo.key() not in (None, key)
  monkeypatch.setattr(probe_memo, "_state", {})
  monkeypatch.setattr(probe_memo, "_wheel_record", lambda name: None)   # editable
  assert probe_memo.key() is None
  monkeypatch.setattr(probe_memo, "root_if_decided", lambda: str(tmp_path))
  probe_memo.save({"a probe"})
  assert probe_memo.load() == set() and not os.listdir(tmp_path)


def test_nothing_is_read_before_a_compile_turns_the_cache_on(monkeypatch, memo):
  # (importing polyjit or its first trace must not start JAX's backend, part
  # of the key: the memo is asked again at each check until then)
  kept, ran, (passes, _) = memo
  kept["names"] = {passes.name}
  answers = iter([None, {passes.name}])
  monkeypatch.setattr(registry, "_memo", {"load": lambda: next(answers),
                                          "save": lambda names: None})
  registry.check([passes])
  assert ran == [passes.name]
  registry._passed.discard(passes.name)
  registry.check([passes])
  assert ran == [passes.name]   # the second answer: remembered
