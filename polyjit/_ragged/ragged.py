"""Ragged batching: `pj.Ragged` and `pj.vmap`.

    batch = pj.Ragged.from_list([x1, x2, x3])       # examples of different lengths
    ys = pj.vmap(fun)(batch)                        # fun written for one example
    ys.to_list()                                    # == [fun(x1), fun(x2), fun(x3)]

Design
------
A `Ragged` is a batch of examples whose leading `ragged_axes` axes differ in
size (sequences: one axis; images of different height and width: two). It is a
pytree of three children, so it passes through `jax.jit`, `jax.grad` and
`pj.jit` like any container:

* `data`: every example padded to the same shape, stacked on a new leading
  batch axis: `(batch, P_1, ..., P_k, *fixed)`. `P_j` comes from a bucket
  policy (`polyjit.buckets`), so batches of similar lengths have equal shapes
  and reuse compiled programs. `data` may be a pytree of arrays whose examples
  share their lengths (tokens and per-token targets).
* `lengths`: int32, `(batch,)` for one ragged axis, `(batch, k)` for k.
* `num_examples`: None, or an int32 scalar when the batch axis itself is
  padded (`batch_buckets=`): then only the first `num_examples` rows are
  examples, so the last, smaller batch of an epoch reuses the program of the
  full ones.

The number of ragged axes and whether the batch is padded are static (pytree
structure); sizes and counts are data, so they may be traced.

`pj.vmap(fun)` masks `fun` (`pj.mask`) with one dimension variable per ragged
axis of each `Ragged` argument (`n{i}_{j}`: the i-th `Ragged` among the
arguments, axis j; its data leaves share them, and so do Ragged arguments
whose lengths `fun` needs equal: see below), and `jax.vmap`s the
masked function over the padded data and the per-example lengths; other
arguments follow `in_axes` exactly as in `jax.vmap`. Each example therefore
runs with its own logical size, and results and gradients are exact (see
`_mask.py`). Outputs whose symbolic shape mentions a size come back as
`Ragged` (their lengths evaluated per example); the others are stacked. The
masked function is cached per argument structure and the whole call is one
`jax.jit`, so a new batch in the same buckets neither retraces nor compiles.

Ragged arguments that share their lengths
-----------------------------------------
Tokens and per-token targets built by two `Ragged.from_list` calls have
equal lengths, example by example, and `fun` needs them equal (`x * y`,
`(pred - y) ** 2`): with one variable per argument JAX cannot trace it
(`mul got incompatible shapes: (n0_0, 3), (n1_0, 1)`). A query sequence and
a key sequence may differ (cross attention) and must keep their own sizes.
`pj.vmap` makes two Ragged arguments share their variables exactly when
`fun` needs their lengths equal, and checks on every call that they are:

* **The rule.** Two Ragged arguments with the same number of ragged axes
  share their size variables (all of them: the first one's `n{i}_{j}`) when
  `fun` traces with them shared, and fails with them separate both when the
  first may be the longer and when the second may (`n1_0 >= n0_0 + 1`, and
  the other way, as constraints). The pairs tried are those whose sizes the
  failure names (`(n0_0, 3), (n1_0, 1)`, or a branch 'n0_0 != n1_0' that
  raises); more pairs may follow for more arguments. So `k[:q.shape[0]]`,
  which needs keys at least as long as queries, never makes them equal:
  that would demand more than `fun` does (it fails as it did). Padded sizes
  may differ (the smaller is padded up inside the program). Finding this
  costs up to four extra traces of `fun`, once per argument structure, and
  only where a trace with separate sizes fails.
* **Why from `fun`, not from the data.** Whether `fun` needs equal lengths
  is a property of `fun`, the same for every batch: one program per
  argument structure, concrete and traced lengths alike, and a batch whose
  lengths happen to agree never changes how another batch runs. Deciding
  from the lengths of the call (share when equal) would give traced lengths
  (`jax.jit(jax.grad(loss))(params, tokens, targets)`, the common case)
  nothing to decide on; sharing whenever the padded shapes agree would
  break queries and keys of one bucket. As with a Python loop over the
  unpadded examples, every batch `fun` accepts runs, and a batch fails (a
  `pj.ShapeError`) exactly when some example would fail `fun` itself.
* **The check.** Shared lengths must be equal on every real example, or a
  `pj.ShapeError` names both arguments, the first differing example and its
  two lengths, and what to do. Concrete lengths (an eager call) are
  compared on the host before anything runs. Traced lengths are compared in
  the program: a `lax.cond` whose taken side calls back to the host
  (`jax.pure_callback`) to raise; equal lengths cost one comparison and no
  callback (a few microseconds per call on CPU; `jax.grad`, `jax.vmap` and
  `pj.jit` pass through it). JAX surfaces an error raised in a callback as a
  `JaxRuntimeError` whose message ends with the `pj.ShapeError` text (and
  logs the callback's traceback).
* **Simplest.** Data of the same examples belongs in one `Ragged`:
  `pj.Ragged.from_list([(tok, tgt), ...])` (a pytree per example); its
  leaves share their lengths by construction, with no check and no probe.

Padded-out examples
-------------------
Rows past `num_examples` must never count. Two rules make that hard to get
wrong:

* They run as copies of example 0 (data, lengths and every batched argument),
  so they compute finite values even where the padding holds NaN or a length
  of 0 would be invalid; their outputs get zero cotangents, and 0 times a
  finite derivative is exactly 0, so they add nothing to any gradient.
* When the batch is padded, *every* output comes back as a `Ragged`, per-
  example scalars included (a `Ragged` with no ragged axes): `.mean()` and
  `.sum()` then count real examples only, while `jnp.mean(out)` is a
  TypeError rather than a silently wrong mean. Without batch padding,
  per-example scalars are an ordinary array, and its `.mean()` is right too.
  So `pj.vmap(loss)(params, batch).mean()` is correct either way.
"""

from __future__ import annotations

import functools
import math
import re
from typing import (TYPE_CHECKING, Any, Callable, Hashable, Literal, Sequence, TypeAlias,
                    TypeVar, cast, overload)

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Sharding
from jax.typing import ArrayLike

