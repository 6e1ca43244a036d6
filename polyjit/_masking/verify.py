"""The checking mode: every call computed again the plain way, and compared.

Some ways of asking a question of a size cannot be seen by any hook
(`isinstance(n, int)`, a size smuggled through `id()` or a C extension). The
checking mode is the sanitizer for those, like `JAX_DEBUG_NANS`: turned on
with `POLYJIT_VERIFY=1` in the environment (read at import) or `pj.verify()`
(a switch, and a context manager that restores the previous state), it makes

* every `pj.jit` / `pj.filter_jit` call also run `jax.jit` of the same
  function at the exact shapes, first (so donated buffers are still alive),
  and compare every output leaf;
* every `pj.mask` call with concrete sizes also run the function on the
  arguments sliced to their logical shapes, and compare the valid region;
* a traced size outside `[0, padded]` (or 0 where the function's empty path
  fails) raise `SizeRangeError` instead of
  poisoning the outputs (`_masking/size_range.py`).

The last is decided when the program is traced: a `jax.jit` around `pj.mask`
traced under the checking mode keeps raising after it is turned off.
A difference beyond float rounding raises `VerificationError`, naming the
function, the argument shapes and the first differing output leaf. The price
is a second compile per shape (what polyjit exists to avoid): turn it on in
test suites, not in production. Calls under a JAX transformation (tracer
arguments) are not checked: there is nothing concrete to compare.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import _jax as jc
from .errors import PolyjitError
from .padding import is_key_dtype

ENV = "POLYJIT_VERIFY"
_on = os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no", "off")
_local = threading.local()


class VerificationError(PolyjitError, AssertionError):
  """The checking mode found a result that differs from the unpadded one."""


class verify:
  """Turns the checking mode on (`pj.verify()`) or off (`pj.verify(False)`);
  as a context manager, for the block only."""

  def __init__(self, on: bool = True) -> None:
    global _on
    self._previous = _on
    _on = bool(on)

  def __enter__(self) -> "verify":
    return self

  def __exit__(self, *exc: Any) -> None:
    global _on
    _on = self._previous


def enabled() -> bool:
  """Whether calls are checked now (in this thread)."""
  return _on and not getattr(_local, "inside", False)


class _Inside:
  """While a checked call runs polyjit itself: not checked again."""

  def __enter__(self) -> None:
    self.previous = getattr(_local, "inside", False)
    _local.inside = True

  def __exit__(self, *exc: Any) -> None:
    _local.inside = self.previous


def _has_tracer(tree: Any) -> bool:
  return any(isinstance(x, jc.Tracer) for x in jax.tree.leaves(tree))


def checked_call(name: str, reference: Callable[..., Any], run: Callable[..., Any],
                 args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
  """`run(*args, **kwargs)`, compared with `reference(*args, **kwargs)`."""
  if _has_tracer((args, kwargs)):
    with _Inside():
      return run(*args, **kwargs)
  want = reference(*args, **kwargs)
  with _Inside():
    got = run(*args, **kwargs)
  shapes = [tuple(np.shape(x)) for x in jax.tree.leaves((args, kwargs))]
  compare(name, f"argument shapes {shapes}", got, want)
  return got


def _tolerance(dtype: np.dtype[Any]) -> float | None:
  if np.issubdtype(dtype, np.inexact):
    # reductions are summed in another order over padded arrays
    return float(np.finfo(dtype).eps) * 1e3
  return None


def compare(name: str, sizes: str, got: Any, want: Any) -> None:
  """Raises `VerificationError` at the first output leaf where `got` differs
  from `want` beyond float rounding (exact for integers and bools)."""
  got_paths, got_tree = jax.tree_util.tree_flatten_with_path(got)
  want_paths, want_tree = jax.tree_util.tree_flatten_with_path(want)
  if str(got_tree) != str(want_tree):
    raise VerificationError(f"{name} called with {sizes}: its output structure is "
                            f"{got_tree}, unpadded {want_tree}.")
  for (path, g), (_, w) in zip(got_paths, want_paths, strict=True):
    where = jax.tree_util.keystr(path) or "the output"
    if not hasattr(w, "shape") or not hasattr(g, "shape"):
      if g != w:
        raise VerificationError(f"{name} called with {sizes}: output {where} is {g!r}, "
                                f"unpadded {w!r}.")
      continue
    if is_key_dtype(w.dtype):
      continue  # typed keys: compared through what they generate
    g, w = np.asarray(g), np.asarray(w)
    problem = None
    if g.shape != w.shape or g.dtype != w.dtype:
      problem = f"has shape/dtype {g.shape} {g.dtype}, unpadded {w.shape} {w.dtype}"
    else:
      tol = _tolerance(w.dtype)
      if tol is None:
        bad = g != w
      else:
        scale = np.max(np.abs(np.where(np.isfinite(w), w, 0)), initial=0.0)
        bad = ~(np.isclose(g, w, rtol=tol, atol=tol * max(float(scale), 1.0), equal_nan=True))
      if np.any(bad):
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        problem = f"differs at index {i}: {g[i]!r}, unpadded {w[i]!r}"
    if problem is not None:
      raise VerificationError(
          f"{name} called with {sizes}: output {where} {problem}.\nThe unpadded program "
          "(jax.jit at the exact shapes) disagrees with polyjit's: a size decision "
          "polyjit could not see (isinstance(n, int), a size passed through a cache or "
          "a C extension) or a polyjit bug. Please report it with the function.")
