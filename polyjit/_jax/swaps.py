"""JAX functions replaced while polyjit traces (per-trace swaps).

`jnp.searchsorted`, `jnp.interp`, `jnp.linspace`, `jnp.diff`,
`jnp.diag_indices`, `jnp.convolve`, `jnp.correlate` and `lax.fori_loop` cannot be traced (or, for fori_loop, reverse-differentiated)
by JAX when a size they depend on is symbolic; `jnp.nonzero`, `jnp.where`,
`jnp.unique`, boolean indexing and their kin create sizes from data.
`_spellings/replacements.py` and `_masking/data_dependent.py` have exact replacements, registered
*keyed by the JAX function object they replace* (`register_spellings({
jnp.searchsorted: searchsorted, ...})`). `trace_spellings()` puts them in
place for the duration of polyjit's symbolic trace (`_masking.trace.trace_flat`) at
the module attributes `SWAP_SITES`: the public names, plus the module globals
through which JAX's own functions reach them (`Array.searchsorted` and
`jnp.digitize` call `lax_numpy.searchsorted`), and the builtin `len`, whose
answer for a traced array with a dynamic leading axis is its symbolic size
(`_spellings/length.py`). Each site must hold one of the
registered function objects: a JAX that moves, renames or wraps one fails the
probe (`probes.py`) with a clear error before anything is installed, never
silently.

Patching a module is global to the process, so each installed wrapper checks
a thread-local depth: in a thread that is not inside `trace_spellings()` it
calls JAX's original at once. The first block to enter (over all threads)
installs, the last to leave restores what it found; nesting is counted.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from typing import Any, Callable, Iterator

from jax._src.numpy import indexing as _indexing
from jax._src.numpy import lax_numpy as _lax_numpy
from jax._src.scipy import signal as _signal

from .registry import JaxBoundaryError

#: The function behind `Array.__getitem__` (boolean masks: `x[x > 0]`).
ARRAY_GETITEM: Callable[..., Any] = _indexing.rewriting_take

#: The direct N-d convolution behind `jax.scipy.signal.convolve`, `correlate`
#: and `convolve2d` (it swaps its operands on comparing their sizes).
CONVOLVE_ND: Callable[..., Any] = _signal._convolve_nd

#: The count of entries `jnp.triu_indices`/`tril_indices` select (a module global).
TRIU_SIZE: Callable[..., Any] = _lax_numpy._triu_size

#: The 1-d convolution behind `jnp.convolve` and `jnp.correlate`.
CONV_1D: Callable[..., Any] = _lax_numpy._conv

#: Module attributes that hold a replaced function (module, attribute).
SWAP_SITES: tuple[tuple[str, str], ...] = (
    ("jax.numpy", "searchsorted"),
    ("jax._src.numpy.lax_numpy", "searchsorted"),
    ("jax.numpy", "interp"),
    ("jax.numpy", "linspace"),
    ("jax.numpy", "diff"),
    ("jax.lax", "fori_loop"),
    # `jnp.diag(x, k)` and `Array.diagonal` reach it through `lax_numpy.diagonal`.
    ("jax.numpy", "diagonal"),
    ("jax._src.numpy.lax_numpy", "diagonal"),
    # Data-dependent sizes (issue 14, `_masking/data_dependent.py`): the public names,
    # `lax_numpy.nonzero` (through which `Array.nonzero` reaches it) and the
    # function behind `Array.__getitem__`.
    ("jax.numpy", "nonzero"),
    ("jax._src.numpy.lax_numpy", "nonzero"),
    ("jax.numpy", "flatnonzero"),
    ("jax.numpy", "argwhere"),
    ("jax.numpy", "where"),
    ("jax.numpy", "compress"),
    ("jax.numpy", "extract"),
    ("jax.numpy", "unique"),
    ("jax._src.numpy.indexing", "rewriting_take"),
    # `jax.scipy.signal.convolve`/`correlate` call it as a module global (issue 33).
    ("jax._src.scipy.signal", "_convolve_nd"),
    # `len(x)` of a dynamic leading axis answers its symbolic size from user code
    # (`_spellings/length.py`): Python looks the name up in builtins at each call.
    ("builtins", "len"),
    # At a dynamic size (`_spellings/indices.py`); `diag_indices_from` and
    # `fill_diagonal` reach `diag_indices` through the module global.
    ("jax.numpy", "diag_indices"),
    ("jax._src.numpy.lax_numpy", "diag_indices"),
    ("jax._src.numpy.lax_numpy", "_triu_size"),
    # `jnp.convolve`/`jnp.correlate` call it as a module global (so a reference
    # to them taken before the trace is intercepted too).
    ("jax._src.numpy.lax_numpy", "_conv"),
    # NumPyro's validation runs under it (`compile_time.py`); JAX's own code calls
    # `core.ensure_compile_time_eval`, which stays JAX's.
    ("jax", "ensure_compile_time_eval"),
    # Built from a static length / a NumPy array of the sizes (`_spellings/scans.py`).
    ("jax.lax", "associative_scan"),
    ("jax.lax", "index_take"),
    # At a size that may be 0 (`_spellings/along_axis.py`); JAX's own functions
    # (`jnp.quantile`, `jnp.linalg.svd`) call it through `indexing`.
    ("jax.numpy", "take_along_axis"),
    ("jax._src.numpy.indexing", "take_along_axis"),
)

_spelling_replacements: dict[Callable[..., Any], Callable[..., Any]] = {}  # JAX's fn -> ours
_spelling_lock = threading.Lock()
_spelling_local = threading.local()
_spelling_users = 0                      # open trace_spellings() blocks, all threads
_spelling_saved: list[tuple[Any, str, Any]] = []


def original_of(fn: Callable[..., Any]) -> Callable[..., Any]:
  """JAX's function behind `fn` (itself, or what an installed wrapper wraps)."""
  original: Callable[..., Any] = getattr(fn, "_polyjit_spelling", fn)
  return original