from .._buckets import fixed as _buckets
from .._masking import dims as _dims
from .. import _jax as jc
from .._sharding import placement as _sharding
from .._masking.errors import MaskingError, ShapeError
from .._masking.mask import Masked
from .._masking.padding import is_key_dtype

if TYPE_CHECKING:  # (_ragged_groups builds on this module)
  from .groups import GroupedRagged, LengthGroups

#: `pj.vmap`'s `in_axes`, as in `jax.vmap`: an int, None, or a list or tuple
#: with one pytree prefix (of ints and Nones) per positional argument.
InAxes: TypeAlias = "int | None | Sequence[Any]"

#: `pj.vmap`'s `out_axes`, as in `jax.vmap`: a pytree prefix of the outputs
#: whose leaves are ints or None.
OutAxes: TypeAlias = Any

#: Groups of Ragged arguments (by number) that share their size variables.
Groups: TypeAlias = tuple[tuple[int, ...], ...]


def _is_ragged(x: object) -> bool:
  return isinstance(x, Ragged)


def _is_concrete(x: object) -> bool:
  return not isinstance(x, jc.Tracer)


@jax.tree_util.register_pytree_with_keys_class
class Ragged:
  """A batch of examples whose leading `ragged_axes` axes differ in size.

  Build one with `Ragged.from_list(examples)` (padding on the host), or from
  padded parts: `Ragged(data, lengths, num_examples=None)`.

  Attributes:
    data: the padded examples, `(batch, P_1, ..., P_k, *fixed)` (or a pytree
      of such arrays sharing the lengths). The padding is unspecified.
    lengths: int32 logical sizes, `(batch,)` for one ragged axis, `(batch, k)`
      for k (`(batch, 0)` for none).
    ragged_axes: k, the number of leading example axes that vary.
  """

  def __init__(self, data: Any, lengths: ArrayLike, num_examples: ArrayLike | None = None) -> None:
    lengths = lengths if isinstance(lengths, jax.Array) else np.asarray(lengths)
    if lengths.ndim not in (1, 2) or not jnp.issubdtype(lengths.dtype, jnp.integer):
      raise TypeError(
          "Ragged lengths must be an integer array of shape (batch,) for one "
          f"ragged axis or (batch, k) for k; got {lengths.dtype}{list(lengths.shape)}.")
    if isinstance(lengths, np.ndarray):  # what a traced size is: int32
      lengths = lengths.astype(np.int32)
    k = 1 if lengths.ndim == 1 else lengths.shape[1]
    if num_examples is not None and not isinstance(num_examples, jax.Array):
      num_examples = np.asarray(num_examples, np.int32)
    self._set(data, lengths, num_examples, k)
    _validate(self)

  def _set(self, data: Any, lengths: Any, count: Any, k: int) -> None:
    self.data = data
    self.lengths = lengths
    self._count = count
    self.ragged_axes = k

  @classmethod
  def _make(cls, data: Any, lengths: Any, count: Any, k: int) -> "Ragged":
    """Builds without validation (traced parts, pytree unflattening)."""
    r = object.__new__(cls)
    r._set(data, lengths, count, k)
    return r

  # --- pytree ----------------------------------------------------------------

  def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Any], ...], int]:
    key = jax.tree_util.GetAttrKey
    children = ((key("data"), self.data), (key("lengths"), self.lengths),
                (key("num_examples"), self._count))
    return children, self.ragged_axes

  @classmethod
  def tree_unflatten(cls, k: int, children: Sequence[Any]) -> "Ragged":
    data, lengths, count = children
    return cls._make(data, lengths, count, k)

  # --- construction on the host ----------------------------------------------

  @overload
  @classmethod
  def from_list(cls, arrays: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None, batch_buckets: _buckets.BucketSpec = None,
                sharding: Sharding | None = None, groups: None = None) -> "Ragged": ...

  @overload
  @classmethod
  def from_list(cls, arrays: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None, batch_buckets: Literal[None] = None,
                sharding: Literal[None] = None, groups: "LengthGroups") -> "GroupedRagged": ...

  @classmethod
  def from_list(cls, arrays: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None, batch_buckets: _buckets.BucketSpec = None,
                sharding: Sharding | None = None,
                groups: "LengthGroups | None" = None) -> "Ragged | GroupedRagged":
    """Pads examples of different sizes into one `Ragged` (on the host).

    Args:
      arrays: the examples: arrays (NumPy or JAX), or pytrees of arrays with
        one structure, whose leading `ragged_axes` axes may differ from
        example to example (equal within an example); the other axes must
        agree.
      ragged_axes: how many leading axes vary: 1 for sequences, 2 for images
        of different height and width, 0 for fixed-size examples (per-example
        targets of a batch whose size is padded).
      buckets: the bucket policy for the padded size of each ragged axis (a
        `polyjit.buckets` policy, a list of sizes, an int k for multiples of
        k, or a callable); None: powers of two from 16.
      batch_buckets: the same, for the number of examples. None (default): no
        padding, `data.shape[0] == len(arrays)`. With a policy, padded-out
        rows follow, and every `pj.vmap` output becomes a `Ragged` whose
        `.mean()`/`.sum()` skip them.
      sharding: None (one device), or a `NamedSharding` for the batch axis,
        e.g. `NamedSharding(mesh, P("data"))`: each device receives its rows
        (the data, lengths and per-example outputs of `pj.vmap` stay split
        over the mesh). The number of rows (after `batch_buckets`, rounded up
        to a multiple of the shard count) must split evenly.

      groups: None, or a `pj.LengthGroups`: the examples are kept in a few
        blocks by length, each padded to its own size, and a
        `GroupedRagged` comes back (`_ragged_groups.py`): for functions whose
        cost grows faster than the length (attention). One ragged axis, no
        `batch_buckets` or `sharding`.

    Padding is done with NumPy and the result is transferred with
    `jax.device_put`: no device program is compiled for any shape.
    """
    if groups is not None:
      if batch_buckets is not None or sharding is not None:
        raise TypeError("Ragged.from_list(groups=...) takes neither batch_buckets nor "
                        "sharding: a grouped batch has no padded rows and one device.")
      return groups.from_list(arrays, ragged_axes=ragged_axes, buckets=buckets)
    examples = list(arrays)
    if not examples:
      raise ShapeError("Ragged.from_list needs at least one example.")
    if not isinstance(ragged_axes, int) or ragged_axes < 0:
      raise TypeError(f"ragged_axes must be an int >= 0, got {ragged_axes!r}")
    leaves, tree, sizes = _host_examples(examples, ragged_axes)
    policy = _buckets.as_policy(buckets)
    padded = tuple(policy(max(s[j] for s in sizes)) for j in range(ragged_axes))
    n = len(examples)
    batch = n if batch_buckets is None else _buckets.as_policy(batch_buckets)(n)
    if sharding is not None:
      sharding = _sharding.batch_sharding(sharding)
      if batch_buckets is not None:
        batch = _sharding.round_up(batch, _sharding.batch_multiple(sharding))
      _sharding.check_batch(batch, sharding, "Ragged.from_list")
    data = [_host_pad(column, padded, batch) for column in leaves]
    lengths = np.zeros((batch, ragged_axes), np.int32)
    lengths[:n] = sizes
    if ragged_axes == 1:
      lengths = lengths[:, 0]
    count = None if batch_buckets is None else _sharding.put_replicated(np.int32(n), sharding)
    return cls._make(jax.tree.unflatten(tree, [_sharding.put_batch(d, sharding) for d in data]),
                     _sharding.put_batch(lengths, sharding), count, ragged_axes)

  @classmethod
  def from_process_local(cls, local_examples: Sequence[Any], sharding: Sharding, *,
                         ragged_axes: int = 1, buckets: object = None) -> "Ragged":
    """The global ragged batch of a multi-process run, from each process's
    own examples (call it on every process, with the same arguments but
    `local_examples`).

    The processes agree on one padded size per ragged axis (the bucket of
    the largest example of any process: one small collective over the local
    maxima and counts), each pads only its own examples, and the rows are
    assembled with `jax.make_array_from_process_local_data`: process p's
    examples are the rows of its devices along the batch axis of `sharding`.
    Every process must hold the same number of examples, a multiple of its
    devices along that axis. One process: the same as `from_list`.
    """
    examples = list(local_examples)
    if not examples:
      raise ShapeError("Ragged.from_process_local needs at least one example per process.")
    if not isinstance(ragged_axes, int) or ragged_axes < 0:
      raise TypeError(f"ragged_axes must be an int >= 0, got {ragged_axes!r}")
    sharding = _sharding.batch_sharding(sharding)
    leaves, tree, sizes = _host_examples(examples, ragged_axes)
    n = len(examples)
    local_max = [max(s[j] for s in sizes) for j in range(ragged_axes)]
    global_max, batch = _sharding.agree_on_batch(local_max, n)
    policy = _buckets.as_policy(buckets)
    padded = tuple(policy(m) for m in global_max)
    _sharding.check_batch(batch, sharding, "Ragged.from_process_local")
    data = [_host_pad(column, padded, n) for column in leaves]
    lengths = np.asarray(sizes, np.int32).reshape(n, ragged_axes)
    if ragged_axes == 1:
      lengths = lengths[:, 0]
    put = functools.partial(_sharding.put_process_local, sharding=sharding, global_batch=batch)
    return cls._make(jax.tree.unflatten(tree, [put(d) for d in data]), put(lengths), None,
                     ragged_axes)

  def to_list(self) -> list[Any]:
    """The examples, unpadded, as NumPy arrays (or pytrees of them)."""
    leaves, tree = jax.tree.flatten(self.data)
    if not all(_is_concrete(x) for x in [*leaves, self.lengths, self._count]):
      raise TypeError(
          "Ragged.to_list reads the examples on the host, so it needs concrete "
          "values: call it outside jax.jit/jax.grad (inside, use .data with "
          ".mask, .sum() or .mean()).")
    # typed PRNG keys have no NumPy form: they stay key arrays (sliced on the device)
    host = [x if is_key_dtype(x.dtype) else np.asarray(x) for x in leaves]
    lengths = np.asarray(self.lengths).reshape(self.batch_size, self.ragged_axes)
    return [jax.tree.unflatten(tree, [h[i][tuple(slice(0, s) for s in lengths[i])]
                                      for h in host])
            for i in range(len(self))]

  # --- sizes -----------------------------------------------------------------

  @property
  def batch_size(self) -> int:
    """The padded number of rows (static)."""
    rows: int = jax.tree.leaves(self.data)[0].shape[0]
    return rows

  @property
  def padded_lengths(self) -> tuple[int, ...]:
    """The padded size of each ragged axis (static)."""
    return tuple(jax.tree.leaves(self.data)[0].shape[1:1 + self.ragged_axes])

  @property
  def batch_padded(self) -> bool:
    """Whether rows past `num_examples` are padding (static)."""
    return self._count is not None

  @property
  def num_examples(self) -> int | jax.Array:
    """The number of examples: an int, or an int32 scalar (traced inside
    `jax.jit`) when the batch is padded."""
    return self.batch_size if self._count is None else self._count

  def __len__(self) -> int:
    if self._count is None:
      return self.batch_size
    if not _is_concrete(self._count):
      raise TypeError(
          "the number of examples of a batch-padded Ragged is a traced value "
          "inside jax.jit; use r.num_examples (a scalar) or r.example_mask.")
    return int(self._count)

  def length_columns(self) -> list[Any]:
    """The logical size of each ragged axis, one `(batch,)` array each."""
    if self.ragged_axes == 1:
      return [self.lengths]
    return [self.lengths[:, j] for j in range(self.ragged_axes)]

  # --- masks and reductions over valid entries --------------------------------

  @property
  def example_mask(self) -> jax.Array:
    """`(batch,)` bool: True for real examples, False for padded-out rows."""
    rows = jnp.arange(self.batch_size)
    return rows < (self.batch_size if self._count is None else self._count)

  @property
  def mask(self) -> Any:
    """Bool, shaped like `data` (a pytree of masks for pytree data): True on
    the valid entries of real examples."""
    return jax.tree.map(self._mask_like, self.data)

  def _mask_like(self, x: Any) -> jax.Array:
    lead = (x.shape[0],) + (1,) * (x.ndim - 1)
    mask = jnp.broadcast_to(self.example_mask.reshape(lead), x.shape)
    for j, size in enumerate(self.length_columns()):
      axis = 1 + j
      position = lax.broadcasted_iota(size.dtype, x.shape, axis)
      mask = mask & (position < size.reshape(lead))
    return mask

  def sum(self) -> Any:
    """The sum over every valid entry of every real example (per data leaf).

    Padding never enters, not even as 0 * NaN in gradients."""
    return jax.tree.map(lambda x: jnp.sum(x, where=self._mask_like(x)), self.data)

  def mean(self) -> Any:
    """The mean over every valid entry of every real example (per data leaf):
    the mean of the concatenated examples. For per-example scalars (what
    `pj.vmap` returns over a padded batch), the mean over real examples."""
    return jax.tree.map(lambda x: jnp.mean(x, where=self._mask_like(x)), self.data)

  def __repr__(self) -> str:
    leaf = jax.tree.leaves(self.data)[0]
    parts = [f"padded shape {tuple(leaf.shape)}", str(leaf.dtype)]
    if all(_is_concrete(x) for x in (self.lengths, self._count)):
      if self.ragged_axes:
        parts.insert(0, f"lengths {np.asarray(self.lengths)[:len(self)].tolist()}")
      parts.insert(0, f"{len(self)} examples")
    return "Ragged(" + ", ".join(parts) + ")"


