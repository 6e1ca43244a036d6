"""`pj.Ragged`: a batch of examples whose leading axes differ in size.

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

`pj.vmap` (`vmap.py`) maps a function over the examples of `Ragged`
arguments, each example at its own logical size; `groups.py` keeps a batch in
several blocks by length (`GroupedRagged`). This module is the container
alone: the pytree, its construction from padded parts (validated here) and
from examples on the host (`host.py` validates and pads them), its masks and
its reductions over valid entries.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Literal, Protocol, Sequence, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Sharding
from jax.typing import ArrayLike

from .. import _jax as jc
from .._buckets import fixed as _buckets
from .._masking.errors import ShapeError
from .._masking.padding import is_key_dtype
from .._sharding import placement as _sharding
from .host import HostExamples
from .packing import Packing, PackedRagged, pack

_Grouped_co = TypeVar("_Grouped_co", covariant=True)


class LengthGrouping(Protocol[_Grouped_co]):
  """What `Ragged.from_list(groups=...)` asks of a `pj.LengthGroups`.

  `groups.py` builds grouped batches out of `Ragged` blocks, so it imports
  this module; naming `LengthGroups` here would make the two import each
  other. This protocol keeps the dependency one way while `from_list`'s type
  still says that it returns what `groups.from_list` returns (a
  `GroupedRagged`)."""

  def from_list(self, examples: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None) -> _Grouped_co: ...


_G = TypeVar("_G")


def is_ragged(x: object) -> bool:
  return isinstance(x, Ragged)


def is_concrete(x: object) -> bool:
  """Whether `x` holds values (not a tracer inside a JAX transformation)."""
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
    nonempty: whether every example is known, when the batch was built, to
      have sizes >= 1 (`from_list` without empty examples, or concrete
      lengths). Static (pytree metadata): `pj.vmap` then runs the masked
      function without the paths of empty examples (`_masking/empty.py`), so
      a shared parameter keeps one cotangent for the whole batch.
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
    self._set(data, lengths, num_examples, k, _known_nonempty(lengths, num_examples))
    _validate(self)

  def _set(self, data: Any, lengths: Any, count: Any, k: int, nonempty: bool = False) -> None:
    self.data = data
    self.lengths = lengths
    self._count = count
    self.ragged_axes = k
    self.nonempty = nonempty

  @classmethod
  def _make(cls, data: Any, lengths: Any, count: Any, k: int,
            nonempty: bool = False) -> "Ragged":
    """Builds without validation (traced parts, pytree unflattening)."""
    r = object.__new__(cls)
    r._set(data, lengths, count, k, nonempty)
    return r

  # --- pytree ----------------------------------------------------------------

  def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Any], ...], tuple[int, bool]]:
    key = jax.tree_util.GetAttrKey
    children = ((key("data"), self.data), (key("lengths"), self.lengths),
                (key("num_examples"), self._count))
    return children, (self.ragged_axes, self.nonempty)

  @classmethod
  def tree_unflatten(cls, aux: tuple[int, bool], children: Sequence[Any]) -> "Ragged":
    data, lengths, count = children
    return cls._make(data, lengths, count, *aux)

  # --- construction on the host ----------------------------------------------

  @overload
  @classmethod
  def from_list(cls, arrays: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None, batch_buckets: _buckets.BucketSpec = None,
                sharding: Sharding | None = None, groups: None = None,
                packing: None = None) -> "Ragged": ...

  @overload
  @classmethod
  def from_list(cls, arrays: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None, batch_buckets: Literal[None] = None,
                sharding: Literal[None] = None, groups: None = None,
                packing: Packing) -> PackedRagged: ...

  @overload
  @classmethod
  def from_list(cls, arrays: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None, batch_buckets: Literal[None] = None,
                sharding: Literal[None] = None, groups: LengthGrouping[_G],
                packing: None = None) -> _G: ...

  @classmethod
  def from_list(cls, arrays: Sequence[Any], *, ragged_axes: int = 1,
                buckets: _buckets.BucketSpec = None, batch_buckets: _buckets.BucketSpec = None,
                sharding: Sharding | None = None,
                groups: LengthGrouping[Any] | None = None,
                packing: Packing | None = None) -> Any:
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
        `GroupedRagged` comes back (`groups.py`): for functions whose
        cost grows faster than the length (attention). One ragged axis, no
        `batch_buckets` or `sharding`.

      packing: None, or a `pj.Packing`: the examples are stored several per
        row (first-fit decreasing) and a `PackedRagged` comes back
        (`packing.py`): `pj.vmap` runs a function written for one example
        over it exactly as over the padded batch. One ragged axis, no
        `batch_buckets`, `sharding` or `groups`.

    Padding is done with NumPy and the result is transferred with
    `jax.device_put`: no device program is compiled for any shape.
    """
    if packing is not None:
      if groups is not None or batch_buckets is not None or sharding is not None:
        raise TypeError("Ragged.from_list(packing=...) takes no groups, batch_buckets or "
                        "sharding: a packed batch is its own layout, on one device.")
      if not isinstance(packing, Packing):
        raise TypeError(f"Ragged.from_list(packing=...) takes a pj.Packing, got {packing!r}.")
      return pack(HostExamples(arrays, ragged_axes, "Ragged.from_list needs at least one "
                               "example."), packing, buckets)
    if groups is not None:
      if batch_buckets is not None or sharding is not None:
        raise TypeError("Ragged.from_list(groups=...) takes neither batch_buckets nor "
                        "sharding: a grouped batch has no padded rows and one device.")
      return groups.from_list(arrays, ragged_axes=ragged_axes, buckets=buckets)
    host = HostExamples(arrays, ragged_axes, "Ragged.from_list needs at least one example.")
    n = len(host)
    batch = n if batch_buckets is None else _buckets.as_policy(batch_buckets)(n)
    if sharding is not None:
      sharding = _sharding.batch_sharding(sharding)
      if batch_buckets is not None:
        batch = _sharding.round_up(batch, _sharding.batch_multiple(sharding))
      _sharding.check_batch(batch, sharding, "Ragged.from_list")
    count = None if batch_buckets is None else _sharding.put_replicated(np.int32(n), sharding)
    policy = _buckets.as_policy(buckets)
    return from_host(host, [policy(m) for m in host.longest()], batch,
                     functools.partial(_sharding.put_batch, sharding=sharding), count)

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
    host = HostExamples(local_examples, ragged_axes,
                        "Ragged.from_process_local needs at least one example per process.")
    sharding = _sharding.batch_sharding(sharding)
    n = len(host)
    global_max, batch = _sharding.agree_on_batch(host.longest(), n)
    _sharding.check_batch(batch, sharding, "Ragged.from_process_local")
    policy = _buckets.as_policy(buckets)
    return from_host(host, [policy(m) for m in global_max], n,
                     functools.partial(_sharding.put_process_local, sharding=sharding,
                                       global_batch=batch))

  def to_list(self) -> list[Any]:
    """The examples, unpadded, as NumPy arrays (or pytrees of them)."""
    leaves, tree = jax.tree.flatten(self.data)
    if not all(is_concrete(x) for x in [*leaves, self.lengths, self._count]):
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

  @property
  def efficiency(self) -> Any:
    """Real elements over stored elements along the ragged axes, over every
    stored row (a float; a scalar inside `jax.jit`)."""
    stored = self.batch_size * math.prod(self.padded_lengths)
    real_rows = self.example_mask if self._count is not None else None
    if not all(is_concrete(x) for x in (self.lengths, self._count)):
      traced = jnp.prod(jnp.reshape(self.lengths, (self.batch_size, -1)), axis=1)
      if real_rows is not None:
        traced = jnp.where(real_rows, traced, 0)
      return jnp.sum(traced) / stored
    sizes = np.prod(np.asarray(self.lengths).reshape(self.batch_size, -1), axis=1)
    return float(sizes[:len(self)].sum()) / stored if stored else 1.0

  def __len__(self) -> int:
    if self._count is None:
      return self.batch_size
    if not is_concrete(self._count):
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
    if all(is_concrete(x) for x in (self.lengths, self._count)):
      if self.ragged_axes:
        parts.insert(0, f"lengths {np.asarray(self.lengths)[:len(self)].tolist()}")
      parts.insert(0, f"{len(self)} examples")
    return "Ragged(" + ", ".join(parts) + ")"


