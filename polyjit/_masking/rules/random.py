"""Random numbers of a dynamic shape: draw at the padded size, exactly.

JAX's counter-based PRNGs (threefry2x32 under `jax_threefry_partitionable`,
the default; threefry4x32; philox2x32 and philox4x32) hash each output
position's row-major flat index with the key. A value depends on the key and
its flat index only, never on how many values are drawn, so:

* when every valid position has the same flat index padded and unpadded (the
  dynamic axis is the outermost axis longer than 1: `(n,)`, `(n, 3)`), the
  draw at the padded shape holds the unpadded draw in its valid region, bit
  for bit;
* otherwise (`(3, n)`, `(n, m)`) the values are drawn flat at the padded total
  size, and each position gathers the value at its unpadded flat index.

`random_bits` and `random_split` follow this; `random_gamma` splits its key
per sample the same way, so it takes the first case (and refuses the second:
its samples need the split keys in a layout it computes itself). The tests
check the property itself for every PRNG listed here, so a JAX that changes a
layout fails them rather than giving different numbers.

Other PRNGs draw different numbers at different sizes and are refused when a
drawn shape is dynamic: `rbg` and `unsafe_rbg` (XLA's RngBitGenerator, whose
layout belongs to the backend) and threefry2x32 without
`jax_threefry_partitionable` (its counters depend on the total count).

Key arrays of a dynamic shape (`jax.random.split(key, n)`) need nothing: each
key draws its own values, so position i of the keys maps to position i of the
result, like an elementwise op. `random_seed`, `random_wrap`,
`random_unwrap`, `random_fold_in`, `random_clone` and `threefry2x32` work
position by position.
"""

from __future__ import annotations

from typing import Any

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _jax as jc
from ..core import RuleContext, register

#: PRNGs whose values depend only on the key and the flat index.
COUNTER_BASED = ("threefry2x32", "threefry4x32", "philox2x32", "philox4x32")


@register("random_seed", "random_wrap", "random_unwrap", "random_fold_in",
          "random_clone", "threefry2x32")
def _position_by_position(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
  return ctx.bind(*args, **params)


def _check_counter_based(ctx: RuleContext, keys: Any, shape: Any) -> None:
  impl = str(jax.random.key_impl(keys))
  partitionable = jax.config.jax_threefry_partitionable  # type: ignore[attr-defined, unused-ignore]  # flag set at runtime, absent from jax.config's stubs
  if impl in COUNTER_BASED and (impl != "threefry2x32" or partitionable):
    return
  why = (f"the '{impl}' PRNG draws different numbers for different sizes, so "
         f"the padded draw of shape {_fmt(shape)} would not contain the unpadded one.")
  if impl == "threefry2x32":
    why = ("with jax_threefry_partitionable=False, threefry's counters depend on "
           f"the total number of values drawn, so the padded draw of shape "
           f"{_fmt(shape)} would not contain the unpadded one.")
  raise ctx.error(why, "set jax.config.update('jax_threefry_partitionable', True) "
                       "(JAX's default) and use a threefry or philox key "
                       f"(one of {', '.join(COUNTER_BASED)}), or draw with a fixed "
                       "size and slice.")


def _fmt(shape: Any) -> str:
  return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def same_flat_layout(shape: Any) -> bool:
  """Whether every valid position has the same row-major flat index padded
  and unpadded: each axis that can hold a non-zero index has a fixed stride."""
  for a, d in enumerate(shape):
    if not jc.is_symbolic_dim(d) and d == 1:
      continue  # its index is always 0
    if any(jc.is_symbolic_dim(e) for e in shape[a + 1:]):
      return False
  return True


def _unpadded_flat_index(ctx: RuleContext, shape: Any) -> Any:
  """Per padded position, its row-major flat index in the unpadded array.

  Positions in the padding get indices that may run past the end; the gather
  that uses them clips, and what they read is padding anyway.
  """
  padded = ctx.padded_shape(shape)
  if math.prod(padded) > np.iinfo(np.int32).max:
    raise ctx.error(f"the flat draw of shape {_fmt(padded)} has more than 2**31 values.",
                    "draw with a shape whose dynamic axis comes first.")
  dtype = jc.dim_value_dtype()
  index = lax.full(padded, 0, dtype)
  stride = np.ones((), dtype)
  for a in reversed(range(len(shape))):
    index = index + lax.broadcasted_iota(dtype, padded, a) * stride
    stride = stride * ctx.logical(shape[a])
  return index


def _draw(ctx: RuleContext, keys: Any, shape: Any, draw: Any) -> Any:
  """`draw(keys, padded_shape)`, laid out as the unpadded draw of `shape`."""
  if not any(jc.is_symbolic_dim(d) for d in shape):
    return draw(keys, shape)  # only the keys are padded: position by position
  _check_counter_based(ctx, keys, shape)
  if same_flat_layout(shape):
    return draw(keys, ctx.padded_shape(shape))
  flat = draw(keys, (math.prod(ctx.padded_shape(shape)),))
  return jnp.take(flat, _unpadded_flat_index(ctx, shape), axis=-1, mode="clip")


@register("random_bits", "random_split")
def _random_draw(ctx: RuleContext, keys: Any, *, shape: Any, **params: Any) -> list[Any]:
  return [_draw(ctx, keys, shape, lambda k, s: ctx.bind(k, shape=s, **params)[0])]


@register("random_gamma")
def _random_gamma(ctx: RuleContext, keys: Any, a: Any, **params: Any) -> list[Any]:
  keys_aval, a_aval = ctx.in_avals
  per_key = a_aval.shape[len(keys_aval.shape):]  # split off each key, flat
  if any(jc.is_symbolic_dim(d) for d in per_key):
    _check_counter_based(ctx, keys, per_key)
    if not same_flat_layout(per_key):
      raise ctx.error(
          f"each key is split into the {_fmt(per_key)} samples it draws, in a "
          "flat layout that differs padded and unpadded.",
          "draw gamma samples with the dynamic axis first, e.g. shape (n, 3) "
          "rather than (3, n), and transpose afterwards.")
  return ctx.bind(keys, a, **params)