def _validate(r: Ragged) -> None:
  """Checks a Ragged built from parts: static shapes always, values when known."""
  leaves = jax.tree.leaves(r.data)
  batch, k = r.lengths.shape[0], r.ragged_axes
  if not leaves:
    raise TypeError("Ragged data must hold at least one array.")
  padded: tuple[int, ...] | None = None
  for path, x in jax.tree_util.tree_flatten_with_path(r.data)[0]:
    where = "Ragged data" + jax.tree_util.keystr(path)
    shape = tuple(np.shape(x))
    if len(shape) < 1 + k or shape[0] != batch:
      raise ShapeError(
          f"{where} has shape {shape}, but the lengths describe {batch} examples "
          f"with {k} ragged axes: it needs shape ({batch}, <{k} padded sizes>, ...).")
    if padded is None:
      padded = shape[1:1 + k]
    if shape[1:1 + k] != padded:
      raise ShapeError(
          f"{where} has padded sizes {shape[1:1 + k]} on its ragged axes, but an "
          f"earlier data leaf has {padded}: leaves sharing lengths need equal padding.")
  assert padded is not None  # (there is a leaf)
  real = batch
  if r._count is not None and _is_concrete(r._count):
    real = int(np.asarray(r._count))
    if not 1 <= real <= batch:
      raise ShapeError(f"num_examples={real} must be between 1 and the batch size {batch}.")
  if _is_concrete(r.lengths):
    lengths = np.asarray(r.lengths).reshape(batch, k)[:real]
    for j, size in enumerate(padded):
      bad = np.flatnonzero((lengths[:, j] < 1) | (lengths[:, j] > size))
      if bad.size:
        i = int(bad[0])
        empty = (" (an empty example: polyjit runs each example with logical sizes "
                 ">= 1; leave empty examples out)" if lengths[i, j] < 1 else "")
        raise ShapeError(
            f"example {i} has length {int(lengths[i, j])} on ragged axis {j}, which "
            f"must be between 1 and its padded size {size}{empty}.")


