"""polyjit's on-disk program cache keys a program by its whole calling
convention, not by its text alone (`polyjit/_jax/compilation_cache.py`).

JAX drops unused arguments from a lowered program's text, and a serialized
executable brings back the argument types (and result weak types) of the
process that compiled it; so two programs with one text and different unused
arguments, donation or result weak types must not share an entry, and an
entry whose convention is not the call's must never be run (a miss). Each
test turns the cache on in a temporary directory (the suite runs with it off:
tests/conftest.py), compares with `jax.jit`, and counts compiles and loads
with jax.monitoring (`pj.diagnostics.count_compiles`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit import _jax as jc
from polyjit._caching import disk as _disk_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache_on(tmp_path):
  assert pj.enable_persistent_cache(str(tmp_path)) is not None
  try:
    yield tmp_path
  finally:
    _disk_cache.disable()  # (as POLYJIT_NO_CACHE=1, the suite's setting)


def entries(root) -> list[str]:
  return sorted(os.listdir(os.path.join(root, "xla")))


def same_as_jax(got, want) -> None:
  got, want = jnp.asarray(got), jnp.asarray(want)
  assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
  assert got.weak_type == want.weak_type, (got, want)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_array_equal_over_sizes_1_2_0_with_the_cache_on(cache_on):
  # (the first report: the size-0 program has the text of the size-1 one, its
  # x pruned; the loaded program refused float32[0])
  fun = lambda x, s: jnp.array_equal(x, s)
  f = pj.jit(fun)
  for n in (1, 2, 0):
    x = np.linspace(0.1, 0.9, n, dtype=np.float32)
    same_as_jax(f(x, np.float32(0.5)), jax.jit(fun)(x, np.float32(0.5)))


def test_a_result_weak_type_is_not_taken_from_another_program(cache_on):
  weak = lambda v: v.shape[0] * 1.5
  strong = lambda v: jnp.float32(v.shape[0] * 1.5)
  v = np.ones(3, np.float32)
  same_as_jax(pj.jit(weak)(v), jax.jit(weak)(v))
  got = pj.jit(strong)(v)
  same_as_jax(got, jax.jit(strong)(v))
  same_as_jax(got + jnp.float16(0.1), jax.jit(strong)(v) + jnp.float16(0.1))


UNUSED = {  # pairs of unused arguments that leave the program text alike
    "shape": (np.zeros(3, np.float32), np.zeros(5, np.float32)),
    "dtype": (np.zeros(3, np.float32), np.zeros(3, np.int8)),
    "rank": (np.zeros(3, np.float32), np.zeros((3, 1), np.float32)),
    "weak type": (np.float32(2.0), 2.0),
}


@pytest.mark.parametrize("kind", list(UNUSED))
def test_programs_differing_only_in_an_unused_argument_do_not_share_an_entry(cache_on, kind):
  body = lambda x, unused: jnp.sum(x * x)
  x = np.arange(4, dtype=np.float32)
  first, second = UNUSED[kind]
  for u in (first, second):
    with pj.diagnostics.count_compiles() as log:
      got = pj.jit(body)(x, u)  # a new function each time: only the cache can share
    same_as_jax(got, jax.jit(body)(x, u))
  assert len(log) >= 1 and not log.cache_loads, kind  # compiled for its own convention
  # the same convention is still one entry: a third function loads it
  with pj.diagnostics.count_compiles() as log:
    same_as_jax(pj.jit(body)(x, second), jax.jit(body)(x, second))
  assert len(log.cache_loads) == 1 and len(log) == 0, kind


def test_donation_of_an_unused_argument_is_part_of_the_key(cache_on):
  body = lambda x, unused: x * 2
  x = np.arange(4, dtype=np.float32)
  same_as_jax(pj.jit(body)(x, np.zeros(3, np.float32)), jax.jit(body)(x, np.zeros(3)))
  with pj.diagnostics.count_compiles() as log:
    got = pj.jit(body, donate_argnums=1)(x, jnp.zeros(3, jnp.float32))
  same_as_jax(got, x * 2)
  assert len(log) >= 1 and not log.cache_loads
  assert len(entries(cache_on)) == 2


def test_x64_programs_with_unused_arguments_of_two_widths(cache_on):
  body = lambda x, unused: jnp.sum(x) + 1
  x = np.arange(4, dtype=np.float64)
  with jax.enable_x64():
    for u in (np.zeros(2, np.float64), np.zeros(2, np.float32), np.int64(3)):
      same_as_jax(pj.jit(body)(x, u), jax.jit(body)(x, u))
  # the same program with x64 off: float32 throughout, its own entry
  same_as_jax(pj.jit(body)(x, np.zeros(2, np.float32)), jax.jit(body)(x, np.zeros(2, np.float32)))
  assert len(entries(cache_on)) == 4


def test_a_stored_program_for_another_convention_is_a_miss_replaced(cache_on, monkeypatch):
  # Whatever the key says (here: one key for every program, as a colliding or
  # older key would), a program whose convention is not the call's is not run.
  monkeypatch.setattr(jc, "program_key", lambda lowered: "0" * 40)
  body = lambda x, unused: jnp.sum(x * x)
  x = np.arange(4, dtype=np.float32)
  same_as_jax(pj.jit(body)(x, np.zeros(3, np.float32)), jax.jit(body)(x, np.zeros(3)))
  with pj.diagnostics.count_compiles() as log:
    got = pj.jit(body)(x, np.zeros(2, np.int8))
  same_as_jax(got, jax.jit(body)(x, np.zeros(2, np.int8)))
  assert len(log) >= 1 and not log.cache_loads
  with pj.diagnostics.count_compiles() as log:  # the entry now holds the int8 program
    same_as_jax(pj.jit(body)(x, np.zeros(2, np.int8)), jax.jit(body)(x, np.zeros(2, np.int8)))
  assert len(log.cache_loads) == 1 and len(log) == 0


def test_the_convention_read_from_a_loaded_program_is_the_lowered_ones():
  lowered = jax.jit(lambda x, u: (x * 2, 1.0), donate_argnums=0).lower(
      np.zeros(3, np.float32), np.zeros(2, np.int8))
  compiled = lowered.compile()
  data = jc.serialize_program(compiled)
  assert data is not None
  assert jc.calling_convention(jc.load_program(data, lowered)) == jc.calling_convention(lowered)
  other = jax.jit(lambda x, u: (x * 2, 1.0), donate_argnums=0).lower(
      np.zeros(3, np.float32), np.zeros(2, np.float32))
  assert other.as_text() == lowered.as_text()  # (the text alone cannot tell them apart)
  with pytest.raises(jc.ProgramMismatch, match="int8"):
    jc.load_program(data, other)


WORKER = """
import json, sys, numpy as np, jax, jax.numpy as jnp, polyjit as pj
body = lambda x, unused: jnp.sum(x * x)
x = np.arange(4, dtype=np.float32)
unused = [np.zeros(int(n), dtype) for dtype, n in (s.split(":") for s in sys.argv[1:])]
with pj.diagnostics.count_compiles() as log:  # (pj.jit's programs only)
  got = [pj.jit(body)(x, u) for u in unused]
want = [jax.jit(body)(x, u) for u in unused]
out = [[float(g), float(w), str(g.dtype), str(w.dtype)] for g, w in zip(got, want, strict=True)]
print(json.dumps({"out": out, "compiles": len(log), "loads": len(log.cache_loads)}))
"""


def run_worker(cache_dir, *specs: str) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "POLYJIT_NO_CACHE"}
  env.update(POLYJIT_CACHE_DIR=str(cache_dir),
             PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-c", WORKER, *specs], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  for got, want, got_dtype, want_dtype in report["out"]:
    assert got == want and got_dtype == want_dtype, report
  return report


def test_a_second_process_with_another_unused_argument_compiles_its_own(tmp_path):
  first = run_worker(tmp_path, "float32:3")
  assert first["compiles"] == 1 and first["loads"] == 0
  second = run_worker(tmp_path, "int8:5", "float32:3")
  # the int8 program is compiled (the float32 one's text is the same), the
  # float32 one is loaded from the first process
  assert second["loads"] == 1 and second["compiles"] == 1, second
