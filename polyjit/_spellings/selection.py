"""`pj.nonzero`, `pj.boolean_mask`, `pj.unique`: selections that run everywhere.

Inside `pj.jit`, `pj.mask` and `pj.vmap` these are exactly `jnp.nonzero(a)`,
`x[m]` and `jnp.unique(x)` (which polyjit intercepts there anyway): results
whose length is a data-dependent size (`_masking/data_dependent.py`), returned at
their exact size. The explicit spellings exist for code that must *also* run
under plain `jax.jit`, `jax.vmap` or eagerly:

* eagerly (concrete arrays, no `size=`): NumPy's result, exact size;
* under plain `jax.jit` / `vmap` (traced arrays), where no shape can depend on
  data: `size=` semantics. Without `size=`, the size is the upper bound (the
  number of candidates: `a.size` for nonzero and unique, the mask's size for
  boolean_mask); the entries past the count hold `fill_value` (JAX's default
  fill for nonzero and unique, 0 for boolean_mask). The count itself is
  `jnp.sum(m)` / `jnp.count_nonzero(a)`.

So the same function gives exact results under polyjit and padded ones under
jax.jit; code that must agree in both can pass `size=` explicitly, which
polyjit honours as JAX does.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._masking import data_dependent as dd
from . import data_dependent as selections
from .. import _jax as jc


def _traced(*arrays: Any) -> bool:
  """Traced by plain JAX: `size=` semantics (inside pj.jit: polyjit's trace)."""
  traced = any(isinstance(a, jc.Tracer) for a in arrays)
  if traced and dd.in_plain_jit_trace():
    raise dd.NeedsPolyjitTrace("an explicit selection without size= inside pj.jit")
  return traced


def nonzero(a: Any, *, size: int | None = None,
            fill_value: Any = None) -> tuple[jax.Array, ...]:
  """`jnp.nonzero(a)`, exact-size under polyjit; see the module docstring.

  Under plain `jax.jit` without `size=`, each index array has length
  `a.size`, filled past the count with `fill_value` (default 0).
  """
  if size is None and dd.in_trace(a):
    return selections.nonzero_indices(a)
  if size is None and _traced(a):
    size = int(np.size(a))
  return jnp.nonzero(a, size=size, fill_value=fill_value)


def boolean_mask(x: Any, mask: Any, axis: int = 0, *, size: int | None = None,
                 fill_value: Any = 0) -> jax.Array:
  """`x[m]` along `axis`: the entries of `x` where `mask` is True.

  `mask` covers the axes `axis .. axis + mask.ndim` of `x`, which become one
  axis of length `count_nonzero(mask)`: exact under polyjit and eagerly;
  under plain `jax.jit` without `size=`, of length `mask.size`, filled past
  the count with `fill_value`.
  """
  if size is None and dd.in_trace(x, mask):
    return selections.boolean_select(x, mask, axis)
  x, mask = jnp.asarray(x), jnp.asarray(mask)
  axis = operator.index(axis)
  axis = axis + x.ndim if axis < 0 else axis
  k = mask.ndim
  if k == 0 or x.shape[axis:axis + k] != mask.shape:
    raise IndexError(f"boolean mask of shape {mask.shape} does not match the axes "
                     f"{x.shape[axis:axis + k]} of the array (shape {x.shape}, axis {axis}).")
  flat = x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + k:])
  if size is None and not _traced(x, mask):
    return jnp.take(flat, jnp.flatnonzero(mask), axis=axis)
  size = int(mask.size) if size is None else size
  positions = jnp.flatnonzero(mask, size=size, fill_value=0)
  picked = jnp.take(flat, positions, axis=axis, mode="clip")
  kept = jnp.arange(size) < jnp.count_nonzero(mask)
  kept = kept.reshape((1,) * axis + (size,) + (1,) * (picked.ndim - axis - 1))
  return jnp.where(kept, picked, jnp.asarray(fill_value, picked.dtype))


def unique(x: Any, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False, *, equal_nan: bool = True, size: int | None = None,
           fill_value: Any = None) -> Any:
  """`jnp.unique(x, ...)` (flattened, `axis=None`), exact-size under polyjit.

  Under plain `jax.jit` without `size=`, the results have length `x.size`,
  padded as `jnp.unique(..., size=x.size, fill_value=fill_value)` pads them.
  """
  if size is None and dd.in_trace(x):
    return selections.unique_of(x, return_index, return_inverse, return_counts, equal_nan)
  if size is None and _traced(x):
    size = int(np.size(x))
  return jnp.unique(x, return_index, return_inverse, return_counts,
                    equal_nan=equal_nan, size=size, fill_value=fill_value)
