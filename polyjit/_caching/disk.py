"""The warm on-disk cache: compiled programs and converged buckets across processes.

On by default. The first program `pj.jit` builds in a process (or the first
`pj.vmap`, whose programs the caller's `jax.jit` compiles) turns on JAX's
persistent compilation cache in a polyjit directory, so a second run of the
same script loads each bucket's program from disk instead of compiling it:

* **Location**: `$POLYJIT_CACHE_DIR`, else `$XDG_CACHE_HOME/polyjit`, else
  `~/.cache/polyjit`. Programs go to `xla/`, bucket memories to `buckets/`.
* **Opt out** in one line: `POLYJIT_NO_CACHE=1` in the environment, or
  `pj.disable_persistent_cache()` before the first call.
  `pj.enable_persistent_cache(directory, max_bytes=...)` picks another place.
  If the user configured JAX's own cache (`jax_compilation_cache_dir`), that
  one is left as it is and only the bucket memories are polyjit's.
* **Keys**: JAX's cache key, which hashes the lowered program (so a changed
  function body is a different program), the JAX and jaxlib versions, the
  platform and device kind, the compile options and the XLA flags: a change
  in any of them never gets an old program.
* **Bounded**: at most `max_bytes` (`$POLYJIT_CACHE_MAX_BYTES`, default 1 GiB)
  of programs; past it, the least recently used entries are deleted (a read
  refreshes an entry's time).
* **Atomic across processes**: an entry is written to a temporary file in the
  same directory and renamed into place (`os.replace`), so a reader sees a
  whole entry or none; two processes writing one key write the same bytes.
  No locks: an entry evicted under a reader is a miss, never a torn read.
* **Degrades, once**: a directory that cannot be written (read-only, full
  disk, no permission) turns the cache off with one `pj.CacheWarning`, and
  calls go on compiling as without a cache.

Bucket memory: the buckets a traced program converged to are kept in
`buckets/<hash>.json`, keyed by a hash of the traced jaxpr, its specs, the
JAX version and the platform (never a function name), so a second run of the
same program starts in those buckets (`_policy.Rental.remember`) and a
remembered bucket costs a load, not a compile, in the cost-aware policy.
At most `MAX_REMEMBERED` buckets per program and `MAX_PROGRAMS` programs
are kept (the least recently written memories go).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from typing import Any

import jax

from .. import _jax as jc
from .._masking.errors import CacheWarning, warn_user

DEFAULT_MAX_BYTES = 1 << 30
MAX_REMEMBERED = 64       # buckets remembered per traced program
MAX_PROGRAMS = 1024       # traced programs remembered (the least recently written go)
SUFFIX = "-cache"         # JAX's entry suffix (only these count toward the bound)

_lock = threading.RLock()
_state: dict[str, Any] = {"decided": False, "dir": None, "disabled": False,
                          "warned": False, "explicit": None}


def default_dir() -> str:
  env = os.environ.get("POLYJIT_CACHE_DIR")
  if env:
    return os.path.abspath(os.path.expanduser(env))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return os.path.abspath(os.path.expanduser(os.path.join(base, "polyjit")))


def _env_disabled() -> bool:
  return os.environ.get("POLYJIT_NO_CACHE", "").strip().lower() not in ("", "0", "false", "no")


def _max_bytes() -> int:
  env = os.environ.get("POLYJIT_CACHE_MAX_BYTES")
  return int(env) if env else DEFAULT_MAX_BYTES


def _warn_once(message: str) -> None:
  if not _state["warned"]:
    _state["warned"] = True
    warn_user(message, CacheWarning)


def _writable(path: str) -> str | None:
  """None when `path` (created if need be) takes a file; else why not."""
  try:
    os.makedirs(path, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
    try:
      os.write(fd, b"x")
    finally:
      os.close(fd)
      os.unlink(probe)
  except OSError as e:
    return f"{type(e).__name__}: {e}"
  return None


class DiskCache(jc.CompilationCacheBase):  # type: ignore[misc]  # (JAX's class, untyped)
  """JAX's cache interface over a directory: atomic writes, LRU size bound."""

  def __init__(self, path: str, max_bytes: int) -> None:
    self.path = path
    self._path = jc.pathlib_path(path)
    self.max_bytes = max_bytes
    self.failed = False
    os.makedirs(path, exist_ok=True)

  def _file(self, key: str) -> str:
    return os.path.join(self.path, key + SUFFIX)

  def get(self, key: str) -> bytes | None:
    if not key:
      raise ValueError("key cannot be empty")
    name = self._file(key)
    try:
      with open(name, "rb") as f:
        value = f.read()
    except OSError:
      return None
    try:
      os.utime(name)  # recently used: evicted last
    except OSError:
      pass
    return value

  def put(self, key: str, value: bytes) -> None:
    if not key:
      raise ValueError("key cannot be empty")
    if self.failed or len(value) > self.max_bytes:
      return
    name = self._file(key)
    if os.path.exists(name):
      return
    try:
      fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
      try:
        with os.fdopen(fd, "wb") as f:
          f.write(value)
        os.replace(tmp, name)  # atomic: readers see all of it or nothing
      except BaseException:
        try:
          os.unlink(tmp)
        except OSError:
          pass
        raise
      self.evict(keep=name)
    except OSError as e:  # full disk, gone read-only: no cache from now on, one warning
      self.failed = True
      _warn_once(f"polyjit's compilation cache at {self.path} cannot be written "
                 f"({type(e).__name__}: {e}); programs are compiled without it. Set "
                 "POLYJIT_CACHE_DIR to a writable directory, or POLYJIT_NO_CACHE=1 "
                 "to silence this.")

  def evict(self, keep: str | None = None) -> int:
    """Deletes least recently used entries until the directory holds at most
    `max_bytes`; returns how many were deleted."""
    entries = []
    total = 0
    with os.scandir(self.path) as it:
      for e in it:
        if e.name.endswith(SUFFIX):
          try:
            st = e.stat()
          except OSError:
            continue  # evicted by another process meanwhile
          entries.append((st.st_mtime_ns, e.path, st.st_size))
          total += st.st_size
    deleted = 0
    for _, path, size in sorted(entries):
      if total <= self.max_bytes:
        break
      if path == keep:
        continue
      try:
        os.unlink(path)
        deleted += 1
      except OSError:
        pass
      total -= size
    return deleted


