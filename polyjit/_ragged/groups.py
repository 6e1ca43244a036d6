"""Ragged batches in length groups: `pj.LengthGroups` and the grouped `pj.vmap`.

    batch = pj.Ragged.from_list(examples, groups=pj.LengthGroups())
    losses = pj.vmap(loss, in_axes=(None, 0, 0))(params, batch, targets)
    # losses[i] == loss(params, examples[i], targets[i]), in the original order

Why
---
A `pj.Ragged` pads every example to the bucket of the longest. When an
example's cost grows faster than its length (attention: the square), the
longest few decide the cost of all: with 32 lengths log-uniform in 10..512 the
batch pads to 512 while the mean squared length is about an eighth of 512**2.
A grouped batch keeps its examples in a few padded blocks instead, each padded
to its own size, and `pj.vmap` runs the function on every block inside the
same trace (one program), then puts the outputs back in the original order.

How the blocks are chosen (the compile count is the constraint)
--------------------------------------------------------------------
Every distinct combination of block shapes is another program inside the
user's `jax.jit`, so block shapes must be few and stable across batches, not
fitted to each batch. `LengthGroups(groups=2, rows=8)`:

* Padded lengths are fixed classes, not each block's own longest: the top
  class `P0` is the bucket of the longest example (the `buckets=` policy of
  `from_list`), class g is `policy(P0 >> g)` (halving: 512, 256, 128 with
  powers of two). Only `P0` depends on the batch, as it does without groups.
* Examples are sorted by length, longest first. Block g takes every remaining
  example longer than the next class, its count rounded *up* to a multiple of
  `rows` with the next-longest examples (which are shorter, so they fit); the
  last block takes the rest. Block row counts are then multiples of `rows`
  (but the last), and a batch's shapes take few values: 3 layouts for 200
  batches of 32 log-uniform lengths in the benchmark.
* No block is ever padded with dummy rows: every row is a real example.
* A `LengthGroups` object remembers the layouts (block shapes) it has used.
  A batch whose own layout is new runs in the cheapest used layout that fits
  it (no compile), until its own was wanted `patience` times (a count-based
  ski rental: a layout wanted often earns its program). In the benchmark the
  rare batch whose longest is <= 256 then runs in the common layout: 2
  programs for 200 batches, as many as without groups.

`batch_size` (as in `jax.lax.map`) runs a block's examples that many at a time
with `lax.map` (one compiled loop body per block; the remainder, if any, is
vectorized once more). On a CPU, attention over long sequences runs faster one
example at a time than vectorized (its per-example working set then stays in
cache: 1.6 ms against 4.4 ms per 512-long example in the benchmark's model);
on an accelerator, or for a scan (an RNN, whose run time is its number of
sequential steps), leave it None: the whole block at once.

Exactness and gradients: each block is an ordinary `pj.Ragged` run by the
ordinary `pj.vmap` machinery (exact per example, padding never leaks); the
other mapped arguments are gathered in block order (`jnp.take`), and outputs
are gathered back with the inverse permutation. A permutation is exact, and
its transpose (a scatter-add of distinct rows) is exact too, so gradients
equal those of the per-example loop.

Scope: one ragged axis, no batch padding or sharding (`from_list` raises),
one grouped argument per `pj.vmap` call (tokens and targets go in one
`Ragged`: `from_list([(tok, tgt), ...], groups=...)`), integer `out_axes`.
Outputs that depend on the length come back as one plain `pj.Ragged` (padded
to the largest block's size) in the original order; the others are stacked.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._buckets import fixed as _buckets
from .._masking.errors import ShapeError
from .arguments import broadcast, describe, leaf_axes
from .host import HostExamples
from .ragged import Ragged, from_host, is_ragged
from .vmap import InAxes, OutAxes, RaggedVmapped, shared_vmap
from .vmap import vmap as _plain_vmap


#: Block shapes of a grouped batch: (rows, padded length) per block.
Layout: TypeAlias = "tuple[tuple[int, int], ...]"


def _fits(layout: Layout, longest_first: np.ndarray) -> bool:
  """Whether lengths sorted longest first fit these blocks, in order."""
  if sum(r for r, _ in layout) != longest_first.size:
    return False
  start = 0
  for rows, padded in layout:
    if rows and longest_first[start] > padded:
      return False
    start += rows
  return True


class LengthGroups:
  """How `pj.Ragged.from_list(examples, groups=...)` splits a batch by length.

  Args:
    groups: at most this many blocks. Block g is padded to the bucket of
      the longest example halved g times (512, 256, ... with powers of two),
      so the shapes of a batch are few and stable (module docstring).
    rows: block row counts (but the last block's) are multiples of `rows`;
      larger means fewer programs, smaller means tighter blocks.
    batch_size: None (default): each block runs vectorized at once. An int k:
      k examples at a time (`jax.lax.map(..., batch_size=k)`); `1` is the
      fastest for attention over long sequences on a CPU.
    patience: a batch whose own layout (block shapes) this object has not
      used yet runs in the cheapest layout it has used that fits it (its
      longest examples fit each block), so no new program is compiled,
      until its own layout has been wanted `patience` times; then its own
      is used from then on. A batch that fits none gets its own at once.
      None: every batch gets its own layout (`split`), whatever came before.
      Results are exact in any layout; only which programs run depends on
      the batches seen.
  """

  def __init__(self, groups: int = 2, rows: int = 8, batch_size: int | None = None,
               patience: int | None = 8) -> None:
    for name, value in (("groups", groups), ("rows", rows), ("batch_size", batch_size),
                        ("patience", patience)):
      if value is None and name in ("batch_size", "patience"):
        continue
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TypeError(f"LengthGroups({name}=...) must be an int >= 1, got {value!r}")
    self.groups = groups
    self.rows = rows
    self.batch_size = batch_size
    self.patience = patience
    self._used: list[Layout] = []            # layouts batches ran in (compiled)
    self._wanted: dict[Layout, int] = {}     # own layouts not used yet: times wanted
    self._lock = threading.Lock()

  def layout(self, sizes: Sequence[int] | np.ndarray, buckets: _buckets.BucketSpec = None
             ) -> list[tuple[np.ndarray, int]]:
    """The blocks this batch runs in (as `split`, but reusing a layout already
    used when it fits; see `patience`). Records the choice."""
    lengths = np.asarray(sizes).reshape(-1)
    own = self.split(lengths, buckets)
    order = np.concatenate([idx for idx, _ in own])
    mine: Layout = tuple((len(idx), padded) for idx, padded in own)
    with self._lock:
      chosen = mine
      if self.patience is not None and mine not in self._used:
        wanted = self._wanted.get(mine, 0) + 1
        fitting = [l for l in self._used if _fits(l, lengths[order])]
        if fitting and wanted < self.patience:
          self._wanted[mine] = wanted
          chosen = min(fitting, key=lambda l: sum(r * p * p for r, p in l))
        else:
          self._wanted.pop(mine, None)
      if chosen not in self._used:
        self._used.append(chosen)
    starts = np.cumsum([0, *[r for r, _ in chosen]])
    return [(order[a:b], p) for a, b, (_, p) in zip(starts[:-1], starts[1:], chosen, strict=True)]

  def __repr__(self) -> str:
    return (f"LengthGroups(groups={self.groups}, rows={self.rows}, "
            f"batch_size={self.batch_size}, patience={self.patience})")

  def split(self, sizes: Sequence[int] | np.ndarray, buckets: _buckets.BucketSpec = None
            ) -> list[tuple[np.ndarray, int]]:
    """The blocks for these lengths: (example indices, longest first; padded
    length) per block. Deterministic: equal lengths give equal blocks."""
    lengths = np.asarray(sizes).reshape(-1)
    policy = _buckets.as_policy(buckets)
    order = np.argsort(-lengths, kind="stable")
    top = policy(int(lengths[order[0]]))
    classes = [top]
    for g in range(1, self.groups):
      smaller = policy(max(1, top >> g))
      if smaller >= classes[-1]:
        break
      classes.append(smaller)
    blocks: list[tuple[np.ndarray, int]] = []
    start = 0
    for g, padded in enumerate(classes):
      rest = order[start:]
      if not rest.size:
        break
      if g == len(classes) - 1:
        count = rest.size
      else:
        longer = int(np.sum(lengths[rest] > classes[g + 1]))
        count = min(-(-longer // self.rows) * self.rows, rest.size)
      if count:
        blocks.append((rest[:count], padded))
      start += count
    return blocks

  def from_list(self, examples: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None) -> "GroupedRagged":
    """`pj.Ragged.from_list(examples, groups=self)`: pads each block on the host."""
    if ragged_axes != 1:
      raise ShapeError(
          f"length groups sort examples by one length; got ragged_axes={ragged_axes}. "
          "Use pj.Ragged.from_list without groups= for several ragged axes.")
    host = HostExamples(examples, 1, "Ragged.from_list needs at least one example.")
    blocks = self.layout(host.sizes[:, 0], buckets)
    order = np.concatenate([idx for idx, _ in blocks]).astype(np.int32)
    position = np.empty_like(order)
    position[order] = np.arange(order.size, dtype=np.int32)
    rows = [from_host(host, [padded], len(idx), jax.device_put, indices=idx)
            for idx, padded in blocks]
    return GroupedRagged(tuple(rows), jax.device_put(order), jax.device_put(position),
                         self.batch_size)


@jax.tree_util.register_pytree_with_keys_class
class GroupedRagged:
  """A ragged batch whose examples live in several padded blocks (by length).

  Built by `pj.Ragged.from_list(examples, groups=pj.LengthGroups(...))`; pass
  it to `pj.vmap` like a `pj.Ragged` (it goes through `jax.jit` and
  `jax.grad` as a pytree).

  Attributes:
    blocks: the blocks, each a `pj.Ragged` padded to its own size, longest
      examples first.
    order: int32 `(n,)`: the original index of each row of the blocks, in
      block order.
    position: int32 `(n,)`: where example i sits in block order (the inverse).
    batch_size_per_run: `LengthGroups.batch_size` (static).
  """

  def __init__(self, blocks: tuple[Ragged, ...], order: Any, position: Any,
               batch_size_per_run: int | None = None) -> None:
    self.blocks = tuple(blocks)
    self.order = order
    self.position = position
    self.batch_size_per_run = batch_size_per_run
    rows = sum(b.batch_size for b in self.blocks if isinstance(b, Ragged))
    if (not self.blocks or any(not isinstance(b, Ragged) or b.ragged_axes != 1
                               or b.batch_padded for b in self.blocks)
        or np.shape(order) != (rows,) or np.shape(position) != (rows,)):
      raise ShapeError(
          "GroupedRagged needs blocks that are pj.Ragged with one ragged axis and no "
          "batch padding, and order and position of shape (examples,); build one with "
          "pj.Ragged.from_list(examples, groups=pj.LengthGroups()).")

  def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Any], ...], int | None]:
    key = jax.tree_util.GetAttrKey
    return ((key("blocks"), self.blocks), (key("order"), self.order),
            (key("position"), self.position)), self.batch_size_per_run

  @classmethod
  def tree_unflatten(cls, chunk: int | None, children: Sequence[Any]) -> "GroupedRagged":
    blocks, order, position = children
    r = object.__new__(cls)   # no validation: JAX unflattens with placeholder leaves
    r.blocks, r.order, r.position, r.batch_size_per_run = blocks, order, position, chunk
    return r

  ragged_axes = 1

  @property
  def batch_size(self) -> int:
    """The number of examples (static): no row of a block is padding."""
    return sum(b.batch_size for b in self.blocks)

  @property
  def num_examples(self) -> int:
    return self.batch_size

  def __len__(self) -> int:
    return self.batch_size

  @property
  def padded_lengths(self) -> tuple[int, ...]:
    """Each block's padded length (static)."""
    return tuple(b.padded_lengths[0] for b in self.blocks)

  @property
  def lengths(self) -> jax.Array:
    """int32 `(n,)`: each example's length, in the original order."""
    return jnp.take(jnp.concatenate([jnp.asarray(b.lengths) for b in self.blocks]),
                    self.position)

  def to_list(self) -> list[Any]:
    """The examples, unpadded, in the original order (NumPy, on the host)."""
    rows = [x for b in self.blocks for x in b.to_list()]
    return [rows[int(p)] for p in np.asarray(self.position)]

  def __repr__(self) -> str:
    shapes = ", ".join(f"{b.batch_size}x{b.padded_lengths[0]}" for b in self.blocks)
    return f"GroupedRagged({self.batch_size} examples in blocks {shapes})"


def _is_leaf(x: object) -> bool:
  return isinstance(x, (Ragged, GroupedRagged))


def _in_axes(in_axes: Any, args: tuple[Any, ...], n_leaves: int) -> list[Any]:
  """`in_axes` per flat argument, grouped batches and Ragged as leaves."""
  return leaf_axes(in_axes, args, n_leaves, _is_leaf, "a grouped batch")


def _take_rows(x: Any, rows: Any, axis: int | None) -> Any:
  """The rows `rows` of a mapped argument (a pytree, or a plain Ragged)."""
  if axis is None:
    return x
  if isinstance(x, Ragged):
    return Ragged._make(jax.tree.map(lambda a: jnp.take(a, rows, axis=0), x.data),
                        jnp.take(x.lengths, rows, axis=0), None, x.ragged_axes)
  return jax.tree.map(lambda a: jnp.take(a, rows, axis=axis), x)


def _rows_slice(x: Any, start: int, stop: int, axis: int | None) -> Any:
  if axis is None:
    return x
  return jax.tree.map(lambda a: lax.slice_in_dim(a, start, stop, axis=axis), x)


class GroupedVmapped(RaggedVmapped):
  """`pj.vmap`'s result: a `RaggedVmapped` that also runs grouped batches."""

  def __init__(self, fun: Callable[..., Any], in_axes: InAxes, out_axes: OutAxes) -> None:
    super().__init__(fun, in_axes, out_axes)

    def run_groups(*args: Any) -> Any:
      return self._run_groups(*args)

    run_groups.__name__ = run_groups.__qualname__ = f"vmap_{getattr(fun, '__name__', 'fun')}"
    self._jitted_groups = jax.jit(run_groups)

  def __call__(self, *args: Any) -> Any:
    if any(isinstance(x, GroupedRagged) for x in jax.tree.leaves(args, is_leaf=_is_leaf)):
      return self._jitted_groups(*args)
    return super().__call__(*args)

  def _run_groups(self, *args: Any) -> Any:
    flat, treedef = jax.tree_util.tree_flatten_with_path(args, is_leaf=_is_leaf)
    leaves = [x for _, x in flat]
    paths = [describe(p) for p, _ in flat]
    axes = _in_axes(self.in_axes, args, len(leaves))
    grouped = [i for i, x in enumerate(leaves) if isinstance(x, GroupedRagged)]
    if len(grouped) > 1:
      raise ShapeError(
          f"pj.vmap got several grouped batches ({', '.join(paths[i] for i in grouped)}); "
          "it needs one: put the data of the same examples in one pj.Ragged "
          "(pj.Ragged.from_list([(tok, tgt), ...], groups=...)), or pass the others "
          "ungrouped (pj.Ragged.from_list without groups=).")
    which = grouped[0]
    batch: GroupedRagged = leaves[which]
    if axes[which] != 0:
      raise TypeError(f"pj.vmap maps a grouped batch over its examples, so its in_axes "
                      f"must be 0; {paths[which]} has in_axes {axes[which]}.")
    n = batch.batch_size
    for x, axis, path in zip(leaves, axes, paths, strict=True):
      if isinstance(x, GroupedRagged) or axis is None:
        continue
      if isinstance(x, Ragged) and (axis != 0 or x.batch_padded):
        raise TypeError(f"{path}: a pj.Ragged beside a grouped batch must have in_axes "
                        "0 and no batch padding.")
      sizes = {np.shape(a)[axis] for a in jax.tree.leaves(x)}
      if sizes != {n}:
        raise ShapeError(f"{path} has {sorted(sizes)} entries on its mapped axis {axis}, "
                         f"but the grouped batch holds {n} examples.")
    outs: list[Any] = []
    start = 0
    for block in batch.blocks:
      stop = start + block.batch_size
      rows = lax.slice_in_dim(batch.order, start, stop)
      block_leaves = [block if i == which else _take_rows(x, rows, a)
                      for i, (x, a) in enumerate(zip(leaves, axes, strict=True))]
      outs.append(self._run_block(treedef, block_leaves, axes, block.batch_size,
                                  batch.batch_size_per_run, rows))
      start = stop
    return self._gather(outs, batch.position)

  def _out_axes(self, outs: Any) -> list[int]:
    n = len(jax.tree.leaves(outs, is_leaf=is_ragged))
    axes = broadcast(self.out_axes, outs, n, "out_axes")
    if any(not isinstance(a, int) for a in axes):
      raise TypeError(f"pj.vmap over a grouped batch needs integer out_axes; got "
                      f"{self.out_axes!r}.")
    return axes

  def _run_block(self, treedef: Any, leaves: list[Any], axes: list[Any], rows: int,
                 chunk: int | None, examples: Any) -> Any:
    """`fun` on one block: at once, or `chunk` examples at a time (lax.map).
    `examples`: the original index of each of the block's rows (for errors)."""
    if chunk is None or chunk >= rows:
      return self._run(*treedef.unflatten(leaves), examples=examples)
    loops, rest = divmod(rows, chunk)
    head = loops * chunk

    def stacked(x: Any, axis: int) -> Any:   # (rows, ...) on `axis` -> (loops, chunk, ...)
      def one(a: Any) -> Any:
        a = jnp.moveaxis(lax.slice_in_dim(a, 0, head, axis=axis), axis, 0)
        return a.reshape(loops, chunk, *a.shape[1:])
      return jax.tree.map(one, x)

    mapped = [stacked(x, a) if a is not None else None for x, a in zip(leaves, axes, strict=True)]

    def body(carried: tuple[list[Any], Any]) -> Any:
      parts, chunk_examples = carried
      chunk_leaves = [x if a is None else
                      jax.tree.map(lambda v, a=a: jnp.moveaxis(v, 0, a), p)
                      for x, a, p in zip(leaves, axes, parts, strict=True)]
      return self._run(*treedef.unflatten(chunk_leaves), examples=chunk_examples)

    looped = lax.map(body, (mapped, examples[:head].reshape(loops, chunk)))
    out_tree: Any  # (a PyTreeDef, which jaxlib ships no type stub for)
    out_leaves, out_tree = jax.tree.flatten(looped, is_leaf=is_ragged)
    merged: list[Any] = []
    for x, axis in zip(out_leaves, self._out_axes(looped), strict=True):
      def merge(a: Any, axis: int) -> Any:   # (loops, ..., chunk at axis+1, ...) -> rows
        axis = axis % (a.ndim - 1)           # (a negative out_axes counts from the end)
        a = jnp.moveaxis(a, 0, axis)
        return a.reshape(*a.shape[:axis], head, *a.shape[axis + 2:])
      if isinstance(x, Ragged):
        merged.append(Ragged._make(jax.tree.map(lambda a: merge(a, 0), x.data),
                                   merge(x.lengths, 0), None, x.ragged_axes))
      else:
        merged.append(merge(x, axis))
    out = out_tree.unflatten(merged)
    if not rest:
      return out
    tail = self._run(*treedef.unflatten(
        [_rows_slice(x, head, rows, a) for x, a in zip(leaves, axes, strict=True)]),
        examples=examples[head:rows])
    return self._gather([out, tail], None)

  def _gather(self, outs: list[Any], position: Any) -> Any:
    """The blocks' outputs concatenated over their rows, then (if `position`)
    put back in the original order."""
    flat = [jax.tree.flatten(o, is_leaf=is_ragged) for o in outs]
    tree: Any = flat[0][1]  # (a PyTreeDef, which jaxlib ships no type stub for)
    axes = self._out_axes(outs[0])
    reorder = (lambda a, axis: a) if position is None else (
        lambda a, axis: jnp.take(a, position, axis=axis))
    result: list[Any] = []
    for j, axis in enumerate(axes):
      parts = [leaves[j] for leaves, _ in flat]
      if isinstance(parts[0], Ragged):
        k = parts[0].ragged_axes
        top = tuple(max(s) for s in zip(*[p.padded_lengths for p in parts], strict=True))
        def pad(a: Any) -> Any:
          have = a.shape[1:1 + k]
          return jnp.pad(a, [(0, 0), *[(0, t - h) for t, h in zip(top, have, strict=True)],
                             *[(0, 0)] * (a.ndim - 1 - k)])
        data = jax.tree.map(lambda *xs: reorder(jnp.concatenate([pad(x) for x in xs]), 0),
                            *[p.data for p in parts])
        lengths = reorder(jnp.concatenate([p.lengths for p in parts]), 0)
        result.append(Ragged._make(data, lengths, None, k))
      else:
        result.append(reorder(jnp.concatenate(parts, axis=axis), axis))
    return tree.unflatten(result)


def vmap(fun: Callable[..., Any], in_axes: InAxes = 0, out_axes: OutAxes = 0) -> GroupedVmapped:
  return shared_vmap(GroupedVmapped, fun, in_axes, out_axes)


vmap.__doc__ = (_plain_vmap.__doc__ or "") + """
  A grouped batch (`pj.Ragged.from_list(examples, groups=pj.LengthGroups())`)
  runs block by block in the same program; per-example outputs come back in
  the original order, outputs with a ragged axis as one `pj.Ragged`.
  """


