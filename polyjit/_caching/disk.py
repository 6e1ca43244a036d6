"""The warm on-disk cache: polyjit's compiled programs and converged buckets across processes.

On by default. polyjit keeps **its own programs only**: each program `pj.jit`
compiles is serialized (`_jax/compilation_cache.py`) and written under polyjit's
directory, so a second run of the same script loads each bucket's program
instead of compiling it. No JAX setting is changed: JAX's persistent
compilation cache stays as the user configured it (off by default), so the
user's own `jax.jit` programs, and `pj.vmap`'s (which the user's `jax.jit`
compiles), are cached by JAX's cache if and only if the user turned it on.

* **Location**: `$POLYJIT_CACHE_DIR`, else `$XDG_CACHE_HOME/polyjit`, else
  `~/.cache/polyjit`. Programs go to `xla/`, bucket memories to `buckets/`.
* **Opt out** in one line: `POLYJIT_NO_CACHE=1` in the environment, or
  `pj.disable_persistent_cache()` before the first call.
  `pj.enable_persistent_cache(directory, max_bytes=...)` picks another place.
* **Keys**: a hash of the lowered program text (so a changed function body is
  a different program), its whole calling convention (every argument's type,
  the unused ones JAX drops from the text included, donation, the results'
  weak types, the pytrees, the shardings and layouts asked for), the JAX and
  jaxlib versions, the platform and device kinds, the XLA flags and every
  `jax.config` value (`_jax.program_key`): a change in any of them never gets
  an old program. A loaded program whose convention is not the call's (read
  back from it: `_jax.load_program`) is a miss, deleted and compiled again.
  Only single-device programs are kept (a program on a mesh compiles in each
  process).
* **Bounded**: at most `max_bytes` of programs (`$POLYJIT_CACHE_MAX_BYTES`,
  default 1 GiB, written as `1073741824`, `1e9`, `500M`, `1G`, `1GiB` or
  `1GB`; anything else warns once and keeps the default); past it, the least
  recently used entries are deleted (a read refreshes an entry's time).
* **Atomic across processes**: an entry is written to a temporary file in the
  same directory and renamed into place (`os.replace`), so a reader sees a
  whole entry or none; each entry carries a checksum of its bytes, and one
  that does not match (or does not load) is deleted and compiled again.
  No locks: an entry evicted under a reader is a miss, never a torn read.
* **Degrades, once**: a directory that cannot be written (read-only, full
  disk, no permission) turns the cache off with one `pj.CacheWarning`, and
  calls go on compiling as without a cache.

Bucket memory: the buckets a traced program converged to are kept in
`buckets/<hash>.json`, keyed by a hash of the traced jaxpr, its specs, the
JAX version and the platform (never a function name), so a second run of the
same program starts in those buckets (`_buckets.cost_aware.Rental.remember`) and a
remembered bucket costs a load, not a compile, in the cost-aware policy.
A remembered bucket is a hint from a file: entries that are not positive
integers below `MAX_REMEMBERED_SIZE` are dropped here, and the policy uses one
only where it is no larger than a bound from the sizes seen (`cost_aware`).
At most `MAX_REMEMBERED` buckets per program and `MAX_PROGRAMS` programs
are kept (the least recently written memories go).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
import time
from typing import Any

import jax

from .. import _jax as jc
from .._masking.errors import CacheWarning, warn_user
from .compiles import record_load

DEFAULT_MAX_BYTES = 1 << 30
MAX_REMEMBERED = 64       # buckets remembered per traced program
MAX_PROGRAMS = 1024       # traced programs remembered (the least recently written go)
MAX_REMEMBERED_SIZE = 2**31 - 1  # no remembered bucket at or past int32's range
SUFFIX = "-cache"         # an entry's suffix (only these count toward the bound)
MAGIC = b"polyjit-program-1\n"  # then the payload's sha256, then the payload

_lock = threading.RLock()
_state: dict[str, Any] = {"decided": False, "dir": None, "disabled": False,
                          "warned": False, "explicit": None, "programs": None,
                          "size_warned": False}


def write_atomically(path: str, data: bytes) -> None:
  """Writes `data` to `path` through a temporary file in the same directory:
  a reader sees all of it or nothing (the temporary file is removed on failure)."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    raise