def spellings_active() -> bool:
  """Whether this thread is inside `trace_spellings()`."""
  return getattr(_spelling_local, "depth", 0) > 0


_wrappers: dict[tuple[Callable[..., Any], Callable[..., Any]], Callable[..., Any]] = {}


def _spelling_wrapper(original: Callable[..., Any],
                      replacement: Callable[..., Any]) -> Callable[..., Any]:
  """The wrapper installed at a site: made once per (original, replacement)
  and installed again by every later trace (it decides per call, from this
  thread's depth, so one object serves every trace)."""
  wrapper = _wrappers.get((original, replacement))
  if wrapper is None:
    wrapper = _wrappers[(original, replacement)] = _make_spelling_wrapper(original, replacement)
  return wrapper


def _make_spelling_wrapper(original: Callable[..., Any],
                           replacement: Callable[..., Any]) -> Callable[..., Any]:
  @functools.wraps(original)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    if getattr(_spelling_local, "depth", 0) > 0:
      return replacement(original, *args, **kwargs)
    return original(*args, **kwargs)
  setattr(wrapper, "_polyjit_spelling", original)
  return wrapper


def register_spellings(replacements: dict[Callable[..., Any], Callable[..., Any]]) -> None:
  """Gives the replacements, keyed by the JAX function each replaces (each
  called as `fn(original, *args, **kwargs)`); called by `_spellings` and
  `_data_dependent` when imported, so that this module imports nothing of
  polyjit's."""
  for original, replacement in replacements.items():
    key = original_of(original)
    if key in _spelling_replacements and _spelling_replacements[key] is not replacement:
      raise ValueError(f"two replacements registered for {key!r}")
    _spelling_replacements[key] = replacement


def replacement_of(original: Callable[..., Any]) -> Callable[..., Any] | None:
  """polyjit's replacement of a JAX function, or None."""
  return _spelling_replacements.get(original_of(original))


def as_called_by_name(fun: Callable[..., Any]) -> Callable[..., Any]:
  """`fun` as polyjit traces it. A user may pass a function polyjit replaces
  (`pj.jit(jnp.unique)`) where another would write `lambda v: jnp.unique(v)`:
  the swap at its site never reaches the object passed in, so that object is
  called through the wrapper a site holds while spellings are in place (the
  replacement inside `trace_spellings()`, JAX's own outside it), and both
  spellings trace alike. Any other function is returned as it is."""
  try:
    original = original_of(fun)
    replacement = _spelling_replacements.get(original)
  except TypeError:  # (an unhashable callable: not a JAX function)
    return fun
  return fun if replacement is None else _spelling_wrapper(original, replacement)


def site_plan() -> list[tuple[Any, str, Any, Callable[..., Any], Callable[..., Any]]]:
  """(module, attribute, current value, JAX's function, its replacement) of
  every site; raises when a site is missing or holds no registered function."""
  plan = []
  for module_name, attr in SWAP_SITES:
    module = importlib.import_module(module_name)
    current = getattr(module, attr)          # AttributeError: JAX renamed it
    original = original_of(current)
    replacement = _spelling_replacements.get(original)
    if replacement is None:
      raise LookupError(f"{module_name}.{attr} is {original!r}, which is not a function "
                        "polyjit replaces (JAX changed it)")
    plan.append((module, attr, current, original, replacement))
  return plan


class SpellingsNotRegistered(JaxBoundaryError):
  """No replacement is registered: `polyjit._spellings` was not imported (an
  import order, not a change in JAX). A `JaxBoundaryError`, so that it reaches
  the user as it is instead of as an error of their function."""


def _check_registered() -> None:
  if not _spelling_replacements:  # nothing registered: an import order, not JAX's change
    raise SpellingsNotRegistered("polyjit's exact replacements of JAX spellings are not registered: "
                      "`polyjit._spellings` registers them when imported, and "
                      "`polyjit/__init__.py` imports it first; import polyjit (the "
                      "package), not a module of it alone")


def _install_spellings() -> None:
  _check_registered()  # (before the probe, which would blame JAX)
  from .registry import SWAPS, require
  require(SWAPS)
  # Resolve every site before patching any: a missing one raises with
  # nothing half-installed.
  plan = site_plan()
  _spelling_saved[:] = [(module, attr, current) for module, attr, current, _, _ in plan]
  for module, attr, _, original, replacement in plan:
    setattr(module, attr, _spelling_wrapper(original, replacement))


def _restore_spellings() -> None:
  for module, attr, value in reversed(_spelling_saved):
    setattr(module, attr, value)
  _spelling_saved.clear()


@contextlib.contextmanager
def trace_spellings() -> Iterator[None]:
  """Within the block, this thread's calls of the functions at `SWAP_SITES`
  go to polyjit's exact replacements where a size they need is symbolic."""
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
