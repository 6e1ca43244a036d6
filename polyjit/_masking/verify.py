"""The checking mode: every call computed again the plain way, and compared.

Some ways of asking a question of a size cannot be seen by any hook
(`isinstance(n, int)`, a size smuggled through `id()` or a C extension). The
checking mode is the sanitizer for those, like `JAX_DEBUG_NANS`: turned on
with `POLYJIT_VERIFY=1` in the environment (read at import: every thread) or
`pj.verify()` (a switch for the calling thread, and a context manager that
restores that thread's previous state, as `jax.debug_nans` is), it makes

* every `pj.jit` / `pj.filter_jit` call also run `jax.jit` of the same
  function at the exact shapes, first (so donated buffers are still alive),
  and compare every output leaf;
* every `pj.mask` call with concrete sizes also run the function on the
  arguments sliced to their logical shapes, and compare the valid region;
* every `pj.vmap` call over `pj.Ragged` values with concrete lengths (and
  `out_axes=0`) also run the function on each example unpadded, and compare
  that example's outputs;
* a traced size outside `[0, padded]` (or 0 where the function's empty path
  fails), or violating a declared constraint, raise `SizeRangeError` instead of
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
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from . import dims as _dims, spec as _spec
from .errors import PolyjitError
from .padding import is_key_dtype

ENV = "POLYJIT_VERIFY"
_default = os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no", "off")
_local = threading.local()
_ever = _default  # turned on in some thread once (else `enabled` answers at once: every call asks)


class VerificationError(PolyjitError, AssertionError):
  """The checking mode found a result that differs from the unpadded one."""


class verify:
  """Turns the checking mode on (`pj.verify()`) or off (`pj.verify(False)`)
  in the calling thread; as a context manager, for the block only. Like
  `with jax.debug_nans(True):`, it is per thread: other threads keep their own
  state (the process default: on with POLYJIT_VERIFY=1, else off)."""

  def __init__(self, on: bool = True) -> None:
    global _ever
    self._previous: bool | None = getattr(_local, "on", None)
    _local.on = bool(on)
    _ever = _ever or bool(on)

  def __enter__(self) -> "verify":
    return self

  def __exit__(self, *exc: Any) -> None:
    _local.on = self._previous


def enabled() -> bool:
  """Whether calls are checked now (in this thread)."""
  if not _ever:
    return False
  on = getattr(_local, "on", None)
  return (_default if on is None else on) and not getattr(_local, "inside", False)


class Inside:
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
    with Inside():
      return run(*args, **kwargs)
  want = reference(*args, **kwargs)
  with Inside():
    got = run(*args, **kwargs)
  shapes = [tuple(np.shape(x)) for x in jax.tree.leaves((args, kwargs))]
  compare(name, f"argument shapes {shapes}", got, want, (args, kwargs))
  return got


MAX_RTOL = 0.25   # a factor of 2 (or 1/2) never passes, whatever the dtype


def _tolerance(dtype: np.dtype[Any], length: int) -> float | None:
  """The relative tolerance of an inexact output: polyjit sums reductions in
  another order over padded arrays, whose rounding grows with the number of
  terms (about its square root for the usual sums); float16 and bfloat16
  then reach the cap, which a wrong factor of 2 still exceeds."""
  if np.issubdtype(dtype, np.inexact) or is_bfloat16(dtype):
    eps = float(jnp.finfo(dtype).eps)  # type: ignore[no-untyped-call]
    return min(eps * 256 * float(np.sqrt(max(length, 16))), MAX_RTOL)
  return None


def is_bfloat16(dtype: np.dtype[Any]) -> bool:
  return bool(np.dtype(dtype) == jnp.bfloat16)


def _inputs_scale(inputs: Any) -> tuple[int, float]:
  """The longest input (the reduction length it allows) and the largest
  finite magnitude of the float inputs."""
  length, magnitude = 1, 0.0
  for x in jax.tree.leaves(inputs):
    if not hasattr(x, "shape") or isinstance(x, jc.Tracer):
      continue
    length = max(length, int(np.size(x)))
    a = np.asarray(x)
    if a.dtype.kind in "fc" or is_bfloat16(a.dtype):
      finite = np.abs(a[np.isfinite(a)]).astype(np.float64)
      magnitude = max(magnitude, float(np.max(finite, initial=0.0)))
  return length, magnitude


def compare(name: str, sizes: str, got: Any, want: Any, inputs: Any = ()) -> None:
  """Raises `VerificationError` at the first output leaf where `got` differs
  from `want` beyond float rounding (exact for integers and bools).

  Rounding is judged relative to each value's own magnitude and the leaf's
  largest (never an absolute floor of 1, under which values near 1e-4, or
  float16 values below 1, passed at twice their value), widened by the
  rounding a reduction over `inputs` in another order can make: about
  eps * length * their largest magnitude (where a sum cancels). So a wrong
  factor of 2 passes only for a value below that rounding noise of its own
  inputs, which no order of summation can tell from zero."""
  length, magnitude = _inputs_scale(inputs)
  got_paths, got_tree = jax.tree_util.tree_flatten_with_path(got)
  want_paths, want_tree = jax.tree_util.tree_flatten_with_path(want)
  if str(got_tree) != str(want_tree):
    raise VerificationError(f"{name} called with {sizes}: its output structure is "
                            f"{got_tree}, unpadded {want_tree}.")
  for (path, g), (_, w) in zip(got_paths, want_paths, strict=True):
    where = f"output {jax.tree_util.keystr(path)}" if path else "the output"
    if not hasattr(w, "shape") or not hasattr(g, "shape"):
      if g != w:
        raise VerificationError(f"{name} called with {sizes}: {where} is {g!r}, "
                                f"unpadded {w!r}.")
      continue
    if is_key_dtype(w.dtype):
      continue  # typed keys: compared through what they generate
    g, w = np.asarray(g), np.asarray(w)
    problem = None
    if g.shape != w.shape or g.dtype != w.dtype:
      problem = f"has shape/dtype {g.shape} {g.dtype}, unpadded {w.shape} {w.dtype}"
    else:
      tol = _tolerance(w.dtype, length)
      if tol is None:
        bad = g != w
      else:
        g64, w64 = g.astype(np.complex128 if g.dtype.kind == "c" else np.float64), \
            w.astype(np.complex128 if w.dtype.kind == "c" else np.float64)
        scale = float(np.max(np.abs(np.where(np.isfinite(w64), w64, 0)), initial=0.0))
        eps = float(jnp.finfo(w.dtype).eps)  # type: ignore[no-untyped-call]
        atol = tol * scale + eps * length * magnitude
        bad = ~(np.isclose(g64, w64, rtol=tol, atol=atol, equal_nan=True))
      if np.any(bad):
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        problem = f"differs at index {i}: {g[i]!r}, unpadded {w[i]!r}"
    if problem is not None:
      raise VerificationError(
          f"{name} called with {sizes}: {where} {problem}.\nThe unpadded program "
          "(jax.jit at the exact shapes) disagrees with polyjit's: a size decision "
          "polyjit could not see (isinstance(n, int), a size passed through a cache or "
          "a C extension) or a polyjit bug. Please report it with the function.")


def check_call(masked: Any, args: Sequence[Any], binding: Any,
               logical_env: Any, result: Any) -> None:
  """`masked` (a `pj.mask` result) run on `args`: `fun` on the arguments
  sliced to their logical shapes agrees with the valid region of `result`
  (concrete sizes only; under a transformation there is nothing to compare)."""
  if not all(_spec.is_concrete(logical_env[k]) for k in binding.dim_names):
    return
  if any(isinstance(x, jc.Tracer) for x in jax.tree.leaves((tuple(args), result))):
    return
  sizes = {k: int(logical_env[k]) for k in binding.dim_names}
  leaves, tree = jax.tree.flatten(tuple(args))
  sliced = [np.asarray(x)[tuple(slice(0, _dims.evaluate_dim(d, sizes))
                                for d in leaf.symbolic_shape)]
            for x, leaf in zip(leaves, binding.leaves, strict=True)]
  # (as JAX arrays: `v.sum() * 2.` on a NumPy array computes in NumPy's types)
  want = masked.fun(*jax.tree.unflatten(tree, [jnp.asarray(x) for x in sliced]))
  got = masked.unpad(result, args, sizes)
  compare(repr(masked), f"sizes {sizes}", got, want, sliced)