def default_dir() -> str:
  env = os.environ.get("POLYJIT_CACHE_DIR")
  if env:
    return os.path.abspath(os.path.expanduser(env))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return os.path.abspath(os.path.expanduser(os.path.join(base, "polyjit")))


def _env_disabled() -> bool:
  return os.environ.get("POLYJIT_NO_CACHE", "").strip().lower() not in ("", "0", "false", "no")


_SIZE = re.compile(r"(?P<number>[0-9][0-9_]*(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*"
                   r"(?P<unit>(?:[kmgt](?:i?b)?)|b)?", re.IGNORECASE)
_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):  # K, M, G, T and KiB..: binary; KB..: decimal
  _UNITS[_p] = _UNITS[_p + "ib"] = 1024 ** _i
  _UNITS[_p + "b"] = 1000 ** _i


def parse_size(text: str) -> int | None:
  """Bytes written as users write them (`1073741824`, `1e9`, `500M`, `1G`,
  `1GiB`, `1.5GB`), or None for anything else (zero and negatives included)."""
  m = _SIZE.fullmatch(text.strip())
  if m is None:
    return None
  try:
    value = float(m["number"].replace("_", "")) * _UNITS[(m["unit"] or "").lower()]
  except (ValueError, OverflowError):
    return None
  if not math.isfinite(value) or value < 1:
    return None
  return int(value)


def _max_bytes() -> int:
  env = os.environ.get("POLYJIT_CACHE_MAX_BYTES")
  if not env:
    return DEFAULT_MAX_BYTES
  size = parse_size(env)
  if size is None:
    if not _state["size_warned"]:
      _state["size_warned"] = True
      warn_user(f"POLYJIT_CACHE_MAX_BYTES={env!r} is not a size polyjit reads; the "
                f"on-disk cache keeps its default bound ({DEFAULT_MAX_BYTES >> 30} GiB). "
                "Write it as bytes (1073741824 or 1e9) or with a unit (500M, 1G, 1GiB, "
                "1GB).", CacheWarning)
    return DEFAULT_MAX_BYTES
  return size


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


class DiskCache:
  """A directory of entries (bytes by key): checksummed atomic writes, LRU size bound."""

  def __init__(self, path: str, max_bytes: int) -> None:
    self.path = path
    self.max_bytes = max_bytes
    self.failed = False
    os.makedirs(path, exist_ok=True)

  def _file(self, key: str) -> str:
    return os.path.join(self.path, key + SUFFIX)

  def get(self, key: str) -> bytes | None:
    """The bytes stored under `key`; None if there are none or they are damaged
    (a damaged entry is deleted)."""
    if not key:
      raise ValueError("key cannot be empty")
    name = self._file(key)
    try:
      with open(name, "rb") as f:
        value = f.read()
    except OSError:
      return None
    head = len(MAGIC) + 32
    payload = value[head:]
    if value[:len(MAGIC)] != MAGIC or hashlib.sha256(payload).digest() != value[len(MAGIC):head]:
      self.discard(key)
      return None
    try:
      os.utime(name)  # recently used: evicted last
    except OSError:
      pass
    return payload

  def discard(self, key: str) -> None:
    try:
      os.unlink(self._file(key))
    except OSError:
      pass

  def put(self, key: str, payload: bytes) -> None:
    if not key:
      raise ValueError("key cannot be empty")
    value = MAGIC + hashlib.sha256(payload).digest() + payload
    if self.failed or len(value) > self.max_bytes:
      return
    name = self._file(key)
    if os.path.exists(name):
      return
    try:
      write_atomically(name, value)
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
  """Turns polyjit's on-disk cache off in this process."""
  with _lock:
    _state.update(decided=True, disabled=True, dir=None, programs=None)


