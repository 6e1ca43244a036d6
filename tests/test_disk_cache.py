"""polyjit's on-disk cache (`polyjit/_caching/disk.py`), in fresh processes with
temporary cache directories (the suite itself runs with the cache off:
tests/conftest.py). Compiles are measured with jax.monitoring in the workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from polyjit._caching import disk as _disk_cache

WORKER = os.path.join(os.path.dirname(__file__), "disk_cache_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_for(cache_dir, extra=None) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k != "POLYJIT_NO_CACHE"}
  env["POLYJIT_CACHE_DIR"] = str(cache_dir)
  env.update(extra or {})
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


def start(cache_dir, body, sizes, extra=None):
  return subprocess.Popen([sys.executable, WORKER, body, ",".join(map(str, sizes))],
                          env=env_for(cache_dir, extra), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def finish(proc) -> dict:
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  report = json.loads(out.strip().splitlines()[-1])
  np.testing.assert_allclose(report["results"], report["expected"], rtol=1e-5)
  return report


def run(cache_dir, body, sizes, extra=None) -> dict:
  return finish(start(cache_dir, body, sizes, extra))


SIZES = [40, 17, 33, 90, 41, 200, 5, 64]


def test_a_second_process_compiles_nothing_for_sizes_the_first_run_saw(tmp_path):
  first = run(tmp_path, "square", SIZES)
  assert first["compiles"] > 0 and first["loads"] == 0
  assert any(n.endswith("-cache") for n in os.listdir(tmp_path / "xla"))
  second = run(tmp_path, "square", SIZES)
  assert second["compiles"] == 0
  # every program but the first call's exact one (the axis that varies is
  # remembered: tests/test_disk_cache_axes.py)
  assert second["loads"] == first["compiles"] - 1
  # Bucket memory: another order starts in the buckets the first run converged
  # to, loaded from disk (without it, 90 as the second size would compile a
  # headroom bucket of 2 x 90 rounded up, which the first run never had).
  third = run(tmp_path, "square", [40, 90, 17, 200, 5])
  assert third["compiles"] == 0 and third["loads"] > 0
  assert os.listdir(tmp_path / "buckets")


def test_pj_vmap_programs_are_left_to_jaxs_own_cache(tmp_path):
  # pj.vmap's programs are compiled by the user's jax.jit: polyjit keeps none of them
  first = run(tmp_path, "ragged", SIZES)
  assert first["compiles"] > 0 and first["loads"] == 0
  second = run(tmp_path, "ragged", SIZES)
  assert second["compiles"] == first["compiles"] and second["loads"] == 0
  assert not (tmp_path / "xla").exists() or not os.listdir(tmp_path / "xla")
  # ... and JAX's own cache, configured by the user, keeps them warm
  jax_env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax"),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  run(tmp_path, "ragged", SIZES, extra=jax_env)
  warm = run(tmp_path, "ragged", SIZES, extra=jax_env)
  assert warm["compiles"] == 0 and warm["loads"] > 0


def test_a_changed_function_body_gets_a_new_program(tmp_path):
  first = run(tmp_path, "square", SIZES[:4])
  changed = run(tmp_path, "cube", SIZES[:4])  # same name, same sizes, other body
  # (fewer than the first run's: the axis that varies is remembered, so there
  # is no exact first-call program: tests/test_disk_cache_axes.py)
  assert first["compiles"] > 0 and changed["compiles"] > 0 and changed["loads"] == 0


def test_two_processes_writing_one_cache_at_once_both_get_correct_results(tmp_path):
  procs = [start(tmp_path, "square", SIZES), start(tmp_path, "square", SIZES)]
  reports = [finish(p) for p in procs]  # (finish checks each result)
  assert all(r["compiles"] + r["loads"] > 0 for r in reports)
  assert not [n for n in os.listdir(tmp_path / "xla") if n.startswith(".tmp-")]
  after = run(tmp_path, "square", SIZES)  # the entries they wrote are whole
  assert after["compiles"] == 0


def _read_only(path):
  """A directory polyjit cannot write: read-only by mode, or (as root, whom
  modes do not stop) a path under a regular file."""
  path.mkdir(exist_ok=True)
  if os.geteuid() == 0:
    blocker = path / "file"
    blocker.write_text("not a directory")
    return blocker / "cache"
  os.chmod(path, 0o500)
  return path


def test_a_read_only_cache_directory_warns_once_and_works(tmp_path):
  report = run(_read_only(tmp_path / "ro"), "square", SIZES)
  assert len(report["warnings"]) == 1, report["warnings"]
  assert "cannot be used" in report["warnings"][0]
  assert report["compiles"] > 0


def test_a_write_that_fails_later_warns_once_and_turns_the_cache_off(tmp_path):
  cache = _disk_cache.DiskCache(str(tmp_path), max_bytes=1 << 20)
  cache.put("a", b"1" * 10)
  os.rename(tmp_path, tmp_path.parent / "gone")  # the directory disappears
  _disk_cache._state["warned"] = False
  with pytest.warns(Warning, match="cannot be written") as caught:
    cache.put("b", b"2" * 10)
    cache.put("c", b"3" * 10)
  assert len(caught) == 1 and cache.failed


def test_the_size_bound_evicts_least_recently_used_entries(tmp_path):
  header = len(_disk_cache.MAGIC) + 32  # each entry: a header, then its 100 bytes
  cache = _disk_cache.DiskCache(str(tmp_path), max_bytes=250 + 2 * header)
  for i, key in enumerate("abc"):
    cache.put(key, bytes([i]) * 100)
    os.utime(tmp_path / f"{key}-cache", ns=(i * 10**9, i * 10**9))
  files = sorted(os.listdir(tmp_path))
  assert files == ["b-cache", "c-cache"], files  # "a" went when "c" came
  os.utime(tmp_path / "b-cache", ns=(5 * 10**9, 5 * 10**9))
  cache.get("b")  # a read makes "b" the most recently used
  cache.put("d", b"d" * 100)
  assert sorted(os.listdir(tmp_path)) == ["b-cache", "d-cache"]
  assert cache.get("b") == b"\x01" * 100 and cache.get("c") is None
  assert sum(os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path)) <= 250 + 2 * header


def test_a_damaged_entry_is_a_miss_and_is_deleted(tmp_path):
  cache = _disk_cache.DiskCache(str(tmp_path), max_bytes=1 << 20)
  cache.put("a", b"program bytes")
  entry = tmp_path / "a-cache"
  data = bytearray(entry.read_bytes())
  data[-1] ^= 1
  entry.write_bytes(bytes(data))
  assert cache.get("a") is None and not entry.exists()


def test_the_size_bound_holds_for_programs_of_a_real_run(tmp_path):
  env = env_for(tmp_path)
  env["POLYJIT_CACHE_MAX_BYTES"] = "30000"
  proc = subprocess.Popen([sys.executable, WORKER, "square", ",".join(map(str, SIZES))],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  finish(proc)
  sizes = [os.path.getsize(tmp_path / "xla" / n) for n in os.listdir(tmp_path / "xla")]
  assert sizes and sum(sizes) <= 30000


def test_bucket_memories_are_keyed_by_the_traced_program_and_bounded(tmp_path, monkeypatch):
  import jax
  import jax.numpy as jnp
  monkeypatch.setitem(_disk_cache._state, "decided", True)
  monkeypatch.setitem(_disk_cache._state, "disabled", False)
  monkeypatch.setitem(_disk_cache._state, "dir", str(tmp_path))
  (tmp_path / "buckets").mkdir()
  square = jax.make_jaxpr(lambda x: jnp.sum(x * x))(jnp.ones(3))
  cube = jax.make_jaxpr(lambda x: jnp.sum(x * x * x))(jnp.ones(3))
  a, b = _disk_cache.program_key(square, ("n",)), _disk_cache.program_key(cube, ("n",))
  assert a != b and a == _disk_cache.program_key(square, ("n",))
  _disk_cache.remember_bucket(a, {"n": 64})
  _disk_cache.remember_bucket(a, {"n": 256})
  _disk_cache.remember_bucket(a, {"n": 64})
  assert _disk_cache.load_buckets(a) == [{"n": 64}, {"n": 256}]
  assert _disk_cache.load_buckets(b) == []
  monkeypatch.setattr(_disk_cache, "MAX_PROGRAMS", 3)
  for i in range(6):
    _disk_cache.remember_bucket(f"k{i}", {"n": i + 1})
  assert len(os.listdir(tmp_path / "buckets")) == 3
  assert _disk_cache.load_buckets("k5") == [{"n": 6}]
