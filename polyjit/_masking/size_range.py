"""Traced logical sizes outside `[0, padded]`: never a plausible number.

A traced size comes from the user's own program (`jax.jit(pj.mask(f))`, a
`pj.Ragged` built inside `jax.jit`, `jax.vmap` over sizes), where nothing can
raise at run time. A size below 0 or above its padded size has no unpadded
computation to match, nor has an empty size whose own trace fails (JAX
refuses `jnp.max` of an empty array; `_masking/empty.py`), nor, for a
function that creates data-dependent sizes (or a path that only runs where
its sizes are >= 1), a size of 0, so such a call's outputs are *poisoned* instead of
computed on garbage: NaN in floating and complex dtypes, the dtype's minimum
in signed integers, its maximum in unsigned ones, False in bools (the values
the pj.mask and Ragged guides document). Under the checking mode
(`POLYJIT_VERIFY=1` or `pj.verify(True)`, `_masking/verify.py`) the call raises
`pj.SizeRangeError` instead, from a host callback.

Concrete sizes never get here: `_spec.logical_values` refuses them with the
size and the bound.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from . import verify as _verify
from .errors import ShapeError
from .padding import is_key_dtype


class SizeRangeError(ShapeError):
  """A traced logical size was outside `[0, padded size]` (checking mode)."""


def poison_value(dtype: Any) -> Any:
  """What an output of a call with out-of-range sizes holds."""
  if is_key_dtype(dtype):
    return None   # typed keys: nothing to poison
  dtype = np.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.inexact):
    return np.array(np.nan, dtype)
  if dtype == np.bool_:
    return np.array(False)
  if jnp.issubdtype(dtype, jnp.integer):
    info = np.iinfo(dtype)
    return np.array(info.min if info.min < 0 else info.max, dtype)
  return None   # (typed keys, float0: nothing to poison)


def in_range(env: Mapping[str, Any], padded: Mapping[str, int], lowest: int = 1) -> Any:
  """Whether every size of `env` lies in [lowest, padded] (a traced bool).

  In lax, not jnp: this runs in every masked trace with traced sizes, and each
  jnp operator costs a jitted helper's dispatch there (the same comparisons).
  """
  ok: Any = None
  for name, value in env.items():
    dtype = np.dtype(value.dtype)
    here = lax.bitwise_and(lax.ge(value, np.asarray(lowest, dtype)),
                           lax.le(value, np.asarray(padded[name], dtype)))
    ok = here if ok is None else lax.bitwise_and(ok, here)
  return jnp.bool_(True) if ok is None else ok


def _poisoned(o: Any, ok: Any, bad: Any) -> Any:
  """`jnp.where(ok, o, bad)` for a scalar `ok` and a poison `bad` of `o`'s
  dtype, in lax: the poison is not weakly typed, so neither is the result."""
  if jc.typeof(o).weak_type:
    o = lax.convert_element_type(o, o.dtype)   # (weak_type=False)
  shape = np.shape(o)
  pred = lax.broadcast_in_dim(ok, shape, ()) if shape else ok
  return lax.select(pred, o, lax.full_like(o, bad))


def guard(outs: Sequence[Any], env: Mapping[str, Any], padded: Mapping[str, int],
          what: str, *, lowest: int = 1, ok: Any = None) -> list[Any]:
  """`outs`, poisoned where a size of `env` is outside [lowest, padded] or
  `ok` is False (or, checking, an error raised by the call)."""
  if not env:
    return list(outs)
  within = in_range(env, padded, lowest)
  ok = within if ok is None else lax.bitwise_and(within, ok)
  if _verify.enabled():
    names = sorted(env)
    jax.debug.callback(_raise_if_out_of_range, ok, [env[k] for k in names],
                       names=tuple(names), padded=tuple(padded[k] for k in names), what=what)
  guarded = []
  for o in outs:
    bad = poison_value(o.dtype) if hasattr(o, "dtype") else None
    guarded.append(o if bad is None else _poisoned(o, ok, bad))
  return guarded


def _raise_if_out_of_range(ok: Any, values: Sequence[Any], *, names: tuple[str, ...],
                           padded: tuple[int, ...], what: str) -> None:
  if bool(np.all(ok)):
    return
  given = {n: np.asarray(v).tolist() for n, v in zip(names, values, strict=True)}
  bounds = {n: int(np.asarray(p)) for n, p in zip(names, padded, strict=True)}
  raise SizeRangeError(
      f"{what}: a traced logical size is outside [0, padded size], or is 0 where the "
      f"function is not defined for empty arrays: sizes {given}, padded sizes {bounds}. "
      "Each logical size must be at least 0 and at most its padded size (a pj.Ragged "
      "length at most the data's padded length); JAX raises for some functions of "
      "empty arrays (jnp.max without initial=, x[0]).\nWhat to do: pad the arguments "
      "to at least the largest size, fix the sizes passed, or make the function "
      "defined for empty arrays (jnp.max(x, initial=-jnp.inf)).")