def _host_examples(examples: Sequence[Any], k: int
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


def _host_pad(arrays: list[np.ndarray], padded: tuple[int, ...], batch: int) -> np.ndarray:
  k = len(padded)
  dtype = jax.dtypes.canonicalize_dtype(np.result_type(*{a.dtype for a in arrays}))
  out = np.zeros((batch, *padded, *arrays[0].shape[k:]), dtype)
  for i, x in enumerate(arrays):
    index: tuple[int | slice, ...] = (i, *(slice(0, s) for s in x.shape[:k]))
    out[index] = x
  return out


# --- pj.vmap -----------------------------------------------------------------

def _hashable(tree: Any) -> tuple[tuple[Any, ...], Any]:
  leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: x is None)
  return tuple(leaves), treedef


def _unhashable(key: tuple[tuple[Any, ...], Any]) -> Any:
  leaves, treedef = key
  return treedef.unflatten(leaves)


class RaggedVmapped:
  """The result of `pj.vmap`: call it like the `jax.vmap`ped function."""

  def __init__(self, fun: Callable[..., Any], in_axes: InAxes, out_axes: OutAxes) -> None:
    self.fun = fun
    # A list is not a prefix of the positional-argument tuple: as in jax.vmap.
    self.in_axes = tuple(in_axes) if isinstance(in_axes, list) else in_axes
    self.out_axes = out_axes
    self._masked: dict[Any, Masked] = {}
    self._plans: dict[Any, _Plan] = {}
    functools.update_wrapper(self, fun, updated=())

    def run(*args: Any) -> Any:
      return self._run(*args)

    # Compile events and profiles then name the user's function.
    run.__name__ = run.__qualname__ = f"vmap_{getattr(fun, '__name__', 'fun')}"
    self._jitted = jax.jit(run)

  def __repr__(self) -> str:
    return f"pj.vmap({getattr(self.fun, '__name__', self.fun)!r})"

  def __call__(self, *args: Any) -> Any:
    leaves = jax.tree.leaves(args, is_leaf=_is_ragged)
    raggeds = [x for x in leaves if _is_ragged(x)]
    if not raggeds:
      return jax.vmap(self.fun, self.in_axes, self.out_axes)(*args)
    _check_counts(raggeds)
    if _may_share(raggeds) and all(_is_concrete(r.lengths) for r in raggeds):
      # Concrete lengths: a mismatch is a pj.ShapeError here, before running.
      treedef, leaves, paths, axes = self._flatten(args)
      _batch(leaves, axes, paths)
      plan = self._plan(treedef, leaves, axes, paths)
      if plan.shares:
        plan.check_on_host(_host_lengths([x for x in leaves if _is_ragged(x)]))
    return self._jitted(*args)

  def _flatten(self, args: tuple[Any, ...]) -> tuple[Any, list[Any], list[str], list[Any]]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(args, is_leaf=_is_ragged)
    paths, leaves = [_describe(p) for p, _ in flat], [x for _, x in flat]
    return treedef, leaves, paths, _leaf_axes(self.in_axes, args, len(leaves))

  def _run(self, *args: Any) -> Any:
    treedef, leaves, paths, axes = self._flatten(args)
    batch, count = _batch(leaves, axes, paths)
    keep = None if count is None else jnp.arange(batch) < count
    plan = self._plan(treedef, leaves, axes, paths)
    masked, names = plan.masked, plan.names

    datas: list[Any] = []
    lengths: list[Any] = []
    plains: list[Any] = []
    plain_axes: list[Any] = []
    for x, axis in zip(leaves, axes):
      if _is_ragged(x):
        data = _first_for_padded(x.data, 0, keep)
        datas.append(_pad_ragged_axes(data, plan.padded[len(lengths)]))
        lengths.append(_first_for_padded(x.lengths, 0, keep))
      else:
        plains.append(_first_for_padded(x, axis, keep))
        plain_axes.append(axis)
    # Arguments that share size variables: their lengths, checked equal in the
    # program (a mismatch is never silent), are the group's first member's.
    lengths = plan.check_in_program(lengths)
    sizes = [_columns(l, r.ragged_axes)
             for l, r in zip(lengths, [x for x in leaves if _is_ragged(x)])]
    kinds = [_is_ragged(x) for x in leaves]

    def per_example(datas: list[Any], sizes: list[list[Any]], plains: list[Any]
                    ) -> tuple[Any, list[list[Any]]]:
      sources = (iter(datas), iter(plains))
      example = treedef.unflatten([next(sources[0] if r else sources[1]) for r in kinds])
      env = {name: s for ns, ss in zip(names, sizes) for name, s in zip(ns, ss)}
      outs, computed = masked.call_with_sizes(list(example), env)
      env = env if computed is None else computed   # with data-dependent sizes
      traced = masked.trace(list(example))
      out_paths = [_describe(p) for p, _ in jax.tree_util.tree_flatten_with_path(outs)[0]]
      return outs, [_out_lengths(a, env, p) for a, p in zip(traced.out_avals, out_paths)]

    mapped = jax.vmap(per_example, in_axes=(0, 0, plain_axes), out_axes=(self.out_axes, 0))
    try:
      # A batch on an Explicit mesh runs with its axes Auto (`_sharding.py`).
      outs, out_lengths = _sharding.on_auto_axes(mapped, (datas, sizes, plains))
    except (MaskingError, ShapeError) as e:
      if plan.note:
        e.add_note(plan.note)
      raise
    return self._assemble(outs, out_lengths, count, keep)

  def _masked_for(self, treedef: Any, ks: tuple[int | None, ...], groups: Groups,
                  constraints: tuple[str, ...] = ()) -> tuple[Masked, list[list[str]]]:
    """`pj.mask(fun)` for this argument structure and sharing (cached), and
    the dim names of each Ragged argument: `n{i}_{j}`, i the first member of
    its group."""
    head = {o: g[0] for g in groups for o in g}
    numbers = np.cumsum([k is not None for k in ks]) - 1
    names = [[f"n{head[i]}_{j}" for j in range(k)]
             for i, k in zip(numbers, ks) if k is not None]
    key = (treedef, ks, groups, constraints)
    masked = self._masked.get(key)
    if masked is None:
      it = iter(names)
      specs = [_spec(next(it)) if k is not None else None for k in ks]
      masked = Masked(self.fun, list(treedef.unflatten(specs)), constraints=constraints)
      if not constraints:  # the probes' are used once
        self._masked[key] = masked
    return masked, names

  def _plan(self, treedef: Any, leaves: list[Any], axes: list[Any],
            paths: list[str]) -> "_Plan":
    """Which Ragged arguments share their size variables (cached per argument
    structure, shapes and dtypes): none, unless `fun` needs their lengths
    equal (the module docstring says how that is found)."""
    ks = tuple(x.ragged_axes if _is_ragged(x) else None for x in leaves)
    raggeds = [x for x in leaves if _is_ragged(x)]
    key = (treedef, ks, tuple(_aval_key(x, a) for x, a in zip(leaves, axes)))
    plan = self._plans.get(key)
    if plan is not None:
      return plan
    groups: Groups = tuple((o,) for o in range(len(raggeds)))
    separate = groups
    first_error: BaseException | None = None
    probe = functools.partial(self._probe, treedef, leaves, axes)
    while _may_share(raggeds):
      error = probe(groups)
      if error is None:
        break
      first_error = first_error or error
      pair = next((pair for pair in _suspects(error, groups, raggeds)
                   if _needs_equal(probe, groups, *pair, raggeds)), None)
      if pair is None:  # sharing is not the fix: separate, and the call raises
        groups = separate
        break
      groups = tuple(sorted([g for g in groups if g not in pair]
                            + [tuple(sorted(pair[0] + pair[1]))]))
    plan = _Plan(self, treedef, ks, groups, list(zip(raggeds, [
        p for x, p in zip(leaves, paths) if _is_ragged(x)])), first_error)
    self._plans[key] = plan
    return plan

  def _probe(self, treedef: Any, leaves: list[Any], axes: list[Any], groups: Groups,
             constraints: Sequence[str] = (),
             padded: list[tuple[int, ...]] | None = None) -> BaseException | None:
    """Traces `fun` with these groups, constraints and padded sizes (no
    program is built): its error, or None."""
    ks = tuple(x.ragged_axes if _is_ragged(x) else None for x in leaves)
    masked, _ = self._masked_for(treedef, ks, groups, tuple(constraints))
    padded = padded or _group_padded(groups, [x for x in leaves if _is_ragged(x)])
    it = iter(padded)
    example = [_example_struct(x, a, next(it) if _is_ragged(x) else None)
               for x, a in zip(leaves, axes)]
    box: list[BaseException] = []

    def probe(example: Any) -> tuple[()]:
      try:
        masked.trace(list(treedef.unflatten(example)))
      except Exception as e:  # noqa: BLE001  (the real call raises it again)
        box.append(e)
      return ()

    jax.eval_shape(probe, example)
    return box[0] if box else None

  def _assemble(self, outs: Any, out_lengths: list[list[Any]], count: Any,
                keep: jax.Array | None) -> Any:
    tree: Any  # (a PyTreeDef, which jaxlib ships no type stub for)
    leaves, tree = jax.tree.flatten(outs)
    axes = _broadcast(self.out_axes, outs, len(leaves), "out_axes")
    result: list[Any] = []
    for x, lengths, axis in zip(leaves, out_lengths, axes):
      if not lengths and keep is None:
        result.append(x)
        continue
      if axis != 0:
        raise TypeError(
            f"pj.vmap returns this output as a pj.Ragged (it {_why(lengths)}), whose "
            f"examples are stacked on axis 0, but out_axes gives {axis}: use "
            "out_axes=0 for it.")
      column = [jnp.where(keep, s, 0) if keep is not None else s for s in lengths]
      stacked = (column[0] if len(column) == 1
                 else jnp.stack(column, axis=1) if column
                 else jnp.zeros((x.shape[0], 0), jnp.int32))
      result.append(Ragged._make(x, stacked, count, len(lengths)))
    return tree.unflatten(result)


