"""Exact replacements for JAX spellings that JAX cannot trace at symbolic sizes.

Some everyday JAX functions fail, or lose reverse-mode differentiation, when a
size they depend on is a `jax.export` symbolic dimension, although the
computation they describe is perfectly well defined at every size:

* `jnp.searchsorted(a, v)`: the default method runs ceil(log2(len(a) + 1))
  bisection steps, a number JAX computes in Python from a concrete length (and
  it asks the output dtype for a constant length);
* `jnp.interp(x, xp, fp)`: calls `searchsorted` on `xp`, and clips with
  `len(xp) - 1`, which Python refuses for a symbolic length;
* `jnp.linspace(start, stop, num)` with `num` a size (`x.shape[0]`): branches
  in Python on `num > 1`;
* `jnp.diff(x, n=k)`, k >= 2, along a dynamic axis: after the first difference
  the length is `n - 1`, which may be 0, so `x[1:]` and `x[:-1]` get the
  lengths `n - 1 - min(n - 1, 1)` and `max(0, n - 2)`, equal at every size but
  not provably so by JAX, and the subtraction refuses to broadcast them;
* `lax.fori_loop(lower, upper, ...)` with a constant `lower` and a size
  `upper` (`x.shape[0]`, `n - 1`): JAX uses a `scan` only when both bounds are
  Python ints, and otherwise a `while_loop`, which it cannot differentiate in
  reverse mode.

While polyjit traces a function symbolically (`_masking.trace.trace_flat`), the public
names `jnp.searchsorted`, `jnp.interp`, `jnp.linspace`, `jnp.diff` and
`lax.fori_loop` (and the few module globals JAX's own functions call them
through, e.g. `Array.searchsorted` and `jnp.digitize`) are swapped for the
functions below, by `_jax.trace_spellings()`, which lists the patch
targets, installs them thread-safely and re-entrantly and restores JAX's
originals afterwards. Each replacement runs only in a thread that is inside
such a trace, and only when the size it is about is symbolic; in every other
case (another thread, concrete sizes, arguments it does not handle) it calls
JAX's original with the same arguments, so nothing changes where JAX already
works. The replacements use the public jax / jnp / lax API only (and JAX's
dtype promotion, through `_jax`), so that masking them needs nothing
but polyjit's ordinary rules.

Why each replacement is exact (equal to JAX's own result at concrete sizes)
----------------------------------------------------------------------------
* `searchsorted`: for a sorted `a`, the insertion index of `v` is the number of
  elements before it: `sum(a < v)` for side='left', `sum(a <= v)` for
  side='right', in the very total order JAX's search uses (-inf < ... < inf <
  NaN, -0.0 == 0.0; complex numbers lexicographic). This is JAX's own
  `method="compare_all"`, written here so that no Python int of the length is
  needed; every `method=` gives the same indices for a sorted `a` (as in JAX,
  the result for an unsorted `a` is unspecified). The count is a `reduce_sum`
  over the dynamic axis, which polyjit masks; the result is int32, as JAX gives
  for every length below 2**31. Memory is len(a) * size(v) booleans.
* `interp`: JAX's own algorithm, statement by statement (including the period
  handling, which sorts and wraps one point around each end, and `left` /
  `right` / "extrapolate", and JAX's dtype promotion), with `len(xp) - 1`
  written `xp.shape[0] - 1` (a runtime size), the `searchsorted` above, and
  the two ends of each interval gathered once per array instead of seven
  gathers of the same values. Negative indices (`fp[i - 1]` with i = 0 when
  len(xp) == 1) wrap with the logical length, as polyjit's gather rule does
  for every jnp index.
* `linspace`: the same formula as JAX (`start * (1 - s) + stop * s` with
  `s = k / div` in the real dtype) at every position k < div; the endpoint is
  `stop` itself and `num == 1` gives `start` itself, selected per position,
  so no Python branch on `num` is needed. `retstep` is `(stop - start) / div`,
  NaN where JAX gives NaN. Dtypes are JAX's: they are read from the original
  at a concrete `num` (`jax.eval_shape`). Where `num` is 0 (or 1 with
  `endpoint`) and `start`/`stop` are arrays, JAX returns a scalar NaN step;
  here the NaN step keeps the broadcast shape. Rounding: with `div` a runtime
  value XLA may compute `k / div` as `k * (1 / div)`, so a value can differ
  from `jax.jit`'s in the last bit (JAX's own eager and jit results differ
  likewise); an integer `dtype` floors that value, so it can differ by one
  where the float lies within an ulp of an integer.
* `diff`: each difference is `x[1:] - x[:L']` where `L'` is the symbolic
  length of `x[1:]` itself, so both operands have one shape and JAX can prove
  the slice in bounds; elementwise the same subtraction (or `!=` for bool).
* `fori_loop`: exactly JAX's own scan path (`scan` over `(i, carry)` starting
  from the Python int `lower`, `i + 1` per step), with the trip count
  `max(upper - lower, 0)` symbolic; the scan runs over a dummy `iota` of that
  length because `lax.scan(length=...)` wants a Python int. polyjit masks a
  scan over a dynamic length (the steps past the logical length leave the
  carry alone) and JAX differentiates it. A traced (non-constant) bound, or a
  symbolic `lower`, keeps JAX's `while_loop`.

Functions imported by name before the trace (`from jax.numpy import interp`)
are not intercepted: polyjit patches module attributes, not references.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.export import is_symbolic_dim

from .. import _jax as jc


def _is_dim(d: Any) -> bool:
  """A symbolic size (a dimension expression), not a traced value."""
  return is_symbolic_dim(d) and not isinstance(d, jc.Tracer)


# --- searchsorted ------------------------------------------------------------

_SIDES = ("left", "right")
_METHODS = ("scan", "scan_unrolled", "sort", "compare_all")


def _float_lt(x: Any, y: Any) -> Any:
  """x < y in the sort order (NaN last, -0.0 == 0.0), floats."""
  return (x < y) | (~jnp.isnan(x) & jnp.isnan(y))


def _float_le(x: Any, y: Any) -> Any:
  return (x <= y) | jnp.isnan(y)


def _float_eq(x: Any, y: Any) -> Any:
  return (x == y) | (jnp.isnan(x) & jnp.isnan(y))


def _sort_compare(x: Any, y: Any, or_equal: bool) -> Any:
  """`x < y` (or `x <= y`) in the total order of JAX's sort and search."""
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    xr, xi, yr, yi = jnp.real(x), jnp.imag(x), jnp.real(y), jnp.imag(y)
    second = _float_le(xi, yi) if or_equal else _float_lt(xi, yi)
    return _float_lt(xr, yr) | (_float_eq(xr, yr) & second)
  if jnp.issubdtype(x.dtype, jnp.floating):
    return _float_le(x, y) if or_equal else _float_lt(x, y)
  if x.dtype == jnp.bool_:
    return (~x | y) if or_equal else (~x & y)
  return (x <= y) if or_equal else (x < y)


