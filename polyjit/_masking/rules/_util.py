"""Helpers shared by rule families: moving data along a padded axis, and the
identities that reductions fill padding with.

Rules that change where data starts (reverse, concatenate at a logical offset,
slice from a logical start) re-anchor it with `place`, which moves data by a
traced amount without any clamping surprise: the source is padded on both
sides first, so `dynamic_slice` never has to clamp its start.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import dims as _dims
from ... import _jax as jc


def _pad_axis(x: Any, axis: int, low: int, high: int) -> Any:
  config = [(0, 0, 0)] * x.ndim
  config[axis] = (low, high, 0)
  return lax.pad(x, np.zeros((), x.dtype), config)


def place(x: Any, axis: int, offset: Any, out_size: int) -> Any:
  """An array of length `out_size` along `axis` with `y[offset + i] = x[i]`.

  `offset` is an int or a traced int scalar in `[-x.shape[axis], out_size]`;
  a negative offset moves data towards 0 (drops its first `-offset` entries).
  Entries of `y` that no entry of `x` lands on are unspecified.
  """
  length = x.shape[axis]
  if isinstance(offset, (int, np.integer)):
    return _pad_axis(x, axis, int(offset), out_size - int(offset) - length)
  buf = _pad_axis(x, axis, out_size, out_size)
  starts = [np.zeros((), offset.dtype)] * x.ndim
  starts[axis] = out_size - offset
  sizes = list(x.shape)
  sizes[axis] = out_size
  return lax.dynamic_slice(buf, starts, sizes)


def pad_high(x: Any, axis: int, extra: int) -> Any:
  """`x` with `extra` unspecified entries appended along `axis`."""
  return _pad_axis(x, axis, 0, extra) if extra else x


def needs_room(op_dim: Any, window_dim: Any) -> bool:
  """Whether a window at a logically clamped start may overrun the padded axis.

  A window of size `w` starts at most at `op - w` (logically) and, padded,
  ends at `start + padded(w)`. When `op`, `w` and `op - w` all never decrease
  as the dimensions grow, padded sizes are values at the padded point and
  that end is at most `padded(op)`. Otherwise (`w = n - m`, whose padded size
  is an upper bound, see `MaskEnv.padded`) the operand needs `padded(w)`
  extra entries, which is enough: the largest start is below `padded(op)`.
  Without the room, XLA would move the start to make the window fit.
  """
  if not (jc.is_symbolic_dim(op_dim) or jc.is_symbolic_dim(window_dim)):
    return False
  return not all(map(_dims.is_monotone_dim, (op_dim, window_dim, op_dim - window_dim)))


def clamp_index(index: Any, upper: Any) -> Any:
  """`index` clamped to [0, upper] in the index's dtype (upper may be traced)."""
  upper = lax.convert_element_type(upper, index.dtype)
  lower = np.zeros((), index.dtype)
  return lax.max(lower, lax.min(index, upper))


def identity_value(kind: str, dtype: Any) -> Any:
  """The identity of a reduction `kind` ('add', 'mul', 'max', 'min', 'and',
  'or', 'xor', 'logaddexp') for `dtype`, as a NumPy scalar."""
  dtype = np.dtype(dtype)
  if kind in ("add", "or", "xor"):
    return np.zeros((), dtype)[()]
  if kind == "mul":
    return np.ones((), dtype)[()]
  if kind == "and":  # all bits set
    return (np.ones((), dtype) if dtype == np.bool_ else ~np.zeros((), dtype))[()]
  if kind in ("max", "logaddexp"):
    return _extreme(dtype, low=True)
  if kind == "min":
    return _extreme(dtype, low=False)
  raise ValueError(kind)


def _extreme(dtype: np.dtype[Any], low: bool) -> Any:
  if dtype == np.bool_:
    return np.bool_(not low)
  if jnp.issubdtype(dtype, jnp.integer):
    ints = jnp.iinfo(dtype)  # type: ignore[no-untyped-call, unused-ignore]  # JAX stub gap: iinfo.__init__ unannotated (strict mode only)
    return np.asarray(ints.min if low else ints.max, dtype)[()]
  info = jnp.finfo(dtype)  # type: ignore[no-untyped-call, unused-ignore]  # JAX stub gap: finfo.__init__ unannotated (strict mode only)
  inf = np.asarray(np.inf, dtype)
  if np.isinf(inf):
    return (-inf if low else inf)[()]
  return np.asarray(info.min if low else info.max, dtype)[()]
