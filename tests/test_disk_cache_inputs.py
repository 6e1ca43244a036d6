"""What polyjit's on-disk cache reads from outside: the size bound in
`POLYJIT_CACHE_MAX_BYTES` (written as users write sizes, else one warning and
the default), and remembered buckets in `buckets/*.json` (hints, checked
before use: a file that says 10**12 must not allocate terabytes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._caching import disk as _disk_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("text, size", [
    ("1073741824", 1 << 30), ("1e9", 10**9), ("500M", 500 << 20), ("1G", 1 << 30),
    ("1GiB", 1 << 30), ("1GB", 10**9), ("2.5g", int(2.5 * (1 << 30))), ("64 KiB", 64 << 10),
    ("1_000_000", 10**6), (" 30000 ", 30000)])
def test_sizes_are_read_as_users_write_them(text, size):
  assert _disk_cache.parse_size(text) == size


@pytest.mark.parametrize("text", ["abc", "", "1X", "-5", "0", "nan", "inf", "1e999", "G", "1 G B"])
def test_what_is_not_a_size_is_refused(text):
  assert _disk_cache.parse_size(text) is None


def _run_with_max_bytes(tmp_path, value: str) -> dict:
  code = (
      "import json, warnings, numpy as np, jax.numpy as jnp, polyjit as pj\n"
      "from polyjit._caching import disk\n"
      "f = pj.jit(lambda x: jnp.sum(x * x))\n"
      "with warnings.catch_warnings(record=True) as caught:\n"
      "  warnings.simplefilter('always')\n"
      "  out = [float(f(np.ones(n, np.float32))) for n in (3, 5, 40)]\n"
      "print(json.dumps({'out': out, 'bound': disk._state['programs'].max_bytes,\n"
      "  'warnings': [str(w.message) for w in caught if issubclass(w.category, pj.CacheWarning)]}))\n")
  env = {k: v for k, v in os.environ.items() if k != "POLYJIT_NO_CACHE"}
  env.update(POLYJIT_CACHE_DIR=str(tmp_path), POLYJIT_CACHE_MAX_BYTES=value,
             PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_written_size_bounds_the_cache(tmp_path):
  report = _run_with_max_bytes(tmp_path, "1G")
  assert report["out"] == [3.0, 5.0, 40.0] and report["warnings"] == []
  assert report["bound"] == 1 << 30


def test_an_unreadable_size_warns_once_and_keeps_the_default(tmp_path):
  report = _run_with_max_bytes(tmp_path, "abc")
  assert report["out"] == [3.0, 5.0, 40.0]
  assert len(report["warnings"]) == 1, report["warnings"]
  assert "POLYJIT_CACHE_MAX_BYTES='abc'" in report["warnings"][0]
  assert report["bound"] == _disk_cache.DEFAULT_MAX_BYTES


# --- remembered buckets --------------------------------------------------------------

@pytest.fixture
def bucket_memory(tmp_path, monkeypatch):
  """polyjit's bucket memory on, in `tmp_path` (programs are not kept)."""
  monkeypatch.setitem(_disk_cache._state, "decided", True)
  monkeypatch.setitem(_disk_cache._state, "disabled", False)
  monkeypatch.setitem(_disk_cache._state, "dir", str(tmp_path))
  monkeypatch.setitem(_disk_cache._state, "programs", None)
  (tmp_path / "buckets").mkdir()
  return tmp_path / "buckets"


def loss(x):
  return jnp.sum(jnp.sin(x))


def _padded_sizes(f) -> set[int]:
  return {dict(b)["n"] if "n" in dict(b) else next(iter(dict(b).values()))
          for b in pj.stats(f).buckets}


def test_remembered_buckets_that_no_run_could_use_are_dropped(bucket_memory):
  first = pj.jit(loss)
  for n in (30, 40):  # (the second size makes the axis dynamic: a bucket)
    first(np.ones(n, np.float32))
  files = os.listdir(bucket_memory)
  assert len(files) == 1, files
  path = bucket_memory / files[0]
  (dim,), = [tuple(env) for env in json.loads(path.read_text())["buckets"]]
  hints = [10**12, 2**31, 2**31 - 1, 10**6, -4, 0, 1.5, "x", True, None]
  path.write_text(json.dumps({"buckets": [{dim: h} for h in hints] + [{}]}))
  assert _disk_cache.load_buckets(files[0][:-len(".json")]) == [{dim: 2**31 - 1}, {dim: 10**6}]
  again = pj.jit(loss)
  again(np.ones(30, np.float32))
  data = np.arange(1, 41, dtype=np.float32) / 40
  out = again(data)  # neither 2**31 - 1 nor 10**6 elements: far past what 40 needs
  np.testing.assert_allclose(float(out), float(np.sum(np.sin(data))), rtol=1e-5)
  assert max(_padded_sizes(again)) <= 16 * 40 * 2


def test_a_sane_remembered_bucket_is_still_used(bucket_memory):
  first = pj.jit(loss)
  for n in (30, 40, 200):
    first(np.ones(n, np.float32))
  again = pj.jit(loss)
  for n in (30, 200, 40):  # another order: the buckets the first run converged to
    again(np.ones(n, np.float32))
  assert _padded_sizes(again) <= _padded_sizes(first)


# --- programs compiled and loaded in threads -------------------------------------------

def test_programs_compiled_in_threads_are_kept_and_loaded_in_threads(tmp_path, monkeypatch):
  import jax
  monkeypatch.setitem(_disk_cache._state, "decided", True)
  monkeypatch.setitem(_disk_cache._state, "disabled", False)
  monkeypatch.setitem(_disk_cache._state, "dir", str(tmp_path))
  monkeypatch.setitem(_disk_cache._state, "programs",
                      _disk_cache.DiskCache(str(tmp_path / "xla"), 1 << 30))
  (tmp_path / "buckets").mkdir()
  example = jax.ShapeDtypeStruct((10,), jnp.float32)
  sizes = {"n": [16, 32, 64, 128, 256, 512]}

  def build():
    f = pj.jit(lambda x: jnp.cumsum(x) * 2.0, polymorphic_shapes=["n"],
               buckets=pj.buckets.PowersOfTwo())
    with pj.diagnostics.count_compiles() as log:
      f.precompile(example, sizes=sizes, progress=False)  # in the compile pool's threads
    return f, log

  first, cold = build()
  assert len(cold) == len(sizes["n"]) and not cold.cache_loads
  assert len(os.listdir(tmp_path / "xla")) == len(sizes["n"])
  again, warm = build()
  assert len(warm) == 0 and len(warm.cache_loads) == len(sizes["n"])
  for n in (5, 100, 300):
    data = np.arange(n, dtype=np.float32)
    np.testing.assert_allclose(again(data), np.cumsum(data) * 2.0, rtol=1e-6)