def count_before(a: Any, v: Any, side: str) -> Any:
  """`searchsorted(a, v, side)` for a sorted 1-d `a`, as a sum of comparisons."""
  a, v = jnp.asarray(a), jnp.asarray(v)
  dtype = jnp.result_type(a, v)
  a, v = a.astype(dtype), v.astype(dtype)
  a_b = a.reshape((a.shape[0],) + (1,) * v.ndim)
  before = _sort_compare(a_b, v[None], or_equal=(side == "right"))
  return jnp.sum(before, axis=0, dtype=jnp.int32)


def searchsorted(original: Callable[..., Any], a: Any, v: Any, side: str = "left",
                 sorter: Any = None, *, method: str = "scan") -> Any:
  shape = np.shape(a)
  if (len(shape) != 1 or not _is_dim(shape[0]) or side not in _SIDES
      or method not in _METHODS):
    return original(a, v, side=side, sorter=sorter, method=method)
  if sorter is not None:
    a = jnp.asarray(a)[jnp.asarray(sorter)]
  return count_before(a, v, side)


# --- interp ------------------------------------------------------------------

def interp(original: Callable[..., Any], x: Any, xp: Any, fp: Any, left: Any = None,
           right: Any = None, period: Any = None) -> Any:
  shape = np.shape(xp)
  if len(shape) != 1 or not _is_dim(shape[0]) or np.shape(fp) != shape:
    return original(x, xp, fp, left, right, period)
  x, xp, fp = jnp.asarray(x), jnp.asarray(xp), jnp.asarray(fp)
  x_arr, xp_arr = jc.promote_dtypes_inexact(x, xp)   # JAX's promotion, weak types included
  fp_arr, = jc.promote_dtypes_inexact(fp)
  extrapolate_left = _extrapolate("left", left)
  extrapolate_right = _extrapolate("right", right)
  if jnp.issubdtype(x_arr.dtype, jnp.complexfloating):
    raise ValueError("jnp.interp: complex x values not supported.")

  if period is not None:
    if np.ndim(period) != 0:
      raise ValueError(f"period must be a scalar; got {period}")
    period = jnp.abs(period)
    x_arr = x_arr % period
    xp_arr = xp_arr % period
    xp_arr, fp_arr = lax.sort_key_val(xp_arr, fp_arr)
    xp_arr = jnp.concatenate([xp_arr[-1:] - period, xp_arr, xp_arr[:1] + period])
    fp_arr = jnp.concatenate([fp_arr[-1:], fp_arr, fp_arr[:1]])

  i = jnp.clip(count_before(xp_arr, x_arr, "right"), 1, xp_arr.shape[0] - 1)
  # One gather per array for both ends of the interval (JAX indexes seven
  # times; the values are the same, the masked program and its VJP smaller).
  ends = jnp.stack([i - 1, i])
  xp_lo, xp_hi = xp_arr[ends]
  fp_lo, fp_hi = fp_arr[ends]
  df = fp_hi - fp_lo
  dx = xp_hi - xp_lo
  delta = x_arr - xp_lo

  epsilon = np.spacing(np.finfo(xp_arr.dtype).eps)
  dx0 = lax.abs(dx) <= epsilon  # Prevent NaN gradients when `dx` is small.
  f = jnp.where(dx0, fp_lo, fp_lo + (delta / jnp.where(dx0, 1, dx)) * df)

  if not extrapolate_left:
    left_arr = fp_arr[0] if left is None else left
    if period is None:
      f = jnp.where(x_arr < xp_arr[0], left_arr, f)
  if not extrapolate_right:
    right_arr = fp_arr[-1] if right is None else right
    if period is None:
      f = jnp.where(x_arr > xp_arr[-1], right_arr, f)
  return f