def ensure() -> None:
  """The default: on the first compile of the process, turn the cache on
  unless opted out."""
  if _state["decided"]:
    return
  with _lock:
    if _state["decided"]:
      return
    _state["decided"] = True
    if _env_disabled():
      _state["disabled"] = True
      return
    _install(default_dir(), _max_bytes())


def _install(root: str, max_bytes: int) -> str | None:
  xla = os.path.join(root, "xla")
  why = _writable(xla) or _writable(os.path.join(root, "buckets"))
  if why is not None:
    _state.update(dir=None, disabled=True, programs=None)
    _warn_once(f"polyjit's compilation cache at {root} cannot be used ({why}); "
               "programs are compiled without it. Set POLYJIT_CACHE_DIR to a writable "
               "directory, or POLYJIT_NO_CACHE=1 to silence this.")
    return None
  _state.update(dir=root, programs=DiskCache(xla, max_bytes))
  return xla


def root() -> str | None:
  """The cache's directory when polyjit's cache (or its bucket memory) is on."""
  ensure()
  if _state["disabled"]:
    return None
  return _state["dir"] or _state["explicit"] or default_dir()


def root_if_decided() -> str | None:
  """`root()` where the first compile (or `enable`) has turned the cache on,
  else None: nothing decided, created or warned here (the probes' memo asks
  before any compile: `probe_memo.py`)."""
  if not _state["decided"] or _state["disabled"]:
    return None
  found: str | None = _state["dir"] or _state["explicit"]
  return found


# --- programs ---------------------------------------------------------------------

def _entry_name(name: str, key: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.]", "_", name)[:80] + "-" + key


def load_or_compile(lowered: Any, name: str, keep: bool, kept: list[bytes] | None = None) -> Any:
  """The program `lowered` compiles to: loaded from polyjit's directory when an
  earlier compile (this process or another) kept it, else compiled, and kept
  when `keep` (single-device programs) and the cache is on. A load is reported
  to `count_compiles` as a load, not a compile. `kept` receives the program's
  bytes, loaded or written (a loaded executable cannot be serialized again:
  `_jit/inline.py` loads these bytes onto its own client)."""
  ensure()
  cache: DiskCache | None = _state["programs"]
  # (a device chosen with `jax_default_device` may be on another backend than
  # the one a load would put the program on: such programs are not kept)
  if cache is None or not keep or cache.failed or jc.default_device_chosen():
    return lowered.compile()
  entry = _entry_name(name, jc.program_key(lowered))
  data = cache.get(entry)
  if data is not None:
    t0 = time.perf_counter()
    try:
      program = jc.load_program(data, lowered)
    except Exception:  # a miss, compiled again: written by a JAX that reads
      # differently, damaged, or compiled for another calling convention
      # (`_jax.ProgramMismatch`)
      cache.discard(entry)
    else:
      record_load(name, time.perf_counter() - t0)
      if kept is not None:
        kept.append(data)
      return program
  program = lowered.compile()
  data = jc.serialize_program(program)
  if data is not None:
    cache.put(entry, data)
    if kept is not None:
      kept.append(data)
  return program


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
    envs = [{str(k): v for k, v in env.items()} for env in data["buckets"]]
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return []
  return [env for env in envs if env and all(_sane(v) for v in env.values())]


def _sane(size: Any) -> bool:
  """A remembered size polyjit may pad to: a positive int inside int32's range
  (a file may say anything: 10**12 would allocate terabytes)."""
  return type(size) is int and 0 < size <= MAX_REMEMBERED_SIZE


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
    write_atomically(path, json.dumps({"buckets": envs, "written": time.time()}).encode())
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
