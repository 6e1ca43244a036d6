"""The packed batch's layout in a program, and reductions per example.

`Layout` holds a `PackedRagged`'s layout arrays inside the program (each
example's length and start, each token's example and position) and what the
packed interpreter (`packed_eval.py`) derives from them once per call: which
tokens a value of a given symbolic size holds, per-example values gathered
onto their tokens, and the gathers between the packed layout and one padded
row per example. The segment reductions below reduce per-token values per
example (the token's example as segment id); the tail's id is out of range,
so it never contributes.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking import dims as _dims


class Layout:
  """The packed batch's layout in the program, and what is derived from it."""

  def __init__(self, name: str, arrays: Sequence[Any], rows: int, row_length: int,
               may_be_empty: bool = False) -> None:
    self.name = name
    # examples of length 0 may be in the batch (`PackedRagged.nonempty` False):
    # their per-example values are computed apart (`packed_vmap.py`), and the
    # packed evaluation keeps its values for them out of every derivative
    self.may_be_empty = may_be_empty
    self.arrays = tuple(arrays)
    self.lengths, self.starts, self.segments, self.positions = arrays
    self.examples = int(self.lengths.shape[0])
    self.rows, self.row_length = rows, row_length
    self.tokens = rows * row_length
    self._cache: dict[Any, Any] = {}

  def fresh(self) -> "Layout":
    """This layout with a cache of its own: for use inside a trace of its own
    (a loop's step), whose values must not be cached for the outer one."""
    return Layout(self.name, self.arrays, self.rows, self.row_length, self.may_be_empty)

  def _cached(self, key: Any, make: Any) -> Any:
    hit = self._cache.get(key)
    if hit is None:
      hit = self._cache[key] = make()
    return hit

  def empty(self) -> Any:
    """`(examples,)` bool: the examples of length 0."""
    return self._cached(("empty",), lambda: self.lengths == 0)

  def off_empty(self, x: Any) -> Any:
    """A per-example value `(examples, ...)` whose rows for empty examples are
    another example's (the first non-empty one), without a derivative.

    An empty example's values in the packed evaluation are discarded (its
    outputs come from `fun` at size 0), but its cotangent, 0, times the
    derivative of an op at those values (`jnp.mean` of no token is 0/0) would
    be NaN in a shared parameter's gradient: at a non-empty example's values
    the derivatives are that example's own, finite where its are."""
    if not self.may_be_empty:
      return x
    donor = jnp.argmax(self.lengths > 0)
    at = lax.broadcast_in_dim(self.empty(), jnp.shape(x), (0,))
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
      return lax.select(at, jnp.broadcast_to(x[donor], jnp.shape(x)), x)
    return _donor_rows(x, at, donor)

  def off_all_empty(self, w: Any) -> Any:
    """A shared value, without a derivative where every example is empty (then
    `off_empty` has no non-empty example to take values from)."""
    if (not self.may_be_empty or not isinstance(w, jc.Tracer)
        or not jnp.issubdtype(jnp.result_type(w), jnp.inexact)):
      return w
    return _still_where(w, jnp.all(self.empty()))

  def is_base(self, d: Any) -> bool:
    return str(d) == self.name

  def value(self, d: Any) -> Any:
    """`d` at each example's length: int32 `(examples,)`."""
    if self.is_base(d):
      return self.lengths
    return self._cached(("value", str(d)), lambda: jax.vmap(
        lambda m: lax.convert_element_type(_dims.evaluate_dim(d, {self.name: m}),
                                           np.int32))(self.lengths))

  def size(self, d: Any) -> Any:
    return self.lengths if self.is_base(d) else jnp.maximum(self.value(d), 0)

  def padded(self, d: Any) -> int:
    """The buffer a value of size `d` takes one padded row per example: what
    the masking rule's own `MaskEnv.padded` gives it at `row_length` (its
    operands must come in that size; `dims.padded_dim`): a size that can
    shrink as the example grows (`jnp.roll`'s `mod(-16, n)`) takes its largest
    value over every length up to the row's, not its value at the row's."""
    if self.is_base(d):
      return self.row_length
    size = _dims.padded_dim(d, {self.name: self.row_length})
    if size is None:   # (the masking rule refuses it too)
      from .packed_values import Unpackable   # (it imports this module)
      raise Unpackable(None, f"a size '{d}' that can shrink as the example grows "
                       "and has no known bound")
    return size

  def fits(self, d: Any) -> bool:
    """Whether a value of size `d` fits in each example's slot: d(m) <= m."""
    if self.is_base(d):
      return True
    # from 1: an empty example has no slot, and its outputs come from `fun` at
    # size 0 (`packed_vmap.py`); a size such as `jnp.roll`'s `k mod n` has no
    # value at n = 0
    fits: bool = self._cached(("fits", str(d)), lambda: all(
        _dims.evaluate_dim(d, {self.name: m}) <= m for m in range(1, self.row_length + 1)))
    return fits

  def valid(self, d: Any) -> Any:
    """`(tokens,)` bool: the tokens a value of size `d` holds."""
    def make() -> Any:
      inside = self.segments < self.examples
      if self.is_base(d):
        return inside
      own = jnp.take(self.size(d), self.segments, mode="fill", fill_value=0)
      return inside & (self.positions < own)
    return self._cached(("valid", str(d)), make)

  def valid_like(self, shape: Sequence[int], axis: int, d: Any) -> Any:
    return self._cached(("like", tuple(shape), axis, str(d)), lambda: lax.broadcast_in_dim(
        self.valid(d), tuple(shape), (axis,)))

  def select(self, x: Any, axis: int, d: Any) -> Any:
    """`x` with its tail (along `axis`, for size `d`) set to 0."""
    return lax.select(self.valid_like(x.shape, axis, d), x, lax.full_like(x, 0))

  def onto_tokens(self, x: Any, d: Any) -> Any:
    """Per-example `x` `(examples, ...)` repeated on each token `(tokens, ...)`,
    0 on the tail. (Gathered in float32 where `x` is float16 or bfloat16: the
    gather's transpose, a scatter-add of every token's cotangent, then
    accumulates in float32, as JAX's reduction of a broadcast's cotangent
    does, not one token at a time in the narrow type.)"""
    out = jnp.take(widened(x), self.segments, axis=0, mode="fill", fill_value=0)
    out = out.astype(jnp.result_type(x))
    return out if self.is_base(d) else self.select(out, 0, d)

  def unpack(self, x: Any, axis: int, d: Any) -> Any:
    """TOKEN `x` as one padded row per example: `(examples, ..., padded(d) at
    axis, ...)`, zeros past each example's size."""
    p = self.padded(d)
    def make() -> Any:
      at = jnp.arange(p, dtype=np.int32)
      idx = self.starts[:, None] + at
      return jnp.where(at < self.size(d)[:, None], idx, self.tokens)
    idx = self._cached(("unpack", str(d)), make)
    out = jnp.take(x, idx, axis=axis, mode="fill", fill_value=0)
    return jnp.moveaxis(out, axis, 0)

  def repack(self, y: Any, axis: int, d: Any) -> Any:
    """The inverse of `unpack`: per-example rows `(examples, ...)`, the padded
    axis at `axis + 1`, back to TOKEN form with the tokens at `axis`."""
    p = y.shape[axis + 1]
    def make() -> Any:
      flat = self.segments * p + self.positions
      return jnp.where(self.valid(d), flat, self.examples * p)
    idx = self._cached(("repack", str(d), p), make)
    y = jnp.moveaxis(y, axis + 1, 1)
    flat = y.reshape(self.examples * p, *y.shape[2:])
    out = jnp.take(flat, idx, axis=0, mode="fill", fill_value=0)
    return jnp.moveaxis(out, 0, axis)