def _extrapolate(name: str, value: Any) -> bool:
  if not isinstance(value, str):
    return False
  if value != "extrapolate":
    raise ValueError(f"the only valid string value of `{name}` is "
                     f"'extrapolate', but got: {value!r}")
  return True


# --- linspace ----------------------------------------------------------------

def linspace(original: Callable[..., Any], start: Any, stop: Any, num: Any = 50,
             endpoint: bool = True, retstep: bool = False, dtype: Any = None,
             axis: int = 0, *, device: Any = None) -> Any:
  if not _is_dim(num) or device is not None:
    return original(start, stop, num, endpoint, retstep, dtype, axis, device=device)
  axis = operator.index(axis)
  start, stop = jnp.asarray(start), jnp.asarray(stop)
  # JAX's dtypes (and its argument checks), read from the original at num=2.
  out_struct, step_struct = jax.eval_shape(
      lambda s, e: original(s, e, 2, endpoint, True, dtype, axis), start, stop)
  computation_dtype = step_struct.dtype
  start = start.astype(computation_dtype)
  stop = stop.astype(computation_dtype)

  bounds_shape = list(jnp.broadcast_shapes(np.shape(start), np.shape(stop)))
  b_start = jnp.broadcast_to(start, bounds_shape)
  b_stop = jnp.broadcast_to(stop, bounds_shape)
  axis = len(bounds_shape) + axis + 1 if axis < 0 else axis
  bounds_shape.insert(axis, 1)
  b_start, b_stop = b_start.reshape(bounds_shape), b_stop.reshape(bounds_shape)

  # jnp.finfo (ml_dtypes' finfo) has no annotated constructor (ignore used only under --strict)
  real_dtype = jnp.finfo(computation_dtype).dtype  # type: ignore[no-untyped-call, unused-ignore]
  num_v = jnp.asarray(num)
  div = (num - 1) if endpoint else num
  div_real = jnp.asarray(div).astype(real_dtype)
  iota_shape = [1] * len(bounds_shape)
  iota_shape[axis] = num
  k = lax.iota(real_dtype, num).reshape(iota_shape)
  # JAX divides by `div` only when num > 1, where div >= 1.
  step = (k / jnp.maximum(div_real, 1)).astype(computation_dtype)
  out = b_start * (1 - step) + b_stop * step
  if endpoint:  # JAX appends `stop` itself at position num - 1
    last = lax.iota(jnp.int32, num).reshape(iota_shape) == jnp.asarray(div)
    out = jnp.where(last, b_stop, out)
  out = jnp.where(num_v == 1, b_start, out)       # num == 1: `start` itself

  if jnp.issubdtype(out_struct.dtype, jnp.integer) and not jnp.issubdtype(out.dtype, jnp.integer):
    out = lax.floor(out)
  result = out.astype(out_struct.dtype)
  if not retstep:
    return result
  div_c = jnp.asarray(div).astype(computation_dtype)
  diff = lax.convert_element_type(stop - start, computation_dtype)
  undefined = (num_v == 0) | ((num_v == 1) if endpoint else False)
  delta = jnp.where(undefined, jnp.asarray(np.nan, computation_dtype),
                    diff / jnp.where(undefined, 1, div_c).astype(computation_dtype))
  return result, delta