def enable(directory: str | None = None, max_bytes: int | None = None) -> str | None:
  """Turns the on-disk cache on at `directory` (default `default_dir()`);
  returns the programs' directory, or None (with one warning) when it cannot
  be written."""
  with _lock:
    root = os.path.abspath(os.path.expanduser(directory)) if directory else default_dir()
    _state.update(decided=True, disabled=False, explicit=root)
    return _install(root, _max_bytes() if max_bytes is None else max_bytes)


def disable() -> None:
  """Turns polyjit's on-disk cache off in this process (JAX's own cache, if the
  user configured one, is left alone)."""
  with _lock:
    if _state["dir"] is not None:
      jc.uninstall_compilation_cache()
    _state.update(decided=True, disabled=True, dir=None)


def ensure() -> None:
  """The default: on the first compile of the process, turn the cache on
  unless opted out or the user configured JAX's cache themselves."""
  if _state["decided"]:
    return
  with _lock:
    if _state["decided"]:
      return
    _state["decided"] = True
    if _env_disabled():
      _state["disabled"] = True
      return
    if jc.user_compilation_cache_dir() is not None:
      return  # the user's own JAX cache: keep it; bucket memories still go to ours
    _install(default_dir(), _max_bytes())


def _install(root: str, max_bytes: int) -> str | None:
  xla = os.path.join(root, "xla")
  why = _writable(xla) or _writable(os.path.join(root, "buckets"))
  if why is not None:
    _state["dir"] = None
    _state["disabled"] = True
    _warn_once(f"polyjit's compilation cache at {root} cannot be used ({why}); "
               "programs are compiled without it. Set POLYJIT_CACHE_DIR to a writable "
               "directory, or POLYJIT_NO_CACHE=1 to silence this.")
    return None
  jc.install_compilation_cache(DiskCache(xla, max_bytes), xla)
  _state["dir"] = root
  return xla


def root() -> str | None:
  """The cache's directory when polyjit's cache (or its bucket memory) is on."""
  ensure()
  if _state["disabled"]:
    return None
  return _state["dir"] or _state["explicit"] or default_dir()


# --- bucket memory ----------------------------------------------------------------

def program_key(jaxpr: Any, specs: Any) -> str:
  """A hash of a traced program: its jaxpr text and specs, JAX and platform."""
  # (object addresses, should a parameter print one, differ between processes)
  body = re.sub(r" at 0x[0-9a-fA-F]+", "", str(jaxpr))
  text = "\n".join([body, repr(specs), jax.__version__, jax.default_backend()])
  return hashlib.sha256(text.encode()).hexdigest()[:32]


def _bucket_file(key: str) -> str | None:
  base = root()
  return None if base is None else os.path.join(base, "buckets", key + ".json")


def load_buckets(key: str) -> list[dict[str, int]]:
  """The buckets remembered for the traced program `key` (none if unknown)."""
  path = _bucket_file(key)
  if path is None:
    return []
  try:
    with open(path) as f:
      data = json.load(f)
    return [{str(k): int(v) for k, v in env.items()} for env in data["buckets"]]
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return []


def remember_bucket(key: str, env: dict[str, int]) -> None:
  """Adds `env` to the buckets remembered for `key` (atomic; best effort)."""
  path = _bucket_file(key)
  if path is None:
    return
  envs = load_buckets(key)
  if dict(env) in envs:
    return
  envs = (envs + [dict(env)])[-MAX_REMEMBERED:]
  try:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
      json.dump({"buckets": envs, "written": time.time()}, f)
    os.replace(tmp, path)
    if len(envs) == 1:  # a new program's memory: keep their number bounded
      _trim(os.path.dirname(path))
  except OSError:
    pass  # a memory, not a program: losing it costs only a compile


def _trim(directory: str) -> None:
  entries = []
  with os.scandir(directory) as it:
    for e in it:
      if e.name.endswith(".json"):
        try:
          entries.append((e.stat().st_mtime_ns, e.path))
        except OSError:
          continue
  for _, path in sorted(entries)[:max(len(entries) - MAX_PROGRAMS, 0)]:
    try:
      os.unlink(path)
    except OSError:
      pass
