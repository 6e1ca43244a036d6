"""Examples on the host: validated once, then padded with NumPy.

`Ragged.from_list`, `Ragged.from_process_local` and `LengthGroups.from_list`
build batches from examples of different sizes without running a device
program. They differ only in how the padded sizes and the number of rows are
chosen (a bucket policy; agreed over processes; per length block) and in how
the padded arrays reach the devices. What they share is here, written once:
`HostExamples` checks the examples (one pytree structure, leaves of one
example sharing their lengths, fixed axes agreeing, no empty example) and
pads any of them into one NumPy array per leaf and their lengths.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from .._masking.errors import ShapeError


class HostExamples:
  """Examples checked on the host.

  Attributes:
    ragged_axes: k, how many leading axes of every leaf vary.
    columns: one list per pytree leaf, of that leaf of every example (NumPy).
    tree: the examples' pytree structure.
    sizes: int `(examples, k)`: each example's sizes on its ragged axes.
  """

  def __init__(self, examples: Sequence[Any], ragged_axes: Any, empty_error: str) -> None:
    examples = list(examples)
    if not examples:
      raise ShapeError(empty_error)
    if not isinstance(ragged_axes, int) or ragged_axes < 0:
      raise TypeError(f"ragged_axes must be an int >= 0, got {ragged_axes!r}")
    self.ragged_axes = ragged_axes
    self.columns, self.tree, sizes = _checked_columns(examples, ragged_axes)
    self.sizes = np.asarray(sizes, np.int64).reshape(len(examples), ragged_axes)

  def __len__(self) -> int:
    return len(self.sizes)

  def longest(self) -> list[int]:
    """The largest size of each ragged axis."""
    return [int(m) for m in self.sizes.max(axis=0)]

  def pad(self, padded: Sequence[int], rows: int,
          indices: Sequence[int] | np.ndarray | None = None
          ) -> tuple[list[np.ndarray], np.ndarray]:
    """The examples at `indices` (default: all, in order) padded to `padded`
    on their ragged axes, in `rows` rows (rows past them hold zeros): one
    array per leaf, and the int32 lengths, `(rows,)` for one ragged axis or
    `(rows, k)` for k (0 in the padded-out rows)."""
    picked = range(len(self)) if indices is None else [int(i) for i in indices]
    data = [_pad([column[i] for i in picked], tuple(padded), rows)
            for column in self.columns]
    lengths = np.zeros((rows, self.ragged_axes), np.int32)
    lengths[:len(picked)] = self.sizes[list(picked)]
    return data, (lengths[:, 0] if self.ragged_axes == 1 else lengths)

  def unflatten(self, leaves: Sequence[Any]) -> Any:
    """One value per leaf in the examples' pytree structure."""
    return jax.tree.unflatten(self.tree, leaves)


def _checked_columns(examples: Sequence[Any], k: int
                     ) -> tuple[list[list[np.ndarray]], Any, list[Any]]:
  """(per-leaf lists of arrays, tree, sizes): every check of the examples."""
  tree: Any  # (a PyTreeDef, which jaxlib ships no type stub for)
  t: Any
  _, tree = jax.tree.flatten(examples[0])
  columns: list[list[np.ndarray]] = [[] for _ in range(tree.num_leaves)]
  sizes: list[Any] = []
  for i, example in enumerate(examples):
    leaves, t = jax.tree.flatten(example)
    if t != tree:
      raise ShapeError(
          f"example {i} has the structure {t}, but example 0 has {tree}: every "
          "example must have the same pytree structure.")
    arrays = [np.asarray(x) for x in leaves]
    size: Any = None
    for leaf, (column, x) in enumerate(zip(columns, arrays, strict=True)):
      where = f"example {i}" + (f" leaf {leaf}" if len(arrays) > 1 else "")
      if x.ndim < k:
        raise ShapeError(
            f"{where} has shape {x.shape}, fewer than ragged_axes={k} axes.")
      if size is None:
        size = x.shape[:k]
      if x.shape[:k] != size:
        raise ShapeError(
            f"{where} has sizes {x.shape[:k]} on its ragged axes but {size} on "
            "another leaf: the leaves of one example share their lengths.")
      if column and x.shape[k:] != column[0].shape[k:]:
        raise ShapeError(
            f"{where} has shape {x.shape} but example 0 has {column[0].shape}: "
            f"only the leading {k} axes may vary (ragged_axes={k}); raise "
            "ragged_axes if more of the leading axes vary.")
      column.append(x)
    sizes.append(size)
  return columns, tree, sizes


def _pad(arrays: list[np.ndarray], padded: tuple[int, ...], rows: int) -> np.ndarray:
  k = len(padded)
  dtype = jax.dtypes.canonicalize_dtype(np.result_type(*{a.dtype for a in arrays}))
  out = np.zeros((rows, *padded, *arrays[0].shape[k:]), dtype)
  for i, x in enumerate(arrays):
    index: tuple[int | slice, ...] = (i, *(slice(0, s) for s in x.shape[:k]))
    out[index] = x
  return out
