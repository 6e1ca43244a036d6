"""Examples on the host: validated, then padded into one NumPy array per leaf.

`Ragged.from_list` and `Ragged.from_process_local` build a batch from
examples of different sizes without running a device program: the examples
are checked and padded with NumPy here, and only the padded arrays are
transferred.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from .._masking.errors import ShapeError


def host_examples(examples: Sequence[Any], k: int
                  ) -> tuple[list[list[np.ndarray]], Any, list[Any]]:
  """Flattens examples on the host: (per-leaf lists of arrays, tree, sizes)."""
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
    for leaf, (column, x) in enumerate(zip(columns, arrays)):
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
    if 0 in size:
      raise ShapeError(
          f"example {i} is empty (sizes {size} on its ragged axes): polyjit "
          "runs each example with logical sizes >= 1; leave empty examples out.")
    sizes.append(size)
  return columns, tree, sizes


def host_pad(arrays: list[np.ndarray], padded: tuple[int, ...], batch: int) -> np.ndarray:
  k = len(padded)
  dtype = jax.dtypes.canonicalize_dtype(np.result_type(*{a.dtype for a in arrays}))
  out = np.zeros((batch, *padded, *arrays[0].shape[k:]), dtype)
  for i, x in enumerate(arrays):
    index: tuple[int | slice, ...] = (i, *(slice(0, s) for s in x.shape[:k]))
    out[index] = x
  return out