# --- Ragged arguments that share their lengths ----------------------------------

_DIM_NAME = re.compile(r"\bn(\d+)_(\d+)\b")


def _may_share(raggeds: Sequence[Ragged]) -> bool:
  """Whether two of these Ragged arguments could share size variables."""
  ks = [r.ragged_axes for r in raggeds if r.ragged_axes]
  return len(ks) != len(set(ks))


def _aval_key(x: Any, axis: Any) -> tuple[Any, ...]:
  """What a trace of `fun` depends on in one flat argument (concrete or traced)."""
  def one(a: Any) -> tuple[tuple[int, ...], str, bool]:
    t = jc.typeof(a)
    return tuple(t.shape), str(t.dtype), bool(t.weak_type)
  if _is_ragged(x):
    return (x.ragged_axes, tuple(one(a) for a in jax.tree.leaves(x.data)),
            jax.tree.structure(x.data))
  return one(x), axis


def _example_struct(x: Any, axis: int | None, padded: Any) -> Any:
  """The abstract value of one example of a flat argument (for tracing)."""
  def struct(shape: Sequence[int], a: Any) -> jax.ShapeDtypeStruct:
    t = jc.typeof(a)
    # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
    return jax.ShapeDtypeStruct(tuple(shape), t.dtype, weak_type=t.weak_type)  # type: ignore[no-untyped-call, unused-ignore]
  if _is_ragged(x):
    k = x.ragged_axes
    return jax.tree.map(lambda a: struct((*padded, *np.shape(a)[1 + k:]), a), x.data)
  shape = list(np.shape(x))
  if axis is not None:
    del shape[axis]
  return struct(shape, x)


