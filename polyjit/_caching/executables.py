"""The executable cache: thread-safe, compile-once, bounded, with background work.

Each entry is a `concurrent.futures.Future` of a compiled program. The first
caller that needs a key compiles it; concurrent callers that need the same key
wait on the same future, so a bucket compiles once however many threads ask.
Past `maxsize` entries the least recently used finished program is dropped
(programs still compiling are never dropped). `submit` compiles in a thread
pool instead, for `precompile` and for background compiles of tighter buckets;
`wait` waits for such futures, with a progress bar when tqdm is installed.
A submitted compile runs under the configuration of the thread that submitted
it (a program traced under `with jax.enable_x64():` is lowered under it too).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from typing import Any, Callable, Hashable, Iterator, Sequence

import jax

from .. import _jax as jc
from . import disk as _disk_cache

try:  # optional: a progress bar for precompile
  from tqdm.auto import tqdm as _tqdm
except ImportError:
  _tqdm = None


class ExecutableCache:

  def __init__(self, maxsize: int = 64, max_workers: int | None = None,
               on_evict: Callable[[Any], None] | None = None):  # gets the owner's keys
    if maxsize < 1:
      raise ValueError(f"cache size must be >= 1, got {maxsize}")
    self.maxsize = maxsize
    self._entries: "collections.OrderedDict[Hashable, concurrent.futures.Future[Any]]" = (
        collections.OrderedDict())
    self._lock = threading.Lock()
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._max_workers = max_workers
    self._on_evict = on_evict
    self.evictions = 0

  def __len__(self) -> int:
    with self._lock:
      return len(self._entries)

  def keys(self) -> list[Hashable]:
    with self._lock:
      return list(self._entries)

  def done(self) -> Iterator[tuple[Hashable, Any]]:
    """(key, program) for every finished, successful compile (a snapshot)."""
    with self._lock:
      items = list(self._entries.items())
    for key, fut in items:
      if fut.done() and not fut.cancelled() and fut.exception() is None:
        yield key, fut.result()

  def peek(self, key: Hashable) -> concurrent.futures.Future[Any] | None:
    with self._lock:
      return self._entries.get(key)

  def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
    """The program for `key`, compiling it here if nobody has yet."""
    fut, owner = self._claim(key)
    if owner:
      self._run(key, fut, build)
    return fut.result()

  def submit(self, key: Hashable, build: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """Starts compiling `key` in the pool unless it is cached or compiling,
    under this thread's configuration (a context manager's x64, promotion,
    ...: JAX keeps those per thread; `jc.in_callers_config`)."""
    fut, owner = self._claim(key)
    if owner:
      self._executor().submit(self._run, key, fut, jc.in_callers_config(build))
    return fut

  def _claim(self, key: Hashable) -> tuple[concurrent.futures.Future[Any], bool]:
    with self._lock:
      fut = self._entries.get(key)
      if fut is not None:
        self._entries.move_to_end(key)
        return fut, False
      fut = concurrent.futures.Future()
      self._entries[key] = fut
      evicted = self._evict()
    if self._on_evict is not None:
      for old in evicted:
        self._on_evict(old)
    return fut, True

  def _run(self, key: Hashable, fut: concurrent.futures.Future[Any],
           build: Callable[[], Any]) -> None:
    try:
      fut.set_result(build())
    except BaseException as e:  # the waiters get the error; a later call retries
      with self._lock:
        if self._entries.get(key) is fut:
          del self._entries[key]
      fut.set_exception(e)

  def _evict(self) -> list[Any]:
    evicted: list[Any] = []
    excess = len(self._entries) - self.maxsize
    for key in list(self._entries):
      if len(evicted) >= excess:
        break
      if self._entries[key].done():
        del self._entries[key]
        evicted.append(key)
    self.evictions += len(evicted)
    return evicted

  def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
    with self._lock:
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix="polyjit-compile")
      return self._pool

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()


def wait(futures: Sequence[concurrent.futures.Future[Any]], *, progress: bool, desc: str) -> None:
  """Waits for `futures`, raising the first error; a tqdm bar if asked and installed."""
  bar = None
  if progress:
    if _tqdm is not None:
      bar = _tqdm(total=len(futures), desc=desc, unit="program")
  try:
    for fut in concurrent.futures.as_completed(futures):
      fut.result()
      if bar is not None:
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()


def enable_persistent_cache(directory: str | None = None, *,
                            max_bytes: int | None = None) -> str | None:
  """Turns on polyjit's on-disk cache of its compiled programs at `directory`.

  It is on by default (see `_caching/disk.py`: location `$POLYJIT_CACHE_DIR`,
  else `~/.cache/polyjit`; opt out with `POLYJIT_NO_CACHE=1` or
  `pj.disable_persistent_cache()`); call this to choose another directory or
  size bound (`max_bytes`, default 1 GiB, least recently used evicted).
  polyjit serializes the programs `pj.jit` compiles itself, so a second
  process loads each bucket's program instead of compiling it; no JAX
  setting is changed (JAX's own persistent cache, which keeps the programs
  of the user's `jax.jit`, `pj.vmap`'s included, stays as the user set it).
  Returns the programs' directory, or None (with one `pj.CacheWarning`) when
  it cannot be written.
  """
  return _disk_cache.enable(directory, max_bytes)


def disable_persistent_cache() -> None:
  """Turns polyjit's on-disk cache off in this process (as `POLYJIT_NO_CACHE=1`).
  JAX's own persistent cache is not polyjit's to turn off: it stays as set."""
  _disk_cache.disable()
