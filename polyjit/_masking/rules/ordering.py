"""Ordering: `sort` and `top_k` along a dynamic axis; padding must rank last.

Sorting a padded axis mixes every position with every other: padding holding
garbage (NaN, -inf, huge values) would be sorted in among the data. What is
needed is that, after the op, the valid region holds exactly what the unpadded
op gives: for a sort, the padding must sort after every valid element, valid
NaNs and the largest integers included; for `top_k`, padding must never be
picked while a valid element is left.

`sort` fills the padding of each key with the value that sorts last in JAX's
sort order (NaN for floats: JAX's comparator canonicalises every NaN and puts
it after +inf; the largest integer; True) and sorts *stably*. A padding entry
then compares greater than or equal to every valid entry on every key, and
where all keys tie, stability keeps it behind the valid entry, which comes
from a lower position. Among valid entries the stable order is the unpadded
one. This costs one select per key and adds no sort operand (an extra key
flagging padding would work too, but makes every comparison longer and turns
single-operand sorts into key-value sorts). An unstable sort becomes stable:
the unpadded order of ties is unspecified, so the stable one is a correct
answer, and stability is what makes the ties with padding exact. Everything
built on sort follows: argsort, lexsort, median, quantile, unique, and sort's
own JVP, which gathers with the sorted iota. `searchsorted` (along dynamic
queries) compares with the total-order comparisons `lt_to`, `le_to`, `eq_to`,
which are elementwise (see elementwise.py).

`top_k` ranks floats by the IEEE total order (XLA lowers it to a stable sort
whose comparator compares bit patterns: -NaN < -inf < ... < -0 < +0 < ... <
+inf < +NaN) and puts the lower index first among equals. The padding is
filled with the lowest value of that order (all bits set for floats, the
smallest integer, False), so it ties at worst, and then loses on index. The k found are valid whenever the
logical axis holds at least k entries, which JAX itself requires (constrain
the sizes, e.g. `constraints=["n >= 3"]`).

`approx_max_k` / `approx_min_k` are refused along a dynamic axis: which
entries they return depends on the length of the axis they search, so on the
padded axis they may return other entries than on the unpadded one, padding
included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import jax.numpy as jnp

from ..core import RuleContext, register
from ._util import identity_value


def _sorts_last(dtype: Any) -> Any:
  """The value that JAX's sort comparator puts after every other."""
  dtype = np.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.complexfloating):  # (real, imag) lexicographic
    return np.asarray(complex(np.nan, np.nan), dtype)[()]
  if jnp.issubdtype(dtype, jnp.floating):
    nan = np.asarray(np.nan, dtype)
    if np.isnan(nan):
      return nan[()]
  return identity_value("min", dtype)  # the largest value of the dtype


def _ranks_lowest(dtype: Any) -> Any:
  """The value that top_k's comparator ranks below every other."""
  dtype = np.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating):  # total order: all bits set, sign included
    bits = np.asarray((1 << jnp.finfo(dtype).bits) - 1, np.dtype(f"u{dtype.itemsize}"))  # type: ignore[no-untyped-call, unused-ignore]  # JAX stub gap: finfo.__init__ unannotated (strict mode only)
    return bits.view(dtype)[()]
  return identity_value("max", dtype)  # the smallest: False, the bottom integer


@register("sort")
def _sort(ctx: RuleContext, *operands: Any, dimension: Any, is_stable: Any, num_keys: Any,
          **params: Any) -> list[Any]:
  avals = ctx.in_avals
  if not ctx.is_dynamic(avals[0].shape[dimension]):  # padding rows sort among themselves
    return ctx.bind(*operands, dimension=dimension, is_stable=is_stable,
                    num_keys=num_keys, **params)
  keys = [ctx.fill_padding(x, aval, _sorts_last(aval.dtype), axes=(dimension,))
          for x, aval in zip(operands[:num_keys], avals[:num_keys], strict=True)]
  return ctx.bind(*keys, *operands[num_keys:], dimension=dimension, is_stable=True,
                  num_keys=num_keys, **params)


@register("top_k")
def _top_k(ctx: RuleContext, x: Any, *, k: Any, axis: Any, **params: Any) -> list[Any]:
  aval, = ctx.in_avals
  if ctx.is_dynamic(aval.shape[axis]):
    x = ctx.fill_padding(x, aval, _ranks_lowest(aval.dtype), axes=(axis,))
  return ctx.bind(x, k=k, axis=axis, **params)


@register("approx_top_k")
def _approx_top_k(ctx: RuleContext, x: Any, *, reduction_dimension: Any,
                  **params: Any) -> list[Any]:
  aval, = ctx.in_avals
  if ctx.is_dynamic(aval.shape[reduction_dimension]):
    raise ctx.error(
        "it is approximate, and which entries it returns depends on the length "
        "of the axis it searches: on the padded axis it may return other "
        "entries than on the unpadded one, padding included.",
        "use lax.top_k, which is exact and masks (negate the values for the "
        "smallest k), or search along an axis of fixed size.")
  return ctx.bind(x, reduction_dimension=reduction_dimension, **params)
