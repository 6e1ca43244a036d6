"""Data-dependent selections while polyjit traces: `x[x > 0]`, `jnp.nonzero`, `jnp.unique`.

While polyjit traces a function symbolically, boolean-mask indexing (the
function behind `Array.__getitem__`), `jnp.nonzero`, `flatnonzero`,
`argwhere`, one-argument `where`, `compress`, `extract` and `unique` (without
`size=`) are replaced by the functions below (`_jax.trace_spellings`), written
with the one primitive of `_masking/data_dependent.py`, `compact`, and public
jnp/lax ops. Given `size=`, a concrete operand, or arguments they do not handle,
they call JAX's own function, so nothing changes where JAX already works.
Basic slices with a step (`y[::2]`, `y[::-1]`) of an axis whose size is
data-dependent go through `_strided_slices`, so that an empty selection gives
NumPy's empty result rather than failing JAX's `size >= 1` gather check.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking.data_dependent import (compact, in_trace, mentions_size, provably_equal,
                                       tracing_now)
from .._masking.errors import MaskingError

def boolean_select(arr: Any, mask: Any, axis: int = 0) -> jax.Array:
  """`arr` where `mask` (covering axes axis..axis+mask.ndim) is True, those
  axes replaced by one axis of data-dependent length."""
  arr, mask = jnp.asarray(arr), jnp.asarray(mask)
  axis = operator.index(axis)
  axis = axis + arr.ndim if axis < 0 else axis
  k = mask.ndim
  covered = arr.shape[axis:axis + k]
  if k == 0 or axis + k > arr.ndim or not all(
      provably_equal(a, b) for a, b in zip(covered, mask.shape, strict=True)):
    raise IndexError(
        f"boolean index of shape {mask.shape} does not match the indexed array's axes "
        f"{tuple(covered)} (array shape {arr.shape}, axis {axis}); polyjit must be "
        "able to prove the sizes equal (the mask computed from the array itself, "
        "e.g. x[x > 0], always is).")
  if mask.dtype != jnp.bool_:
    mask = mask != 0
  if k > 1:
    mask = mask.reshape(-1)
    arr = arr.reshape(arr.shape[:axis] + (-1,) + arr.shape[axis + k:])
  positions = compact(mask)
  return jnp.take(arr, positions, axis=axis, mode="clip")


def _bool_mask_index(idx: Any) -> Any:
  """The boolean array of `x[idx]` when idx is a traced boolean mask (alone, or
  the only entry of a tuple); raises for a traced mask mixed with other indices."""
  def is_mask(i: Any) -> bool:
    return isinstance(i, jc.Tracer) and jnp.result_type(i) == jnp.bool_ and np.ndim(i) >= 1
  if is_mask(idx):
    return idx
  if isinstance(idx, tuple) and any(is_mask(i) for i in idx):
    if len(idx) == 1:
      return idx[0]
    raise MaskingError(
        "indexing with a boolean mask together with other indices (x[m, 0], "
        "x[:, m], x[m, ...]) gives a data-dependent size that polyjit supports only "
        "as x[m] with the mask alone.\nWhat to do: index in two steps, e.g. x[m][:, 0] "
        "for x[m, 0]; or pj.boolean_mask(x, m, axis=1) for x[:, m].")
  return None


def _size_indices(idx: Any) -> Any:
  """`idx` with each integer index that is a size (`x[n // 2]`, `x[n - 1]`)
  given as its int32 value: JAX takes only Python ints and arrays as integer
  indices. An array index reads the same element (a negative one wraps with
  the axis size, as a Python int does); only out-of-range handling differs,
  where a Python int raises at trace time and an array index is clamped, so
  such a size (`x[n]`) must be in range at the sizes it runs at."""
  def value(i: Any) -> Any:
    return jnp.asarray(i, np.int32) if jc.is_symbolic_dim(i) and not isinstance(i, jc.Tracer) else i
  if isinstance(idx, tuple):
    return tuple(value(i) for i in idx)
  return value(idx)


def getitem(original: Callable[..., Any], arr: Any, idx: Any, **kwargs: Any) -> Any:
  if tracing_now():
    idx = _size_indices(idx)
  mask = _bool_mask_index(idx) if tracing_now() else None
  if mask is None:
    if tracing_now() and not kwargs:
      arr, idx = _strided_slices(arr, idx)
    return original(arr, idx, **kwargs)
  return boolean_select(arr, mask, 0)


def _is_int(v: Any) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _int_or_none(v: Any) -> bool:
  return v is None or _is_int(v)


def _clamp(i: int, d: Any) -> Any:
  """A slice bound `i` (step > 0) as an index in [0, d], as `slice.indices`."""
  return jc.min_dim(d, i) if i >= 0 else jc.max_dim(0, d + i)


def _strided_slices(arr: Any, idx: Any) -> tuple[Any, Any]:
  """`arr[idx]` for a basic index (slices, ints, None, Ellipsis) whose slices
  with a step other than 1 on an axis of data-dependent size are done here
  (`lax.rev` and a gather, below); returns the array and the index that
  remains (those slices replaced by `:`, for JAX's own indexing).

  JAX spells such a slice at a symbolic size as a gather of slice size 1,
  whose shape rule asks `size >= 1`; a selection may be empty, where NumPy
  gives an empty result, so that question would become a check failing at
  run time. Here the same gather (`start + step * iota(count)`, every index
  in bounds, none where the count is 0) reads the axis padded with one entry,
  a size provably >= 1. (A strided `lax.slice` would need no padding, but its
  transpose pads to a size JAX cannot prove equal to the operand's when the
  count may be 0.) A negative step is a positive one on the reversed axis:
  `x[a:b:-s] == x[::-1][~a:~b:s]` (`~None` is None). Anything else (array or
  traced entries, symbolic bounds) is left to JAX.
  """
  entries = idx if isinstance(idx, tuple) else (idx,)
  if not any(isinstance(e, slice) and e.step not in (None, 1) for e in entries):
    return arr, idx
  if not all(e is None or e is Ellipsis or isinstance(e, slice) or _is_int(e) for e in entries):
    return arr, idx
  if any(isinstance(e, slice) and not all(map(_int_or_none, (e.start, e.stop, e.step)))
         for e in entries):
    return arr, idx
  ndim = np.ndim(arr)
  consumed = sum(1 for e in entries if e is not None and e is not Ellipsis)
  if sum(1 for e in entries if e is Ellipsis) > 1 or consumed > ndim:
    return arr, idx   # JAX's error
  shape = np.shape(arr)
  axis, rest, changed = 0, [], False
  for e in entries:
    if e is Ellipsis:
      axis += ndim - consumed
    elif e is not None:
      if (isinstance(e, slice) and e.step not in (None, 1) and e.step != 0
          and mentions_size(shape[axis])):
        if not changed:
          arr, changed = jnp.asarray(arr), True
        start, stop, step = e.start, e.stop, int(e.step)
        if step < 0:
          arr = lax.rev(arr, (axis,))
          start, stop, step = (None if start is None else ~start,
                               None if stop is None else ~stop, -step)
        d = arr.shape[axis]
        lo = 0 if start is None else _clamp(int(start), d)
        hi = d if stop is None else _clamp(int(stop), d)
        size = (jc.max_dim(lo, hi) - lo + step - 1) // step
        index = lo + step * lax.iota(jc.dim_value_dtype(), size)
        pad = [(0, 0, 0)] * arr.ndim
        pad[axis] = (0, 1, 0)   # one entry more: the gather's operand is never empty
        arr = jnp.take(lax.pad(arr, jnp.zeros((), arr.dtype), pad), index, axis=axis,
                       mode="clip")
        e = slice(None)
      axis += 1
    rest.append(e)
  if not changed:
    return arr, idx
  return arr, tuple(rest) if isinstance(idx, tuple) else rest[0]


def nonzero_indices(a: Any) -> tuple[jax.Array, ...]:
  a = jnp.asarray(a)
  positions = compact(jnp.ravel(a))
  if a.ndim == 1:
    return (positions,)
  out = []
  rest = positions
  for d in reversed(a.shape[1:]):
    size = jnp.asarray(d, positions.dtype)
    out.append(rest % size)
    rest = rest // size
  out.append(rest)
  return tuple(reversed(out))


def nonzero(original: Callable[..., Any], a: Any, *, size: Any = None,
            fill_value: Any = None) -> Any:
  if size is not None or not in_trace(a) or np.ndim(a) == 0:
    return original(a, size=size, fill_value=fill_value)
  return nonzero_indices(a)


def flatnonzero(original: Callable[..., Any], a: Any, *, size: Any = None,
                fill_value: Any = None) -> Any:
  if size is not None or not in_trace(a):
    return original(a, size=size, fill_value=fill_value)
  return compact(jnp.ravel(a))


def argwhere(original: Callable[..., Any], a: Any, *, size: Any = None,
             fill_value: Any = None) -> Any:
  if size is not None or not in_trace(a):
    return original(a, size=size, fill_value=fill_value)
  a = jnp.asarray(a)
  out = jnp.stack(nonzero_indices(jnp.atleast_1d(a)), axis=1)
  return out[:, :0] if a.ndim == 0 else out


def where(original: Callable[..., Any], condition: Any, x: Any = None, y: Any = None, /, *,
          size: Any = None, fill_value: Any = None) -> Any:
  if x is None and y is None and size is None and in_trace(condition):
    return nonzero(jnp.nonzero, condition)
  return original(condition, x, y, size=size, fill_value=fill_value)


def compress(original: Callable[..., Any], condition: Any, a: Any, axis: Any = None, *,
             size: Any = None, fill_value: Any = 0, out: Any = None) -> Any:
  if size is not None or out is not None or not in_trace(condition, a):
    return original(condition, a, axis, size=size, fill_value=fill_value, out=out)
  condition = jnp.asarray(condition)
  a = jnp.asarray(a)
  if condition.ndim != 1:
    raise ValueError("condition must be a 1D array")
  if axis is None:
    a, axis = jnp.ravel(a), 0
  axis = operator.index(axis)
  axis = axis + a.ndim if axis < 0 else axis
  if not provably_equal(condition.shape[0], a.shape[axis]):
    raise MaskingError(
        f"jnp.compress with a condition of length {condition.shape[0]} on an axis of "
        f"length {a.shape[axis]}: polyjit supports a condition exactly as long as the "
        "axis (NumPy ignores a shorter condition's missing entries).\nWhat to do: pad "
        "or slice the condition to the axis' length.")
  return boolean_select(a, condition, axis)


def extract(original: Callable[..., Any], condition: Any, arr: Any, *, size: Any = None,
            fill_value: Any = 0) -> Any:
  if size is not None or not in_trace(condition, arr):
    return original(condition, arr, size=size, fill_value=fill_value)
  return compress(jnp.compress, jnp.ravel(condition), jnp.ravel(arr))


def unique_of(ar: Any, return_index: bool, return_inverse: bool, return_counts: bool,
              equal_nan: bool) -> Any:
  ar = jnp.asarray(ar)
  flat = jnp.ravel(ar)
  n = flat.shape[0]
  perm = jnp.argsort(flat, stable=True).astype(jc.dim_value_dtype())
  s = flat[perm]
  iota = lax.iota(jc.dim_value_dtype(), n)
  prev = s[jnp.maximum(iota - 1, 0)]
  same = s == prev
  if equal_nan and jnp.issubdtype(s.dtype, jnp.inexact):
    same = same | (jnp.isnan(s) & jnp.isnan(prev))
  first = (iota == 0) | ~same
  starts = compact(first)
  out = [s[starts]]
  if return_index:
    out.append(perm[starts])
  if return_inverse:
    group = jnp.cumsum(first.astype(jc.dim_value_dtype())) - 1
    out.append(group[jnp.argsort(perm)].reshape(ar.shape if ar.ndim else (1,)))
  if return_counts:
    k = jnp.asarray(starts.shape[0], starts.dtype)
    j = lax.iota(starts.dtype, starts.shape[0])
    following = jnp.where(j + 1 < k, starts[jnp.minimum(j + 1, k - 1)],
                          jnp.asarray(n, starts.dtype))
    out.append(following - starts)
  return out[0] if len(out) == 1 else tuple(out)


def unique(original: Callable[..., Any], ar: Any, return_index: bool = False,
           return_inverse: bool = False, return_counts: bool = False, axis: Any = None, *,
           equal_nan: bool = True, size: Any = None, fill_value: Any = None,
           sorted: bool = True) -> Any:
  if size is not None or not in_trace(ar):
    return original(ar, return_index, return_inverse, return_counts, axis,
                    equal_nan=equal_nan, size=size, fill_value=fill_value, sorted=sorted)
  if axis is not None:
    raise MaskingError(
        "jnp.unique(..., axis=...) without size= inside a polyjit function: unique "
        "rows or columns are not supported with data-dependent sizes.\nWhat to do: "
        "pass size= (a bound) and fill_value=, as under jax.jit.")
  return unique_of(ar, return_index, return_inverse, return_counts, equal_nan)


jc.register_spellings({jnp.nonzero: nonzero, jnp.flatnonzero: flatnonzero, jnp.argwhere: argwhere,
                       jnp.where: where, jnp.compress: compress, jnp.extract: extract,
                       jnp.unique: unique, jc.ARRAY_GETITEM: getitem})