def _group_padded(groups: Groups, raggeds: Sequence[Ragged]) -> list[tuple[int, ...]]:
  """The padded sizes each Ragged argument runs at: a group's largest."""
  out: list[Any] = [None] * len(raggeds)
  for g in groups:
    padded = tuple(max(sizes) for sizes in zip(*[raggeds[o].padded_lengths for o in g]))
    for o in g:
      out[o] = padded
  return out


def _pad_ragged_axes(data: Any, padded: tuple[int, ...]) -> Any:
  """`data` with its ragged axes padded (with zeros) up to `padded`."""
  def pad(x: Any) -> Any:
    have = x.shape[1:1 + len(padded)]
    if tuple(have) == tuple(padded):
      return x
    widths = [(0, 0), *[(0, p - h) for p, h in zip(padded, have)],
              *[(0, 0)] * (x.ndim - 1 - len(padded))]
    return jnp.pad(x, widths)
  return jax.tree.map(pad, data)


def _columns(lengths: Any, k: int) -> list[Any]:
  return [lengths] if k == 1 else [lengths[:, j] for j in range(k)]


def _host_lengths(raggeds: Sequence[Ragged]) -> list[np.ndarray]:
  """Concrete lengths on the host, padded-out rows replaced by row 0's (as
  the program does)."""
  out = [np.array(r.lengths) for r in raggeds]
  count = next((int(np.asarray(r._count)) for r in raggeds if r.batch_padded), None)
  if count is not None:
    for lengths in out:
      lengths[count:] = lengths[0]
  return out


def _error_chain(error: BaseException) -> list[BaseException]:
  chain: list[BaseException] = []
  seen: set[int] = set()
  current: BaseException | None = error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    chain.append(current)
    current = current.__cause__ or current.__context__
  return chain


def _error_texts(error: BaseException) -> list[str]:
  return [t for e in _error_chain(error)
          for t in [str(e), *getattr(e, "__notes__", ())]]


