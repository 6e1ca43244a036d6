"""`lax.associative_scan` and `lax.index_take` at a symbolic length.

JAX's `associative_scan` builds Blelloch's tree of combinations from a Python
int length (`int(elems.shape[axis])`: it refuses a symbolic one), and
`index_take` writes the axis sizes into a NumPy array (`np.array([n])`, an
object array that `lax` refuses). While polyjit traces a function
symbolically, `_jax.trace_spellings()` swaps the public `lax` names for the
functions below; each calls JAX's original unless the size it is about is
symbolic.

Why the scan is exact
---------------------
`associative_scan(fn, xs)[i]` is `xs[0] . xs[1] . ... . xs[i]` for the
associative `.` that `fn` is (`fn(earlier, later)`). Here it is computed by
doubling (Hillis and Steele): after the step of offset `d`, `y[i]` combines
`xs[max(0, i - 2d + 1)] ... xs[i]`; the step sets `y[i] = fn(y[i - d], y[i])`
where `i >= d` and keeps `y[i]` elsewhere, for d = 1, 2, 4, ..., so after the
steps with `d < n` every position holds its whole prefix. No step needs the
length as a Python int: `y[i - d]` is a gather at `max(i - d, 0)` (in range
at every length), the choice a `select` on `iota >= d`. As the length is not
known while tracing, the steps run for every `d < 2**31` (31 of them, one
`lax.scan` over `d`: one copy of `fn` to trace, mask and differentiate, where
31 unrolled copies took seconds per trace); one with `d >= n` selects `y`
everywhere and changes nothing. The combination is
the same product in another bracketing, so it equals JAX's result up to
floating-point rounding (exactly for integer and other exactly associative
operations). A position `i` reads only positions `<= i`, so the padding after
the logical length never reaches the valid prefix; `reverse=True` is JAX's own
definition: the scan of the reversed elements, reversed (`lax.rev`, which
polyjit re-anchors at the logical length). `fn` is called on whole arrays
(JAX requires it to act elementwise over the axis), once per step.

`index_take` is JAX's own computation with the sizes as int32 values
(`jnp.asarray(n)`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc

#: Offsets 1, 2, ..., 2**30: enough for every length below 2**31.
_STEPS = 31


def _symbolic(d: Any) -> bool:
  return jc.is_symbolic_dim(d) and not isinstance(d, jc.Tracer)


def associative_scan(original: Callable[..., Any], fn: Callable[..., Any], elems: Any,
                     reverse: bool = False, axis: int = 0) -> Any:
  tree: Any   # (a PyTreeDef, which jaxlib ships no type stub for)
  leaves, tree = jax.tree.flatten(elems)
  if (not callable(fn) or not leaves or any(np.ndim(x) == 0 for x in leaves)
      or not isinstance(axis, (int, np.integer))):
    return original(fn, elems, reverse=reverse, axis=axis)
  ax = int(axis) % np.ndim(leaves[0])
  lengths = [np.shape(x)[ax] if np.ndim(x) > ax else None for x in leaves]
  if not any(_symbolic(n) for n in lengths if n is not None):
    return original(fn, elems, reverse=reverse, axis=axis)
  n: Any = lengths[0]
  if any(m is None or m is not n and str(m) != str(n) for m in lengths):
    return original(fn, elems, reverse=reverse, axis=axis)   # JAX's own error
  leaves = [lax.convert_element_type(jnp.asarray(x), jnp.asarray(x).dtype) for x in leaves]
  if reverse:
    leaves = [lax.rev(x, (ax,)) for x in leaves]

  def combine(a: list[Any], b: list[Any]) -> list[Any]:
    out = jax.tree.leaves(fn(jax.tree.unflatten(tree, a), jax.tree.unflatten(tree, b)))
    if len(out) != len(a):   # (JAX's own flattens fn's result the same way)
      raise TypeError(f"lax.associative_scan: fn returned {len(out)} arrays for elements "
                      f"of {len(a)}; fn must return the structure it is given")
    return out

  position = lax.iota(np.int32, n)

  def step(ys: list[Any], d: Any) -> tuple[list[Any], None]:
    shifted = [jnp.take(y, jnp.maximum(position - d, 0), axis=ax, mode="clip") for y in ys]
    later = position >= d
    out = []
    for y, c in zip(ys, combine(shifted, ys), strict=True):
      if np.shape(c) != np.shape(y) or jnp.result_type(c) != y.dtype:
        raise TypeError(f"lax.associative_scan: fn returned {jc.typeof(c).str_short()} for "
                        f"elements of {jc.typeof(y).str_short()}; it must keep shapes and dtypes")
      c = lax.convert_element_type(c, y.dtype)   # (a weak type would change the carry)
      out.append(jnp.where(lax.broadcast_in_dim(later, np.shape(c), (ax,)), c, y))
    return out, None

  leaves, _ = lax.scan(step, leaves, jnp.left_shift(1, jnp.arange(_STEPS, dtype=np.int32)))
  if reverse:
    leaves = [lax.rev(x, (ax,)) for x in leaves]
  return jax.tree.unflatten(tree, leaves)


def index_take(original: Callable[..., Any], src: Any, idxs: Sequence[Any],
               axes: Sequence[int]) -> Any:
  shape = np.shape(src)
  if not any(_symbolic(shape[ax]) for ax in axes):
    return original(src, idxs, axes)
  indices = lax.concatenate([lax.expand_dims(i, (1,)) for i in idxs], 1)
  sizes = jnp.stack([jnp.asarray(shape[ax], dtype=indices.dtype) for ax in axes])
  indices = indices % lax.expand_dims(sizes, tuple(range(indices.ndim - 1)))
  slice_sizes = list(shape)
  for ax in axes:
    slice_sizes[ax] = 1
  offset_dims = tuple(range(1, np.ndim(src) - indices.shape[1] + 1))
  dnums = lax.GatherDimensionNumbers(offset_dims=offset_dims,
                                     collapsed_slice_dims=tuple(axes),
                                     start_index_map=tuple(axes))
  return lax.gather(src, indices, dimension_numbers=dnums, slice_sizes=tuple(slice_sizes))


jc.register_spellings({lax.associative_scan: associative_scan, lax.index_take: index_take})