def from_host(host: HostExamples, padded: Sequence[int], rows: int,
              put: Callable[[np.ndarray], Any], count: Any = None,
              indices: Sequence[int] | np.ndarray | None = None) -> Ragged:
  """A `Ragged` of checked examples (those at `indices`, default all) padded
  to `padded` in `rows` rows, each array placed on the device(s) by `put`:
  the one way from examples on the host to a batch (no device program runs)."""
  data, lengths = host.pad(padded, rows, indices)
  picked = host.sizes if indices is None else host.sizes[np.asarray(indices, np.int64)]
  # (rows past the examples hold length 0: they never count, and are poisoned)
  nonempty = bool(picked.size == 0 or picked.min() >= 1)
  return Ragged._make(host.unflatten([put(d) for d in data]), put(lengths), count,
                      host.ragged_axes, nonempty)


def _known_nonempty(lengths: Any, count: Any) -> bool:
  """Whether concrete `lengths` (of the first `count` rows) are all >= 1."""
  if not is_concrete(lengths) or (count is not None and not is_concrete(count)):
    return False
  values = np.asarray(lengths)
  if count is not None:
    values = values[:int(np.asarray(count))]
  return bool(values.size == 0 or values.min() >= 1)


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
  if r._count is not None and is_concrete(r._count):
    real = int(np.asarray(r._count))
    if not 1 <= real <= batch:
      raise ShapeError(f"num_examples={real} must be between 1 and the batch size {batch}.")
  if is_concrete(r.lengths):
    lengths = np.asarray(r.lengths).reshape(batch, k)[:real]
    for j, size in enumerate(padded):
      bad = np.flatnonzero((lengths[:, j] < 0) | (lengths[:, j] > size))
      if bad.size:
        i = int(bad[0])
        raise ShapeError(
            f"example {i} has length {int(lengths[i, j])} on ragged axis {j}, which "
            f"must be between 0 and its padded size {size}.")

