"""Remembered dynamic axes (`polyjit/_caching/axes.py`): a second process of a
script starts with the axes the first run learned dynamic, so automatic mode's
first call runs (loads) a bucket program instead of compiling or loading the
exact one, where a bucket an earlier run compiled holds it (else the first
call is exact, as without the memory: tests/test_jit.py's
test_a_second_process_compiles_nothing). Fresh processes with temporary cache directories
(`tests/disk_cache_worker.py`); programs counted with jax.monitoring there,
results compared with NumPy on the unpadded input."""

from __future__ import annotations

import os

from polyjit._jit.auto import DimTracker
from test_disk_cache import SIZES, run


def test_a_second_process_starts_with_the_learned_axis_dynamic(tmp_path):
  first = run(tmp_path, "square", SIZES)
  assert first["causes"][0] == "first call" and "bucket" in first["causes"]
  assert os.listdir(tmp_path / "axes")
  second = run(tmp_path, "square", SIZES)  # (`run` compares results with NumPy)
  # no exact program: every program is a bucket's, loaded from disk
  assert "first call" not in second["causes"] and second["causes"]
  assert second["compiles"] == 0 and second["loads"] == len(second["causes"])
  # A hint is only a hint: `loss` has the same code for another body (it calls
  # a global), so the hint is found; the programs come from the trace of the
  # body as it is now (new ones, exact results), and as no bucket of an earlier
  # run holds the first call (none has this program), it runs its exact shapes.
  cube = run(tmp_path, "cube", SIZES)
  assert cube["causes"][0] == "first call" and cube["compiles"] == len(cube["causes"])


def test_no_hint_is_kept_with_the_cache_off(tmp_path):
  first = run(tmp_path, "square", SIZES, {"POLYJIT_NO_CACHE": "1"})
  assert first["causes"][0] == "first call"
  assert not (tmp_path / "axes").exists()


def test_assume_splits_groups_as_remembered():
  tracker = DimTracker(["x", "y", "w"], [(5, 3), (5,), (3, 3)])
  assert tracker.assume([["x_0"], ["y_0"]])
  # x_0 and y_0 had equal sizes in this call, but separate variables when remembered;
  # w's axes, of x_1's size, stay fixed
  assert tracker.specs() == ["(x_0, _)", "(y_0,)", None]
  assert tracker.dynamic_groups() == [["x_0"], ["y_0"]]
  assert not DimTracker(["x"], [(5,)]).assume([["z_0"]])  # another structure's names


def test_a_function_without_code_or_an_unprintable_static_value_gets_no_hint(
    tmp_path, monkeypatch):
  import functools

  from polyjit._caching import axes

  def off(x, k):
    return x * k
  assert axes.key(off, (2,), ["x"]) is None  # the suite runs with the cache off
  monkeypatch.setattr(axes.disk, "root", lambda: str(tmp_path))  # as if it were on

  class Unprintable:
    def __repr__(self):
      raise RuntimeError("no repr")

  def f(x, k):
    return x * k

  assert axes.key(f, (2,), ["x"]) is not None
  assert axes.key(f, (Unprintable(),), ["x"]) is None
  assert axes.key(functools.partial(f, k=2), (2,), ["x"]) is None
  # another body under the same name is another key
  g = lambda x, k: x + k  # noqa: E731
  g.__qualname__ = f.__qualname__
  assert axes.key(g, (2,), ["x"]) != axes.key(f, (2,), ["x"])
