"""JAX's persistent compilation cache, as polyjit's on-disk cache uses it.

JAX reads its process-global cache object `compilation_cache._cache`, built
from `jax_compilation_cache_dir` on first use; polyjit installs its own
(atomic writes, a size bound without the `filelock` package;
`polyjit/_caching/disk.py`). Relied on: the module has `_cache`,
`_cache_initialized`, `_cache_initialized_mutex`, `reset_cache`, and
`compilation_cache_interface.CacheInterface` (JAX 0.4.30 to 0.10).
"""
from __future__ import annotations

import pathlib
from typing import Any

import jax
from jax._src import compilation_cache as _cc
from jax._src import compilation_cache_interface as _cci
from jax._src import config as _config

CompilationCacheBase: Any = _cci.CacheInterface


def pathlib_path(path: str) -> Any:
  return pathlib.Path(path)


def user_compilation_cache_dir() -> str | None:
  """JAX's cache directory when the user (not polyjit) set one."""
  value: str | None = _config.compilation_cache_dir.value
  return value


def install_compilation_cache(cache: Any, path: str) -> None:
  """Makes `cache` JAX's persistent compilation cache (at `path`), for every
  program from now on, however small or quick to compile."""
  _cc.reset_cache()  # forget "no cache" decided by compiles before this one
  jax.config.update("jax_compilation_cache_dir", path)  # type: ignore[no-untyped-call, unused-ignore]
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # type: ignore[no-untyped-call, unused-ignore]
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)  # type: ignore[no-untyped-call, unused-ignore]
  with _cc._cache_initialized_mutex:
    _cc._cache = cache
    _cc._cache_initialized = True


def uninstall_compilation_cache() -> None:
  _cc.reset_cache()
  jax.config.update("jax_compilation_cache_dir", None)  # type: ignore[no-untyped-call, unused-ignore]
