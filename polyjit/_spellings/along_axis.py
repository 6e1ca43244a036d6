"""`jnp.take_along_axis` at a size that may be 0.

JAX's `take_along_axis` gathers with slice size 1 along each axis it batches
(where the array and the indices both vary) and along the axis it takes
from, 0 only where that axis's size is the constant 0, and returns zeros
where the axis it takes from has size 0. At a symbolic size that may be 0
(`logits[:-1]`, `n - 1`: a next-token loss `jnp.take_along_axis(
log_softmax(logits[:-1]), targets[1:, None], axis=-1)` on an example of one
token) JAX's gather check `1 <= n - 1` cannot be proven, so the trace held
from n = 2 on only: pj.mask raised pj.MaskingError at n = 1, the padded
pj.vmap refused examples of one token (pj.ShapeError), and a packed pj.vmap
raised pj.MaskingError whatever the lengths, where jax.jit at n = 1 gives an
empty result.

The replacement gathers from arrays one longer along each such axis: the
array and the indices padded at the end with one entry (`n - 1 + 1`, a size
JAX knows is >= 1), JAX's own gather on them, and the result sliced back to
the size `d` each such axis had. Exact at every size:

* an axis JAX batches: entry `i < d` of the result reads entry `i` of the
  array at index `i` of the indices, as unpadded; the padded entry is
  sliced off (at d = 0 the result is empty, as JAX's);
* the axis JAX takes from (size `d`): the indices are made to mean on the
  padded array what they mean at size `d`: wrapped by `d` where JAX wraps
  negative indices; for "fill" (the default) an index >= d is moved past the
  padded entry (out of range there too), a negative one stays out of range
  (with the wrapping off); "clip" and "promise_in_bounds" (which XLA clamps)
  are clamped to `[0, d - 1]`. Where `d` is 0 the result is JAX's zeros.

Only while polyjit traces, and only where such a size is symbolic and may be
0 (its lower bound over sizes >= 1, `_masking.dims.dim_lower_bound`, is 0 or
unknown); everything else goes to JAX's own function unchanged, and so do
"one_hot", and along an axis that may be empty unsigned 32- or 64-bit indices
(whose wrapping would need another dtype) and a JAX whose function has no
`wrap_negative_indices` (0.9: its wrapping cannot be turned off), where the
trace then fails as before (a MaskingError naming the line).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking import dims as _dims

_NO_BOUND = 2 ** 31 - 1
_WRAP = "wrap_negative_indices"


def _may_be_empty(d: Any) -> bool:
  """A symbolic size that may be 0 where every size it mentions is >= 1."""
  if not jc.is_symbolic_dim(d) or isinstance(d, jc.Tracer):
    return False
  low = _dims.dim_lower_bound(d, {v: _NO_BOUND for v in _dims.dim_vars(d)})
  return low is None or low < 1


def take_along_axis(original: Callable[..., Any], arr: Any, indices: Any, axis: Any = -1,
                    mode: Any = None, fill_value: Any = None, **kwargs: Any) -> Any:
  def jaxs() -> Any:
    return original(arr, indices, axis, mode, fill_value, **kwargs)

  shape, idx_shape = np.shape(arr), np.shape(indices)
  if (axis is None or "one_hot" in str(mode).lower()
      or len(shape) != len(idx_shape) or not len(shape)):
    return jaxs()
  try:
    ax = int(axis) % len(shape)
  except TypeError:
    return jaxs()
  batched = [i for i in range(len(shape)) if i != ax
             and not _is_one(idx_shape[i]) and not _is_one(shape[i])
             and _may_be_empty(shape[i])]
  if any(str(shape[i]) != str(idx_shape[i]) for i in batched):
    return jaxs()   # (JAX's own error: the shapes do not broadcast)
  size = shape[ax]
  along = _may_be_empty(size)
  idx_dtype = np.dtype(jnp.result_type(indices))
  if along and (_WRAP not in inspect.signature(original).parameters or not (
      jnp.issubdtype(idx_dtype, jnp.signedinteger) or idx_dtype.itemsize <= 2)):
    return jaxs()   # (a JAX without the parameter: its wrapping cannot be turned off)
  if not batched and not along:
    return jaxs()
  arr, indices = jnp.asarray(arr), jnp.asarray(indices)
  if along:
    indices = _as_on_padded(original, indices, size, mode, kwargs)
    kwargs = dict(kwargs, **{_WRAP: False})
  padded = [*batched, ax] if along else batched
  arr = _pad_end(arr, padded, 0)
  indices = _pad_end(indices, batched, 0)
  out = original(arr, indices, axis, mode, fill_value, **kwargs)
  out = lax.slice(out, (0,) * out.ndim,
                  tuple(shape[i] if i in batched else out.shape[i] for i in range(out.ndim)))
  if along:   # JAX's zeros from an empty axis (where "fill" would give NaN)
    empty = jnp.asarray(size, np.int32) == 0
    out = lax.select(lax.broadcast_in_dim(empty, out.shape, ()), lax.full_like(out, 0), out)
  return out


def _is_one(d: Any) -> bool:
  return not jc.is_symbolic_dim(d) and int(d) == 1


def _pad_end(x: Any, axes: list[int], value: Any) -> Any:
  """`x` with one `value` at the end of each of `axes`."""
  if not axes:
    return x
  config = [(0, 1 if a in axes else 0, 0) for a in range(x.ndim)]
  return lax.pad(x, lax.convert_element_type(value, x.dtype), config)


def _as_on_padded(original: Callable[..., Any], indices: Any, size: Any, mode: Any,
                  kwargs: dict[str, Any]) -> Any:
  """`indices` into an axis of size `size` as indices into that axis padded
  by one, with JAX's wrapping done here (by `size`) and every index that is
  out of range at `size` out of range (or clamped) on the padded axis too."""
  idx = lax.convert_element_type(indices, np.int64 if indices.dtype.itemsize == 8 else np.int32)
  d = jnp.asarray(size, idx.dtype)
  if _wraps(original, mode, kwargs):
    idx = lax.select(idx < 0, idx + d, idx)
  name = str(mode if mode is not None else "fill").lower()
  if "clip" in name or "promise" in name:
    return lax.clamp(lax.full_like(idx, 0), idx, lax.max(d - 1, lax.full_like(d, 0)))
  return lax.select(idx >= d, lax.broadcast_in_dim(d + 1, idx.shape, ()), idx)


def _wraps(original: Callable[..., Any], mode: Any, kwargs: dict[str, Any]) -> bool:
  """Whether JAX's `take_along_axis` wraps negative indices here: its
  `wrap_negative_indices`, whose default (None: not for "promise_in_bounds";
  True on newer JAX, where None does not wrap) is read from JAX's own
  signature."""
  default = inspect.signature(original).parameters[_WRAP].default
  wrap = kwargs.get(_WRAP, default)
  if wrap is None and default is None:   # (JAX's own test: a string, not the enum)
    return bool(mode != "promise_in_bounds")
  return bool(wrap)


jc.register_spellings({jnp.take_along_axis: take_along_axis})
