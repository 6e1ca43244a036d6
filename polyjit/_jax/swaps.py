"""JAX spellings replaced while polyjit traces (per-trace swaps)."""
from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from typing import Any, Callable, Iterator

# --- JAX spellings replaced while polyjit traces (issue 10) -------------------------
#
# `jnp.searchsorted`, `jnp.interp`, `jnp.linspace`, `jnp.diff` and
# `lax.fori_loop` cannot be traced (or, for fori_loop, reverse-differentiated)
# by JAX when a size they depend on is symbolic. `_spellings.py` has exact
# replacements; `trace_spellings()` puts them in place of JAX's functions for
# the duration of polyjit's symbolic trace (`_mask.trace_flat`). The targets
# are module attributes: the public names, plus the module globals through
# which JAX's own functions reach them (`Array.searchsorted`, `jnp.digitize`
# call `lax_numpy.searchsorted`). A JAX that moves or renames one fails loudly
# here (`getattr` raises) and in tests/test_spellings.py, never silently.
#
# Patching a module is global to the process, so each installed wrapper checks
# a thread-local depth: in a thread that is not inside `trace_spellings()` it
# calls JAX's original at once. The first block to enter (over all threads)
# installs, the last to leave restores what it found; nesting is counted.

SPELLING_TARGETS: tuple[tuple[str, str, str], ...] = (
    # (module, attribute, replacement in polyjit._spellings)
    ("jax.numpy", "searchsorted", "searchsorted"),
    ("jax._src.numpy.lax_numpy", "searchsorted", "searchsorted"),
    ("jax.numpy", "interp", "interp"),
    ("jax.numpy", "linspace", "linspace"),
    ("jax.numpy", "diff", "diff"),
    ("jax.lax", "fori_loop", "fori_loop"),
    # Data-dependent sizes (issue 14, `_data_dependent.py`): the public names,
    # `lax_numpy.nonzero` (through which `Array.nonzero` reaches it) and the
    # function behind `Array.__getitem__` (boolean masks: `x[x > 0]`).
    ("jax.numpy", "nonzero", "nonzero"),
    ("jax._src.numpy.lax_numpy", "nonzero", "nonzero"),
    ("jax.numpy", "flatnonzero", "flatnonzero"),
    ("jax.numpy", "argwhere", "argwhere"),
    ("jax.numpy", "where", "where"),
    ("jax.numpy", "compress", "compress"),
    ("jax.numpy", "extract", "extract"),
    ("jax.numpy", "unique", "unique"),
    ("jax._src.numpy.indexing", "rewriting_take", "getitem"),
)

_spelling_replacements: dict[str, Callable[..., Any]] = {}   # filled by `_spellings` at import
_spelling_lock = threading.Lock()
_spelling_local = threading.local()
_spelling_users = 0                      # open trace_spellings() blocks, all threads
_spelling_saved: list[tuple[Any, str, Any]] = []


def spellings_active() -> bool:
  """Whether this thread is inside `trace_spellings()`."""
  return getattr(_spelling_local, "depth", 0) > 0


def _spelling_wrapper(original: Callable[..., Any],
                      replacement: Callable[..., Any]) -> Callable[..., Any]:
  @functools.wraps(original)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    if getattr(_spelling_local, "depth", 0) > 0:
      return replacement(original, *args, **kwargs)
    return original(*args, **kwargs)
  setattr(wrapper, "_polyjit_spelling", original)
  return wrapper


def register_spellings(replacements: dict[str, Callable[..., Any]]) -> None:
  """Gives the replacements (name -> `fn(original, *args, **kwargs)`); called
  by `_spellings` when it is imported, so that this module imports nothing of
  polyjit's."""
  _spelling_replacements.update(replacements)


def _install_spellings() -> None:
  # Resolve every target before patching any: a missing one raises with
  # nothing half-installed.
  plan = []
  for module_name, attr, name in SPELLING_TARGETS:
    module = importlib.import_module(module_name)
    current = getattr(module, attr)          # AttributeError: JAX renamed it
    original = getattr(current, "_polyjit_spelling", current)
    replacement = _spelling_replacements[name]  # KeyError: `_spellings` not imported
    plan.append((module, attr, current, _spelling_wrapper(original, replacement)))
  _spelling_saved[:] = [(module, attr, current) for module, attr, current, _ in plan]
  for module, attr, _, wrapper in plan:
    setattr(module, attr, wrapper)


def _restore_spellings() -> None:
  for module, attr, value in reversed(_spelling_saved):
    setattr(module, attr, value)
  _spelling_saved.clear()


@contextlib.contextmanager
def trace_spellings() -> Iterator[None]:
  """Within the block, this thread's calls of the `SPELLING_TARGETS` go to
  polyjit's exact replacements where a size they need is symbolic."""
  global _spelling_users
  with _spelling_lock:
    if _spelling_users == 0:
      _install_spellings()
    _spelling_users += 1
  depth = getattr(_spelling_local, "depth", 0)
  _spelling_local.depth = depth + 1
  try:
    yield
  finally:
    _spelling_local.depth = depth
    with _spelling_lock:
      _spelling_users -= 1
      if _spelling_users == 0:
        _restore_spellings()
