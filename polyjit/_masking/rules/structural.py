"""Shape-changing primitives that keep data anchored at index 0, and reshape.

`broadcast_in_dim`, `iota`, `squeeze`, `transpose`, `stack` and the like move
whole axes around but never move data along a dynamic axis: binding them with
padded sizes keeps the valid region leading. `dim_as_value` is where a size
becomes a value: it evaluates on the logical sizes.

`reshape` binds unchanged when each dynamic axis is the outermost non-unit
axis of the group of axes it merges or splits ((n, 3) <-> (3n,)): row-major
order then puts the data first. Any other reshape ((3, n) -> (3n,),
(n, m) -> (nm,), (2n,) -> (2, n), (n, m) -> (m, n)) would interleave padding
with data, so it is a gather instead: each output entry reads the input entry
with the same logical row-major index, computed from the logical sizes.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import dims as _dims
from ... import _jax as jc
from ..core import RuleContext, register


@register("broadcast_in_dim", "iota", "squeeze", "transpose", "stack",
          "unstack")
def _position_preserving(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
  return ctx.bind(*args, **params)


@register("dim_as_value")
def _dim_as_value(ctx: RuleContext, *, dim: Any) -> list[Any]:
  out_aval, = ctx.out_avals
  # The size is computed from the logical sizes in the dtype of sizes, where a
  # product of sizes can wrap around (`len(x) * len(y)` past 2**31): jax.jit
  # computes it as a Python int and raises OverflowError where it does not fit.
  limit = int(np.iinfo(out_aval.dtype).max)
  if jc.is_symbolic_dim(dim) and _dims.magnitude_bound(dim, ctx.env.padded_env) > limit:
    raise ctx.error(
        f"the size {dim} used as a value can exceed {out_aval.dtype}'s range at sizes up "
        f"to the padded ones {ctx.env.padded_env} (its product of sizes would wrap "
        "around; jax.jit raises OverflowError at the sizes where it does not fit).",
        "compute it as a float (`len(x) * 1.0 * len(y)`), or enable jax_enable_x64.")
  # (weak as JAX's: `a.shape[0] + 1` stays weak, so `f(a) + jnp.int8(1)` is int8)
  return [jc.convert_weak(ctx.logical(dim), out_aval.dtype, out_aval.weak_type)]


# --- reshape -----------------------------------------------------------------

_PRIMES = ((1_000_003, 1_000_033, 1_000_037, 1_000_039, 1_000_081, 1_000_099),
           (999_983, 999_979, 999_961, 999_959, 999_953, 999_931))


def _at_primes(shape: Any, names: Any, primes: Any) -> list[int]:
  env = {v: primes[i % len(primes)] + 7 * (i // len(primes))
         for i, v in enumerate(names)}
  return [_dims.evaluate_dim(d, env) for d in shape]


def _int_groups(a: list[int], b: list[int]) -> Any:
  """Groups of consecutive axes with equal products, the classic way."""
  groups, i, j = [], 0, 0
  while i < len(a) or j < len(b):
    gi, gj, pa, pb = [], [], 1, 1
    if i < len(a):
      gi.append(i); pa *= a[i]; i += 1
    if j < len(b):
      gj.append(j); pb *= b[j]; j += 1
    while pa != pb:
      if pa < pb and i < len(a):
        gi.append(i); pa *= a[i]; i += 1
      elif j < len(b):
        gj.append(j); pb *= b[j]; j += 1
      else:
        return None
    groups.append((gi, gj))
  return groups


def reshape_groups(in_shape: Any, out_shape: Any) -> Any:
  """Axis groups of a reshape between symbolic shapes, or None if unclear."""
  names = sorted(set().union(*(_dims.dim_vars(d) for d in (*in_shape, *out_shape))))
  found: Any = None
  for primes in _PRIMES:
    groups = _int_groups(_at_primes(in_shape, names, primes),
                         _at_primes(out_shape, names, primes))
    if groups is None or (found is not None and groups != found):
      return None
    found = groups
  for gi, gj in found:
    if math.prod(in_shape[i] for i in gi) != math.prod(out_shape[j] for j in gj):
      return None
  return found


def _leading_dynamic_only(shape: Any, axes: Any) -> bool:
  """At most one dynamic axis, and no non-unit axis before it."""
  dims = [shape[a] for a in axes if not (not jc.is_symbolic_dim(shape[a]) and shape[a] == 1)]
  dynamic = [k for k, d in enumerate(dims) if jc.is_symbolic_dim(d)]
  return not dynamic or dynamic == [0]


@register("reshape")
def _reshape(ctx: RuleContext, x: Any, *, new_sizes: Any, dimensions: Any,
             **params: Any) -> list[Any]:
  in_shape = ctx.in_avals[0].shape
  out_shape = ctx.out_avals[0].shape
  if dimensions is not None:  # reshape of a transpose: transpose first
    x = lax.transpose(x, dimensions)
    in_shape = tuple(in_shape[a] for a in dimensions)
  groups = reshape_groups(in_shape, out_shape)
  if groups is not None and all(
      _leading_dynamic_only(in_shape, gi) and _leading_dynamic_only(out_shape, gj)
      for gi, gj in groups):
    return ctx.bind(x, new_sizes=new_sizes, dimensions=None, **params)
  return [_reshape_by_gather(ctx, x, in_shape, out_shape)]


def _reshape_by_gather(ctx: RuleContext, x: Any, in_shape: Any, out_shape: Any) -> Any:
  """Output entry j reads the input entry whose logical row-major index is
  j's; entries past the logical end read anything (they are padding)."""
  dtype = jc.dim_value_dtype()
  shape = ctx.padded_shape(out_shape)
  if x.size > np.iinfo(dtype).max:
    raise ctx.error(
        f"it moves data with a gather over {x.size} padded entries, more "
        f"than {np.dtype(dtype).name} indices can address.",
        "enable 64-bit mode (jax.config.update('jax_enable_x64', True)) or "
        "reshape smaller arrays.")
  if x.size == 0 or math.prod(shape) == 0:
    # (no entry to read: `jnp.take` of an empty array would return its own (0,)
    # shape, not `shape`; jnp.pad's edge mode reshapes (n, 1, 0) to (n, 0))
    return lax.full(shape, 0, x.dtype)
  flat = lax.full(shape, 0, dtype)  # logical row-major index of each entry
  for axis, d in enumerate(out_shape):
    flat = flat * ctx.logical(d) + lax.broadcasted_iota(dtype, shape, axis)
  source, stride = lax.full(shape, 0, dtype), 1
  for axis in reversed(range(len(in_shape))):
    size = lax.max(ctx.logical(in_shape[axis]), np.ones((), dtype))  # never / 0
    source = source + lax.rem(flat, size) * stride
    flat = lax.div(flat, size)
    stride *= x.shape[axis]
  return jnp.take(x.reshape(-1), source, mode="clip")