def _suspects(error: BaseException, groups: Groups, raggeds: Sequence[Ragged]
              ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """Pairs of groups of Ragged arguments (as many ragged axes) whose sizes
  `error`, from tracing `fun` with `groups`, names (`mul got incompatible
  shapes: (n0_0, 3), (n1_0, 1)`, or a note 'n0_0 != n1_0'). An error that
  names fewer than two, with just two such groups: that pair."""
  head = {g[0]: g for g in groups}
  named = sorted({int(m.group(1)) for t in _error_texts(error)
                  for m in _DIM_NAME.finditer(t)})
  hit = [head[i] for i in named if i in head]
  if len(hit) < 2:
    hit = [g for g in groups if raggeds[g[0]].ragged_axes]
    if len(hit) != 2:
      return []
  def k(g: Any) -> Any:
    return raggeds[g[0]].ragged_axes

  return [(a, b) for i, a in enumerate(hit) for b in hit[i + 1:] if k(a) == k(b) and k(a)]


def _needs_equal(probe: Callable[..., BaseException | None], groups: Groups,
                 a: tuple[int, ...], b: tuple[int, ...], raggeds: Sequence[Ragged]) -> bool:
  """Whether `fun` fails when either of groups `a`, `b` is the longer (on
  every ragged axis), so that it needs their lengths equal. A function that
  needs only an order (`k[:q.shape[0]]`: keys at least as long as queries)
  passes one of the two, and its arguments stay separate: equal lengths
  would demand more than it does."""
  padded = _group_padded(groups, raggeds)
  top = tuple(max(x, y) for x, y in zip(padded[a[0]], padded[b[0]]))
  for short, long in ((a, b), (b, a)):
    sizes = list(padded)
    for o in short:
      sizes[o] = top
    for o in long:
      sizes[o] = tuple(p + 1 for p in top)
    constraints = [f"n{long[0]}_{j} >= n{short[0]}_{j} + 1" for j in range(len(top))]
    if probe(groups, constraints, sizes) is None:
      return False
  return True


def _names(i: int, shared: list[str]) -> str:
  """The dim names Ragged argument number `i` has when it shares nothing."""
  return ", ".join(f"n{i}_{j}" for j in range(len(shared)))


def _root_cause(error: BaseException) -> str:
  root = _error_chain(error)[-1]
  text = f"{type(root).__name__}: {root}".strip().splitlines()[0]
  where = jc.user_line_of(root)
  return text + (f" (at {where})" if where else "")


class _Plan:
  """How one argument structure runs: the masked function, each Ragged
  argument's dim names and padded sizes, and the groups that share them."""

  def __init__(self, vmapped: RaggedVmapped, treedef: Any, ks: tuple[int | None, ...],
               groups: Groups, raggeds: list[tuple[Ragged, str]],
               error: BaseException | None) -> None:
    self.groups = groups
    self.masked, self.names = vmapped._masked_for(treedef, ks, groups)
    self.padded = _group_padded(groups, [x for x, _ in raggeds])
    self.paths = [p for _, p in raggeds]
    self.shared = [g for g in groups if len(g) > 1]
    self.shares = bool(self.shared)
    self.fun_name = getattr(vmapped.fun, "__name__", None) or repr(vmapped.fun)
    # (sharing only ever follows an error)
    self.reason = _root_cause(error) if self.shares and error is not None else None
    named = [f"{n} is {p} axis {j}" for ns, p in zip(self.names, self.paths)
             for j, n in enumerate(ns)]
    self.note = (f"(pj.vmap names the lengths of the pj.Ragged arguments: "
                 f"{'; '.join(named)}.)" if named else None)

  def mismatch(self, lengths: Sequence[np.ndarray]) -> ShapeError | None:
    """The error for the first example whose shared lengths differ, or None."""
    for g in self.shared:
      a = np.asarray(lengths[g[0]])
      for o in g[1:]:
        b = np.asarray(lengths[o])
        bad = np.flatnonzero(np.any((a != b).reshape(len(a), -1), axis=1))
        if bad.size:
          return self._error(g[0], o, int(bad[0]), a[bad[0]], b[bad[0]])
    return None

  def _error(self, i: int, o: int, row: int, la: Any, lb: Any) -> ShapeError:
    pa, pb = self.paths[i], self.paths[o]
    def show(l: Any) -> str:
      return (f"length {int(l)}" if np.ndim(l) == 0
              else f"lengths {tuple(int(v) for v in l)}")

    return ShapeError(
        f"pj.vmap({self.fun_name}): {pa} and {pb} are pj.Ragged arguments that "
        f"{self.fun_name} needs with equal lengths, example by example, but example "
        f"{row} has {show(la)} in {pa} and {show(lb)} in {pb}.\n"
        f"Why equal: traced with separate lengths ({_names(i, self.names[i])} for {pa}, "
        f"{_names(o, self.names[o])} for {pb}), {self.fun_name} fails: {self.reason}\n"
        "What to do: if both hold data of the same examples (tokens and per-token "
        "targets), make them one pj.Ragged, whose leaves share their lengths: "
        "pj.Ragged.from_list([(tok, tgt), ...]) (or a dict per example); otherwise "
        f"give every example equal lengths in both, or write {self.fun_name} for "
        "different ones.")

  def check_on_host(self, lengths: Sequence[Any]) -> None:
    error = self.mismatch(lengths)
    if error is not None:
      raise error

  def check_in_program(self, lengths: list[Any]) -> list[Any]:
    """The lengths, each shared group's replaced by its first member's after
    a check that they are equal: `lax.cond` on the comparison, whose taken
    side calls back to the host to raise the pj.ShapeError, so equal lengths
    cost one comparison and no callback."""
    if not self.shares:
      return lengths
    heads = [lengths[g[0]] for g in self.shared]
    differ = jnp.any(jnp.stack([jnp.any(lengths[o] != lengths[g[0]])
                                for g in self.shared for o in g[1:]]))

    def host(*values: Any) -> list[np.ndarray]:
      self.check_on_host(values)
      return [np.asarray(values[g[0]]) for g in self.shared]

    def fail(lengths: list[Any]) -> Any:
      # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
      shapes = [jax.ShapeDtypeStruct(h.shape, h.dtype) for h in heads]  # type: ignore[no-untyped-call, unused-ignore]
      return jax.pure_callback(host, shapes, *lengths, vmap_method="sequential")

    checked = lax.cond(differ, fail, lambda lengths: [lengths[g[0]] for g in self.shared],
                       lengths)
    out = list(lengths)
    for g, c in zip(self.shared, checked):
      for o in g:
        out[o] = c
    return out


def _why(lengths: Sequence[Any]) -> str:
  return ("depends on the example's length" if lengths
          else "is per example, and the batch is padded")


def _spec(names: list[str]) -> str | None:
  return "(" + ", ".join([*names, "..."]) + ")" if names else None


def _describe(path: tuple[Any, ...]) -> str:
  """'argument 1', 'argument 0 at ['x']' from a path into the args tuple."""
  if not path:
    return "the output"
  head, rest = path[0], path[1:]
  name = f"argument {head.idx}" if hasattr(head, "idx") else jax.tree_util.keystr((head,))
  return name + (f" at {jax.tree_util.keystr(rest)}" if rest else "")


def _broadcast(prefix: Any, tree: Any, n_leaves: int, what: str,
               is_leaf: Callable[[Any], bool] = _is_ragged,
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


def _leaf_axes(in_axes: Any, args: tuple[Any, ...], n_leaves: int,
               is_leaf: Callable[[Any], bool] = _is_ragged,
               batch: str = "a pj.Ragged") -> list[Any]:
  """`in_axes` per flat argument (one entry per positional argument, or one for all)."""
  if not isinstance(in_axes, tuple):
    in_axes = (in_axes,) * len(args)
  elif len(in_axes) != len(args):
    raise ValueError(
        f"pj.vmap in_axes has {len(in_axes)} entries but the function was called "
        f"with {len(args)} positional arguments; give one entry per argument.")
  return _broadcast(in_axes, args, n_leaves, "in_axes", is_leaf, batch)


def _batch(leaves: list[Any], axes: list[Any], paths: list[str]) -> tuple[int, Any]:
  """The padded batch size and the number of examples (None: not padded)."""
  raggeds = [(x, a, p) for x, a, p in zip(leaves, axes, paths) if _is_ragged(x)]
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
  count = next((x._count for x, _, _ in raggeds if x.batch_padded), None)
  for x, axis, path in zip(leaves, axes, paths):
    if _is_ragged(x) or axis is None:
      continue
    size = np.shape(x)[axis]
    if size != batch:
      hint = (" Pad it like the batch: pj.Ragged.from_list(values, ragged_axes=0, "
              "batch_buckets=...) with the same batch_buckets." if count is not None else "")
      raise ShapeError(
          f"{path} has {size} entries on its mapped axis {axis}, but the pj.Ragged "
          f"arguments hold {batch} rows.{hint}")
  return batch, count


def _check_counts(raggeds: list[Ragged]) -> None:
  counts = {len(r) for r in raggeds if r.batch_padded and _is_concrete(r._count)}
  if len(counts) > 1:
    raise ShapeError(
        f"the batch-padded pj.Ragged arguments disagree on the number of examples "
        f"({sorted(counts)}): pad every argument of one batch from the same examples.")


def _first_for_padded(x: Any, axis: int | None, keep: jax.Array | None) -> Any:
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


def _out_lengths(aval: Any, env: dict[str, Any], where: str) -> list[Any]:
  """Per example: the logical size of each leading dynamic axis of an output."""
  shape = aval.shape
  lead = next((a for a, d in enumerate(shape) if not jc.is_symbolic_dim(d)), len(shape))
  later = [a for a in range(lead, len(shape)) if jc.is_symbolic_dim(shape[a])]
  if later:
    raise ShapeError(
        f"{where} of the function has shape {aval.str_short()}: its axis {later[0]} "
        "depends on the example's length but follows a fixed axis. pj.vmap returns "
        "such outputs as a pj.Ragged, whose varying axes come first: move them to "
        f"the front inside the function (e.g. jnp.moveaxis(y, {later[0]}, 0)).")
  return [_dims.evaluate_dim(d, env) for d in shape[:lead]]


def vmap(fun: Callable[..., Any], in_axes: InAxes = 0, out_axes: OutAxes = 0) -> RaggedVmapped:
  """`jax.vmap` that also maps over `pj.Ragged` arguments, example by example.

  Args:
    fun: a function written for one unpadded example.
    in_axes: as in `jax.vmap` (an int, None, or a tuple with one pytree prefix
      per positional argument). A `pj.Ragged` argument is mapped over its
      examples (its entry must be 0), each with its own logical lengths;
      other arguments are mapped or shared (None, e.g. model parameters) as
      `jax.vmap` does.
    out_axes: as in `jax.vmap`; must be 0 for outputs that come back as
      `pj.Ragged`.

  Returns:
    A function of the same arguments. An output whose shape depends on an
    example's length comes back as a `pj.Ragged` (lengths per example); one
    that does not is stacked into an ordinary array, unless the batch itself
    is padded (`Ragged.from_list(..., batch_buckets=...)`): then it is a
    `pj.Ragged` with no ragged axes, so that `.mean()` and `.sum()` count real
    examples only. `pj.vmap(loss)(params, batch).mean()` is the mean loss in
    both cases. Results and gradients equal those of `fun` on each unpadded
    example. Without `pj.Ragged` arguments this is `jax.vmap`.

  Ragged arguments that `fun` needs with equal lengths (tokens and targets
  from two `Ragged.from_list` calls) share their sizes, and a call whose
  lengths differ raises a `pj.ShapeError` naming both arguments and the
  first differing example; arguments `fun` accepts with different lengths
  (queries and keys) keep their own (module docstring).

  The returned function is cached per (fun, in_axes, out_axes), and each call
  is one `jax.jit` of the masked function, so batches in the same buckets
  reuse one compiled program.
  """
  return shared_vmap(RaggedVmapped, fun, in_axes, out_axes)


_V = TypeVar("_V", bound="RaggedVmapped")


def shared_vmap(cls: type[_V], fun: Callable[..., Any], in_axes: InAxes,
                out_axes: OutAxes) -> _V:
  """`cls(fun, in_axes, out_axes)`, the same instance for the same arguments."""
  if not callable(fun):
    raise TypeError(f"pj.vmap expects a callable, got {type(fun).__name__}")
  ins, outs = _hashable(in_axes), _hashable(out_axes)
  try:
    hash((fun, ins, outs))
  except TypeError:  # an unhashable function: no reuse across pj.vmap calls
    return cls(fun, in_axes, out_axes)
  instance = _cached_vmap(cast(Hashable, cls), fun, ins, outs)  # (mypy: a class hashes)
  assert isinstance(instance, cls)  # (made by `cls` itself)
  return instance


# Calling pj.vmap(f) again for the same f (in an eager loop) must not retrace
# and recompile: instances are shared. Bounded, like JAX's own trace caches,
# because each holds its function and compiled programs.
@functools.lru_cache(maxsize=128)
def _cached_vmap(cls: Any, fun: Callable[..., Any], in_axes: Any,  # cls: a RaggedVmapped class
                 out_axes: Any) -> RaggedVmapped:
  instance: RaggedVmapped = cls(fun, _unhashable(in_axes), _unhashable(out_axes))
  return instance