# `off_empty` and `off_all_empty` cut the derivative with a custom JVP, not
# `lax.stop_gradient`: a `jax.custom_jvp` rule evaluated packed
# (`packed_custom.py`) applies them to tangents too (`t[-1] * 2.0` is an op on
# per-example values), and JAX cannot transpose a `stop_gradient` of a tangent
# ("Transpose rule for 'stop_gradient' not implemented"); their values here
# are linear in `x` (a gather and a select), which JAX transposes.

@jax.custom_jvp
def _donor_rows(x: Any, at: Any, donor: Any) -> Any:
  """`x` with the rows `at` replaced by row `donor`; no derivative there."""
  return lax.select(at, jnp.broadcast_to(x[donor], jnp.shape(x)), x)


@_donor_rows.defjvp
def _donor_rows_jvp(primals: Any, tangents: Any) -> Any:
  x, at, donor = primals
  return _donor_rows(x, at, donor), lax.select(at, jnp.zeros_like(tangents[0]), tangents[0])


@jax.custom_jvp
def _still_where(w: Any, flag: Any) -> Any:
  """`w`, without a derivative where `flag`."""
  return w


@_still_where.defjvp
def _still_where_jvp(primals: Any, tangents: Any) -> Any:
  w, flag = primals
  return w, jnp.where(flag, jnp.zeros_like(tangents[0]), tangents[0])


def widened(x: Any) -> Any:
  """`x` in float32 where it is float16 or bfloat16, for a sum over tokens.

  A segment sum is a scatter-add, which adds one token at a time in its own
  type: in bfloat16 a running sum of ones stops growing at 256 (the sum of
  1,500 ones is 256), where JAX's reduction (XLA's) accumulates in float32
  and rounds once. Every segment sum of a narrow float runs on this, and its
  result is rounded back to the narrow type once."""
  if jnp.result_type(x) in (jnp.float16, jnp.bfloat16):
    return jnp.asarray(x).astype(np.float32)
  return x


