"""Packing: several examples per row, `pj.Packing` and `PackedRagged`.

    batch = pj.Ragged.from_list(examples, packing=pj.Packing(row_length=64))
    ys = pj.vmap(fun)(batch)            # fun still written for one example

Design
------
A padded `Ragged` stores every example in a row of its own, padded to the
bucket of the longest: on SST-2's sentence lengths a batch of 64 stores about
a fifth real tokens. A packed batch stores the examples one after another in
rows of `row_length` tokens, so the rows hold mostly real tokens.

* The planner (`plan_rows`) is first-fit decreasing, deterministic and
  vectorised: examples are taken longest first, and all examples of one
  length are placed at once (first fit of equal items fills the open rows in
  order, each with as many as fit, then opens new rows), so its cost grows
  with the number of distinct lengths, not of examples. Equal lengths give
  the same layout. `max_segments` caps the examples per row.
* The row count is bucketed (`Packing.row_buckets`; by default at most four
  counts per doubling), the extra rows all tail: batches whose plans need a
  few rows more or less run the same program inside the user's `jax.jit`.
* `PackedRagged` is a pytree of the packed data `(rows, row_length, *fixed)`
  (or a pytree of such arrays sharing the layout), each example's length and
  start (flat token offset `row * row_length + offset`), and per token its
  example (`segments`; `num_examples` on the unused tail of a row) and its
  position in the example (`positions`; 0 on the tail). The layout is
  computed once on the host; `pj.vmap` reads it (`packed_eval.py`).

`efficiency` is the fraction of stored tokens that are real, on packed and
padded batches alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from .._buckets import fixed as _buckets
from .._masking.errors import ShapeError
from .host import HostExamples


@dataclasses.dataclass(frozen=True)
class Packing:
  """How `pj.Ragged.from_list(examples, packing=...)` packs examples into rows.

  Attributes:
    row_length: tokens per row; None: the bucket of the longest example (the
      `buckets=` policy of `from_list`, powers of two from 16 by default).
    max_segments: at most this many examples per row; None: no limit.
    row_buckets: the row count's bucket policy (a `buckets=` value: a
      policy, an int k for multiples of k, a list of sizes): the planner's
      row count is padded up to its bucket with empty rows, so batches whose
      row counts differ share a program. None: powers of two with 3 sizes
      between them (`PowersOfTwo(minimum=1, steps=4)`: 8, 10, 12, 14, 16,
      20, ...: at most 4 programs per doubling of the row count, at most 25%
      empty rows). 1: the planner's own count (a program per count).
  """
  row_length: int | None = None
  max_segments: int | None = None
  row_buckets: Any = None

  def __post_init__(self) -> None:
    for name in ("row_length", "max_segments"):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
        raise ValueError(f"pj.Packing({name}={value!r}): give a positive int or None.")
    self.row_policy()   # a wrong row_buckets raises here, not at the first batch

  def row_policy(self) -> _buckets.BucketPolicy:
    if self.row_buckets is None:
      return _buckets.PowersOfTwo(minimum=1, steps=4)
    return _buckets.as_policy(self.row_buckets)


def plan_rows(lengths: Any, row_length: int, max_segments: int | None = None
              ) -> tuple[np.ndarray, np.ndarray, int]:
  """First-fit decreasing: each example's row and offset, and the row count.

  Examples are placed longest first (ties in their order), each in the first
  row with room for it (and fewer than `max_segments` examples). Placing all
  examples of one length at once is the same first fit: a row that refused
  one of them refuses the others, so the open rows take as many as fit, in
  row order, and the rest open new rows, each as full as it can be.
  """
  lengths = np.asarray(lengths, np.int64).reshape(-1)
  n = lengths.size
  rows = np.zeros(n, np.int64)
  offsets = np.zeros(n, np.int64)
  if n == 0:
    return rows, offsets, 0
  if lengths.max(initial=0) > row_length:
    i = int(np.argmax(lengths > row_length))
    raise ShapeError(
        f"example {i} has length {int(lengths[i])}, longer than the packing's "
        f"row_length={row_length}: give pj.Packing(row_length=...) at least the "
        "longest example's length (None: its bucket).")
  cap = n if max_segments is None else int(max_segments)
  order = np.argsort(-lengths, kind="stable")
  sorted_lengths = lengths[order]
  # the first index of each distinct length (descending)
  firsts = np.flatnonzero(np.r_[True, sorted_lengths[1:] != sorted_lengths[:-1]])
  counts = np.diff(np.r_[firsts, n]).tolist()
  fill = np.zeros(n, np.int64)     # tokens used per row (at most n rows)
  used = np.zeros(n, np.int64)     # examples per row
  open_rows = 0
  takes: list[np.ndarray] = []     # per length: examples taken by each row
  bases: list[np.ndarray] = []     # per length: each row's fill before it
  for size, c in zip(sorted_lengths[firsts].tolist(), counts, strict=True):
    m = open_rows
    room = (np.full(m, cap, np.int64) if size == 0 else (row_length - fill[:m]) // size)
    if max_segments is not None:
      room = np.minimum(room, cap - used[:m])
    before = np.cumsum(room) - room
    take = np.minimum(np.maximum(c - before, 0), room)
    rest = c - int(take.sum())
    if rest:   # new rows, each as full as it can be
      per_new = cap if size == 0 else min(row_length // size, cap)
      k = -(-rest // per_new)
      extra = np.full(k, per_new, np.int64)
      extra[-1] = rest - per_new * (k - 1)
      take = np.concatenate([take, extra])
      open_rows += k
    takes.append(take)
    bases.append(fill[:take.size].copy())
    fill[:take.size] += take * size
    if max_segments is not None:
      used[:take.size] += take
  take_all = np.concatenate(takes)
  row_all = np.concatenate([np.arange(t.size) for t in takes])
  size_all = np.repeat(sorted_lengths[firsts], [t.size for t in takes])
  chunk_first = np.cumsum(take_all) - take_all
  j = np.arange(n) - np.repeat(chunk_first, take_all)
  rows[order] = np.repeat(row_all, take_all)
  offsets[order] = np.repeat(np.concatenate(bases), take_all) + j * np.repeat(size_all, take_all)
  return rows, offsets, open_rows


@jax.tree_util.register_pytree_with_keys_class
class PackedRagged:
  """A batch of examples packed several per row (see the module docstring).

  Build one with `pj.Ragged.from_list(examples, packing=pj.Packing(...))`.
  `pj.vmap` maps a function written for one example over it, exactly as over
  the padded batch; its per-token outputs come back packed in the same layout.

  Attributes:
    data: `(rows, row_length, *fixed)` (or a pytree of such arrays); the
      unused tail of each row is unspecified.
    lengths: int32 `(num_examples,)`, in the order the examples were given.
    starts: int32 `(num_examples,)`: each example's first token, as a flat
      index `row * row_length + offset`.
    segments, positions: int32 `(rows * row_length,)`: per token, its example
      (`num_examples` on the unused tail) and its position in it.
  """

  def __init__(self, data: Any, lengths: Any, starts: Any, segments: Any,
               positions: Any, nonempty: bool = False) -> None:
    self.data = data
    self.lengths = lengths
    self.starts = starts
    self.segments = segments
    self.positions = positions
    self.nonempty = nonempty
    self.ragged_axes = 1

  def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Any], ...], bool]:
    key = jax.tree_util.GetAttrKey
    return tuple((key(k), getattr(self, k)) for k in
                 ("data", "lengths", "starts", "segments", "positions")), self.nonempty

  @classmethod
  def tree_unflatten(cls, nonempty: bool, children: Sequence[Any]) -> "PackedRagged":
    data, lengths, starts, segments, positions = children
    return cls(data, lengths, starts, segments, positions, nonempty=nonempty)

  # --- sizes ---------------------------------------------------------------

  @property
  def rows(self) -> int:
    rows: int = jax.tree.leaves(self.data)[0].shape[0]
    return rows

  @property
  def row_length(self) -> int:
    length: int = jax.tree.leaves(self.data)[0].shape[1]
    return length

  @property
  def num_examples(self) -> int:
    count: int = self.lengths.shape[0]
    return count

  def __len__(self) -> int:
    return self.num_examples

  @property
  def efficiency(self) -> Any:
    """Real tokens over stored tokens (a float; a scalar inside `jax.jit`)."""
    stored = self.rows * self.row_length
    if isinstance(self.lengths, jc.Tracer):
      return jnp.sum(self.lengths) / stored
    return float(np.sum(np.asarray(self.lengths))) / stored if stored else 1.0

  # --- reading ---------------------------------------------------------------

  def valid(self) -> jax.Array:
    """`(rows, row_length)` bool: True on the tokens of examples."""
    valid: jax.Array = (self.segments < self.num_examples).reshape(self.rows, self.row_length)
    return valid

  def to_list(self) -> list[Any]:
    """The examples, unpacked, as NumPy arrays (or pytrees of them), in order."""
    leaves, tree = jax.tree.flatten(self.data)
    if any(isinstance(x, jc.Tracer) for x in [*leaves, self.lengths, self.starts]):
      raise TypeError("PackedRagged.to_list reads the examples on the host: call it "
                      "outside jax.jit/jax.grad.")
    flat = [np.asarray(x).reshape(self.rows * self.row_length, *x.shape[2:]) for x in leaves]
    starts, lengths = np.asarray(self.starts), np.asarray(self.lengths)
    return [jax.tree.unflatten(tree, [f[s:s + m] for f in flat])
            for s, m in zip(starts.tolist(), lengths.tolist(), strict=True)]

  def sum(self) -> Any:
    """The sum over every token of every example (per data leaf)."""
    return jax.tree.map(lambda x: jnp.sum(x, where=self._mask_like(x)), self.data)

  def mean(self) -> Any:
    """The mean over every token of every example: of the concatenated examples."""
    return jax.tree.map(lambda x: jnp.mean(x, where=self._mask_like(x)), self.data)

  def _mask_like(self, x: Any) -> jax.Array:
    valid = self.valid()
    return jnp.broadcast_to(valid.reshape(valid.shape + (1,) * (x.ndim - 2)), x.shape)

  def __repr__(self) -> str:
    leaf = jax.tree.leaves(self.data)[0]
    return (f"PackedRagged({self.num_examples} examples in {self.rows} rows of "
            f"{self.row_length}, {leaf.dtype})")


def pack(host: HostExamples, packing: Packing, buckets: _buckets.BucketSpec) -> PackedRagged:
  """`host`'s examples packed into rows (on the host, then placed on the device)."""
  if host.ragged_axes != 1:
    raise ShapeError(f"pj.Packing packs examples with one ragged axis; these have "
                     f"ragged_axes={host.ragged_axes}.")
  lengths = host.sizes[:, 0]
  length = packing.row_length
  if length is None:
    length = _buckets.as_policy(buckets)(max(int(lengths.max(initial=0)), 1))
  rows, offsets, count = plan_rows(lengths, length, packing.max_segments)
  count = packing.row_policy()(max(count, 1))   # the rows past the plan's are tail
  starts = rows * length + offsets
  n = len(lengths)
  tokens = count * length
  # per token: its example and position (tail: example n, position 0)
  segments = np.full(tokens, n, np.int32)
  positions = np.zeros(tokens, np.int32)
  owner = np.repeat(np.arange(n), lengths)
  first = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
  flat = np.arange(owner.size) + first
  segments[flat] = owner
  positions[flat] = flat - starts[owner]
  datas = []
  for column in host.columns:
    dtype = jax.dtypes.canonicalize_dtype(np.result_type(*{a.dtype for a in column}))
    out = np.zeros((tokens, *column[0].shape[1:]), dtype)
    if column:
      out[flat] = np.concatenate([np.asarray(a, dtype) for a in column], axis=0)
    datas.append(jax.device_put(out.reshape(count, length, *column[0].shape[1:])))
  def put(a: Any) -> Any:
    return jax.device_put(np.asarray(a, np.int32))
  return PackedRagged(host.unflatten(datas), put(lengths), put(starts), put(segments),
                      put(positions), nonempty=bool(n == 0 or lengths.min() >= 1))


def is_packed(x: object) -> bool:
  return isinstance(x, PackedRagged)