# --- diff --------------------------------------------------------------------

def diff(original: Callable[..., Any], a: Any, n: Any = 1, axis: Any = -1,
         prepend: Any = None, append: Any = None) -> Any:
  if not isinstance(n, (int, np.integer)) or n < 2 or np.ndim(a) == 0:
    return original(a, n, axis, prepend, append)
  arr = jnp.asarray(a)
  ax = operator.index(axis)
  ax = ax + arr.ndim if ax < 0 else ax
  if not 0 <= ax < arr.ndim:
    return original(a, n, axis, prepend, append)  # JAX's error
  combined = []
  for extra in (prepend, append):
    if extra is not None and np.ndim(extra) == 0:
      extra = jnp.broadcast_to(extra, arr.shape[:ax] + (1,) + arr.shape[ax + 1:])
    combined.append(extra)
  parts = [p for p in (combined[0], arr, combined[1]) if p is not None]
  if len(parts) > 1:
    arr = jnp.concatenate(parts, ax)
  if not _is_dim(arr.shape[ax]):
    return original(a, n, axis, prepend, append)
  for _ in range(n):
    later = arr[(slice(None),) * ax + (slice(1, None),)]
    earlier = lax.slice_in_dim(arr, 0, later.shape[ax], axis=ax)
    arr = (later != earlier) if arr.dtype == jnp.bool_ else later - earlier
  return arr


# --- fori_loop ---------------------------------------------------------------

def fori_loop(original: Callable[..., Any], lower: Any, upper: Any,
              body_fun: Callable[[Any, Any], Any], init_val: Any, *,
              unroll: Any = None) -> Any:
  if not _is_dim(upper) or is_symbolic_dim(lower) or isinstance(lower, jc.Tracer):
    return original(lower, upper, body_fun, init_val, unroll=unroll)
  try:
    lower_ = int(lower)
  except (TypeError, ValueError):
    return original(lower, upper, body_fun, init_val, unroll=unroll)
  length = jc.max_dim(upper - lower_, 0)

  def step(carry: tuple[Any, Any], _: Any) -> tuple[tuple[Any, Any], None]:
    i, x = carry
    return (i + 1, body_fun(i, x)), None

  # `lax.scan(length=...)` wants a Python int; a dynamic length comes from xs.
  (_, result), _ = lax.scan(step, (lower_, init_val), lax.iota(jnp.int32, length),
                            unroll=False if unroll is None else unroll)
  return result


# --- diagonal -----------------------------------------------------------------

def diagonal(original: Callable[..., Any], a: Any, offset: Any = 0, axis1: int = 0,
             axis2: int = 1) -> Any:
  """`jnp.diagonal` (and `jnp.diag(x, k)`, `x.diagonal`) with an offset.

  JAX sizes the diagonal with Python's `max(0, min(n + min(k, 0), m - max(k, 0)))`,
  a comparison of sizes (`n - 1 > 0` for k = 1) whose two sides give the shapes
  `(0,)` and `(n - 1,)`: equal at every size (n - 1 = 0 where it is false), but
  not the same expression, so with traced sizes the outputs seemed to depend on
  a size comparison. Here the size is JAX's symbolic `max_dim`/`min_dim` of the
  same terms (which JAX simplifies where the constraints decide them, `n - 1`
  for k = 1), and the entries the same gather JAX does.
  """
  shape = np.shape(a)
  if (np.ndim(a) < 2 or isinstance(offset, jc.Tracer)
      or not any(is_symbolic_dim(shape[ax]) for ax in (axis1, axis2))):
    return original(a, offset, axis1, axis2)
  try:
    k = operator.index(offset)
  except TypeError:
    return original(a, offset, axis1, axis2)
  if k == 0:
    return original(a, offset, axis1, axis2)
  rows, cols = shape[axis1], shape[axis2]
  size = jc.max_dim(jc.min_dim(rows + min(k, 0), cols - max(k, 0)), 0)
  a = jnp.moveaxis(a, (axis1, axis2), (-2, -1))
  i = lax.iota(np.int32, size)
  j = i + abs(k)
  return a[..., i, j] if k >= 0 else a[..., j, i]


jc.register_spellings({jnp.searchsorted: searchsorted, jnp.interp: interp, jnp.linspace: linspace,
                       jnp.diff: diff, lax.fori_loop: fori_loop, jnp.diagonal: diagonal})
