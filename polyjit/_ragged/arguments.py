"""The flat arguments of a `pj.vmap` call: axes, paths, batch, padded-out rows.

`pj.vmap` flattens its arguments with `Ragged` (and grouped batches) as
leaves, and gives each leaf its `in_axes` entry as `jax.vmap` would (a pytree
prefix broadcast over the leaves). This module holds what is decided per flat
argument: where it is in the call (`describe`, for error messages), its axis,
the batch size all of them must agree on, the abstract value of one example
(what `fun` is traced with), and the padded-out rows of a batch-padded call
replaced by row 0 (see `vmap.py` on why that keeps gradients exact).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from .._masking.errors import ShapeError
from .ragged import Ragged, is_concrete, is_ragged


def describe(path: tuple[Any, ...], what: str = "argument") -> str:
  """'argument 1', 'argument 0 at ['x']' from a path into the args tuple
  ('output 1' with `what="output"`, a path into the outputs)."""
  if not path:
    return "the output"
  head, rest = path[0], path[1:]
  name = f"{what} {head.idx}" if hasattr(head, "idx") else jax.tree_util.keystr((head,))
  return name + (f" at {jax.tree_util.keystr(rest)}" if rest else "")


def leading_dynamic_axes(aval: Any, where: str) -> int:
  """How many leading axes of an output depend on the example's length; a
  ShapeError naming the output (`where`, from `describe`) where such an axis
  follows a fixed one (a `pj.Ragged`'s varying axes come first). The padded
  and the packed `pj.vmap` both check their outputs here, before running."""
  shape = aval.shape
  lead = next((a for a, d in enumerate(shape) if not jc.is_symbolic_dim(d)), len(shape))
  later = [a for a in range(lead, len(shape)) if jc.is_symbolic_dim(shape[a])]
  if later:
    raise ShapeError(
        f"{where} of the function has shape {aval.str_short()}: its axis {later[0]} "
        "depends on the example's length but follows a fixed axis. pj.vmap returns "
        "such outputs as a pj.Ragged, whose varying axes come first: move them to "
        f"the front inside the function (e.g. jnp.moveaxis(y, {later[0]}, 0)).")
  return lead


def broadcast(prefix: Any, tree: Any, n_leaves: int, what: str,
               is_leaf: Callable[[Any], bool] = is_ragged,
               batch: str = "a pj.Ragged") -> list[Any]:
  """`prefix` (ints and None) broadcast over `tree`'s leaves (`is_leaf`:
  Ragged, or grouped batches too, count as leaves)."""
  out: list[Any] = []
  extend = lambda ax, sub: out.extend([ax] * len(jax.tree.leaves(sub, is_leaf=is_leaf)))
  try:
    jax.tree.map(extend, prefix, tree, is_leaf=lambda x: x is None)
  except ValueError as e:
    raise ValueError(f"pj.vmap {what} {prefix!r} is not a pytree prefix of the "
                     f"values: {e}") from None
  if len(out) != n_leaves:
    raise TypeError(f"pj.vmap {what} must give {batch} one axis (0), not a "
                    f"pytree of axes; got {prefix!r}.")
  return out


def leaf_axes(in_axes: Any, args: tuple[Any, ...], n_leaves: int,
               is_leaf: Callable[[Any], bool] = is_ragged,
               batch: str = "a pj.Ragged") -> list[Any]:
  """`in_axes` per flat argument (one entry per positional argument, or one for all)."""
  if not isinstance(in_axes, tuple):
    in_axes = (in_axes,) * len(args)
  elif len(in_axes) != len(args):
    raise ValueError(
        f"pj.vmap in_axes has {len(in_axes)} entries but the function was called "
        f"with {len(args)} positional arguments; give one entry per argument.")
  return broadcast(in_axes, args, n_leaves, "in_axes", is_leaf, batch)


def batch_and_count(leaves: list[Any], axes: list[Any], paths: list[str]) -> tuple[int, Any]:
  """The padded batch size and the number of examples (None: not padded)."""
  raggeds = [(x, a, p) for x, a, p in zip(leaves, axes, paths, strict=True) if is_ragged(x)]
  first, _, first_path = raggeds[0]
  batch = first.batch_size
  for x, axis, path in raggeds:
    if axis != 0:
      raise TypeError(
          f"pj.vmap maps a pj.Ragged over its examples, so its in_axes must be 0; "
          f"{path} has in_axes {axis}.")
    if x.batch_size != batch:
      raise ShapeError(
          f"{path} holds {x.batch_size} rows but {first_path} holds {batch}: "
          "pj.Ragged arguments of one call need the same (padded) batch size.")
  count = next((x.num_examples for x, _, _ in raggeds if x.batch_padded), None)
  for x, axis, path in zip(leaves, axes, paths, strict=True):
    if is_ragged(x) or axis is None:
      continue
    size = np.shape(x)[axis]
    if size != batch:
      hint = (" Pad it like the batch: pj.Ragged.from_list(values, ragged_axes=0, "
              "batch_buckets=...) with the same batch_buckets." if count is not None else "")
      raise ShapeError(
          f"{path} has {size} entries on its mapped axis {axis}, but the pj.Ragged "
          f"arguments hold {batch} rows.{hint}")
  return batch, count


def check_counts(raggeds: list[Ragged]) -> None:
  counts = {len(r) for r in raggeds if r.batch_padded and is_concrete(r.num_examples)}
  if len(counts) > 1:
    raise ShapeError(
        f"the batch-padded pj.Ragged arguments disagree on the number of examples "
        f"({sorted(counts)}): pad every argument of one batch from the same examples.")



def first_for_padded(x: Any, axis: int | None, keep: jax.Array | None) -> Any:
  """`x` (a pytree) with the padded-out rows along `axis` replaced by row 0.

  Padded-out examples then compute finite values whatever their padding holds,
  and since their outputs never count, they contribute exact zeros to gradients.
  """
  if keep is None or axis is None:
    return x

  def fill(a: Any) -> Any:
    shape = [1] * a.ndim
    shape[axis] = a.shape[axis]
    # Row 0 as a sum over the batch axis of the rows where it is kept alone,
    # exact (x + 0 == x), and unlike slicing one row out of a batch split over
    # an explicitly sharded mesh axis it is allowed under sharding-in-types.
    is_first = (jnp.arange(a.shape[axis]) == 0).reshape(shape)
    first = jnp.sum(jnp.where(is_first, a, jnp.zeros((), a.dtype)), axis=axis,
                    keepdims=True, dtype=a.dtype)
    return jnp.where(keep.reshape(shape), a, first)

  return jax.tree.map(fill, x)


def aval_key(x: Any, axis: Any) -> tuple[Any, ...]:
  """What a trace of `fun` depends on in one flat argument (concrete or traced)."""
  def one(a: Any) -> tuple[tuple[int, ...], str, bool]:
    t = jc.typeof(a)
    return tuple(t.shape), str(t.dtype), bool(t.weak_type)
  if is_ragged(x):
    return (x.ragged_axes, tuple(one(a) for a in jax.tree.leaves(x.data)),
            jax.tree.structure(x.data))
  return one(x), axis


def example_struct(x: Any, axis: int | None, padded: Any) -> Any:
  """The abstract value of one example of a flat argument (for tracing): its
  dtype as JAX sees the argument (a float64 `jax.Array` made under
  `jax.enable_x64()` stays float64 with x64 off, as in jax.jit's trace; a
  `jax.ShapeDtypeStruct` would make it float32: `jc.make_closed_jaxpr`)."""
  def struct(shape: Sequence[int], a: Any) -> Any:
    t = jc.typeof(a)
    return jc.shaped(shape, t.dtype, t.weak_type)
  if is_ragged(x):
    k = x.ragged_axes
    return jax.tree.map(lambda a: struct((*padded, *np.shape(a)[1 + k:]), a), x.data)
  shape = list(np.shape(x))
  if axis is not None:
    del shape[axis]
  return struct(shape, x)


def pad_ragged_axes(data: Any, padded: tuple[int, ...]) -> Any:
  """`data` with its ragged axes padded (with zeros) up to `padded`."""
  def pad(x: Any) -> Any:
    have = x.shape[1:1 + len(padded)]
    if tuple(have) == tuple(padded):
      return x
    widths = [(0, 0), *[(0, p - h) for p, h in zip(padded, have, strict=True)],
              *[(0, 0)] * (x.ndim - 1 - len(padded))]
    return jnp.pad(x, widths)
  return jax.tree.map(pad, data)


def split_lengths(lengths: Any, k: int) -> list[Any]:
  """`(batch,)` or `(batch, k)` lengths as one `(batch,)` array per ragged axis."""
  return [lengths] if k == 1 else [lengths[:, j] for j in range(k)]


def host_lengths(raggeds: Sequence[Ragged]) -> list[np.ndarray]:
  """Concrete lengths on the host, padded-out rows replaced by row 0's (as
  the program does)."""
  out = [np.array(r.lengths) for r in raggeds]
  count = next((int(np.asarray(r.num_examples)) for r in raggeds if r.batch_padded), None)
  if count is not None:
    for lengths in out:
      lengths[count:] = lengths[0]
  return out