def segment_sum(x: Any, segments: Any, examples: int) -> Any:
  """`jax.ops.segment_sum`, accumulated in float32 for narrow floats (`widened`)."""
  return jax.ops.segment_sum(widened(x), segments, examples).astype(jnp.result_type(x))


def identity(kind: str, dtype: Any) -> Any:
  if jnp.issubdtype(dtype, jnp.inexact):
    return -np.inf if kind == "max" else np.inf
  info = np.iinfo(dtype) if jnp.issubdtype(dtype, jnp.integer) else None
  if info is None:   # bool
    return kind == "min"
  return info.min if kind == "max" else info.max


def segment_reduce(kind: str, x: Any, segments: Any, examples: int, valid: Any) -> Any:
  filled = jnp.where(valid, x, jnp.asarray(identity(kind, x.dtype), x.dtype))
  op = jax.ops.segment_max if kind == "max" else jax.ops.segment_min
  return op(filled, segments, examples)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def segment_extremum_over(kind: str, examples: int, rest: tuple[int, ...], x: Any, valid: Any,
                          segments: Any) -> Any:
  """max/min per example over the tokens (axis 0) and the axes `rest` of
  `x` at once; the derivative divided among the valid ties of all those
  positions (as JAX's `reduce_max`'s, and the masking rule's): 0/0 = NaN
  where the extremum is NaN (it equals no position), as JAX's."""
  filled = jnp.where(valid, x, jnp.asarray(identity(kind, x.dtype), x.dtype))
  if rest:
    filled = (lax.reduce_max if kind == "max" else lax.reduce_min)(filled, rest)
  op = jax.ops.segment_max if kind == "max" else jax.ops.segment_min
  return op(filled, segments, examples)


@segment_extremum_over.defjvp
def segment_extremum_jvp(kind: str, examples: int, rest: tuple[int, ...], primals: Any,
                         tangents: Any) -> Any:
  x, valid, segments = primals
  t = tangents[0]
  held = _held(x)
  ans = segment_extremum_over(kind, examples, rest, held, valid, segments)
  kept = tuple(a for a in range(x.ndim) if a not in rest)
  back = lax.broadcast_in_dim(jnp.take(ans, segments, axis=0, mode="fill", fill_value=0),
                              x.shape, kept)
  at = valid & (held == back)
  count = segment_sum(jnp.sum(at, axis=rest, dtype=x.dtype), segments, examples)
  # no valid position (an empty example): 0, not 0/0; a NaN extremum equals
  # no position, so its count is 0 and its tangent 0/0 = NaN, as JAX's
  count = jnp.where((count == 0) & ~jnp.isnan(ans), jnp.ones_like(count), count)
  # (t times the indicator, as JAX's rule: its transpose carries a NaN
  # cotangent to the example's valid positions, never to the tail)
  share = jnp.where(valid, t * at.astype(t.dtype), jnp.zeros_like(t))
  return ans, segment_sum(jnp.sum(share, axis=rest), segments, examples) / count


def _held(x: Any) -> Any:
  """`x` as one buffer that every reader sees with the same bits.

  XLA computes an elementwise value again inside each fused loop that reads
  it, and may round it differently from one loop to another (XLA:CPU
  contracts a multiply and an add into an FMA in some vectorised loops and
  not in others), so `x == max` compared a value the maximum was not
  computed from: positions that reach the maximum were missed, and the
  gradient lost terms (`jnp.max(x[:, :, None] + x[:, None, :] * s, axis=0)`
  in a jitted training step). An `optimization_barrier` does not hold
  (XLA:CPU removes it before fusion), and a sort costs 15x the step of a
  max-pooling model; a scatter's result is never recomputed by its readers,
  so `x` is scattered onto itself (one pass over it)."""
  order = jnp.arange(x.shape[0], dtype=np.int32)
  return jnp.zeros_like(x).at[order].set(x, indices_are_sorted=True, unique_indices=True)


def segment_arg(kind: str, layout: Layout, x: Any, valid: Any, index_dtype: Any) -> Any:
  """argmax/argmin per example: the first position of the extremum, a NaN
  winning as in `lax.argmax`."""
  base = "max" if kind == "argmax" else "min"
  best = segment_reduce(base, x, layout.segments, layout.examples, valid)
  back = jnp.take(best, layout.segments, axis=0, mode="fill", fill_value=0)
  at = valid & (x == back)
  if jnp.issubdtype(x.dtype, jnp.inexact):
    nan = jnp.isnan(x) & valid
    has_nan = jax.ops.segment_max(nan.astype(np.int32), layout.segments, layout.examples) > 0
    has_nan = jnp.take(has_nan, layout.segments, axis=0, mode="fill", fill_value=False)
    at = jnp.where(has_nan, nan, at)
  big = np.int32(np.iinfo(np.int32).max)
  pos = lax.broadcast_in_dim(layout.positions, x.shape, (0,))
  first = jax.ops.segment_min(jnp.where(at, pos, big), layout.segments, layout.examples)
  return jnp.where(first == big, 0, first).astype(index_dtype)
