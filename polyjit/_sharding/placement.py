"""Where `pj.jit`'s arguments live: one device, or shards that stay on their mesh.

Design
------
There is one path for compiling, padding and unpadding, whatever the
placement: a structure's per-leaf shardings (`ShardingLayout.leaf_shardings`),
where None for a leaf means "not on a mesh" and None for the whole structure
means one device. `lower`, `run` and `unpad` take that placement;
with one device they reduce to compiling for unplaced arguments, padding on
the host and slicing on the host (the call path's hot path, `Plan.run_plain`,
only ever serves one device and never comes here).

polyjit runs on JAX's own SPMD machinery: meshes, `NamedSharding`,
`jax.make_array_from_callback` and, across processes, `jax.distributed`. The
masked program is an ordinary `jax.jit` program, so once its arguments carry
shardings, XLA partitions it exactly as it partitions `jax.jit(f)`. What
polyjit adds is only what padding changes:

* **Which sharding an argument has.** `in_shardings` (as in `jax.jit`: one
  `Sharding` for every positional argument, or one pytree prefix per
  positional argument, None for "the argument's own") wins; otherwise a
  `jax.Array` (or `pj.Padded`) placed on more than one device keeps its own
  sharding. A call whose leaves are all on one device (and no `in_shardings`
  / `out_shardings`) has no shardings at all (None): the one-device case.
  The per-leaf shardings are part of the structure key, so each placement gets
  its own programs.
* **Buckets on a sharded axis.** A dynamic dimension that is a sharded axis
  of some argument gets buckets rounded up to a multiple of the number of
  shards along it (`dim_multiples`), so every padded size splits evenly; the
  logical size stays the global one, and the padding lands in the last
  shards (the data stays at `[0, logical)` as the masking invariant wants).
  Where a size cannot split evenly anyway (an exact-shape program, or an axis
  that is an expression such as `2*n`), that axis is left unsharded for that
  program (`fit`), as `jax.jit` could not shard it either.
* **Padding shard by shard.** The padded argument is built with
  `jax.make_array_from_callback`: each addressable device's shard is filled
  from the source shards that overlap it (or from the host array), zeros
  elsewhere. Nothing is gathered onto one device or one host; when the
  padded layout needs data that lives on another process (a dynamic axis
  sharded across processes whose shard boundaries move), a `pj.ShapeError`
  says so and what to do. Outputs are unpadded the same way, keeping their
  sharding (an axis whose logical size no longer splits evenly is left
  unsharded).
* **Explicit mesh axes.** `jax.make_mesh` gives `Explicit` axes by default,
  whose sharding-in-types tracing the masking rules' masks (`iota`, `select`
  of unsharded masks with sharded data) do not satisfy. The masked program is
  therefore compiled on the same devices with the mesh's axes `Auto`
  (`auto`), where XLA propagates shardings as it always did, and its outputs
  are relabelled with the user's mesh (`relabel`: the same buffers, no copy).
* **Programs are compiled for those shardings** (`jax.ShapeDtypeStruct(...,
  sharding=...)`, `out_shardings` as in `jax.jit`), so their outputs come back
  with the shardings XLA's propagation gives `jax.jit(f)`.

Several processes
-----------------
Every process of a multi-process program must run the same program on every
call. pj.jit's choice of program is a function of the call's *global* shapes,
dtypes, shardings and the sequence of earlier calls, all of which the SPMD
contract already requires to be the same on every process, and of nothing
timing-dependent: borrowing a larger bucket while a tight one compiles
(`background_compile`) is switched off when `jax.process_count() > 1`. As a
check, every new program is agreed on (`agree_on_program`): the processes
compare a digest of its padded shapes and bucket with
`multihost_utils.assert_equal` before compiling, so a divergence is an error,
never two different programs. Process-local data (each process's own
examples) must first become one global array: `pj.Ragged.from_process_local`
agrees on the padded sizes with one small collective over local maxima.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Sequence, overload

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from .._masking import dims as _dims
from .. import _jax as jc
from .._masking.errors import ShapeError
from .._masking.padding import Padded, logical_shape, pad
from .._masking.padding import unpad as unpad_on_host


class ShardingLayout:
  """`pj.jit`'s `in_shardings`/`out_shardings`, applied to each call's leaves."""

  def __init__(self, in_shardings: Any = None, out_shardings: Any = None) -> None:
    self.in_shardings = in_shardings
    self.out_shardings = out_shardings
    self._given: dict[Any, list[Any]] = {}   # treedef -> per-leaf shardings from in_shardings
    self._one_device: bool | None = None   # then no argument can be on a mesh

  def one_device(self) -> bool:
    """No shardings given and one device: no argument can be on a mesh."""
    if self.in_shardings is not None or self.out_shardings is not None:
      return False
    if self._one_device is None:  # asked once: the backend is up by the first call
      self._one_device = jax.device_count() == 1
    return self._one_device

  def leaf_shardings(self, leaves: Sequence[Any],
                     treedef: Any) -> tuple[Sharding | None, ...] | None:
    """Each leaf's sharding (None: not placed on a mesh), or None for a call
    that needs no sharding at all (the unchanged single-device path)."""
    if self.one_device():
      return None
    own = [_own_sharding(x) for x in leaves]
    if any(type(o) is SingleDeviceSharding for o in own):   # committed off the default
      own = _committed_where_they_are(leaves, own)
    if self.in_shardings is None:
      if self.out_shardings is None and not any(own):  # the common, fast case
        return None
      return tuple(own)
    given = self._given_for(treedef)
    return tuple(g if g is not None else o for g, o in zip(given, own, strict=True))

  def _given_for(self, treedef: Any) -> list[Any]:
    given = self._given.get(treedef)
    if given is None:
      given = self._given[treedef] = _broadcast_in_shardings(self.in_shardings, treedef)
    return given


_ARRAY, _PADDED, _STRUCT, _OTHER = 1, 2, 3, 0
_kinds: dict[type, int] = {}   # type -> kind, so the per-call check is a dict lookup


def _kind(t: type) -> int:
  kind = _kinds.get(t)
  if kind is None:
    array = issubclass(t, jax.Array) and not issubclass(t, jc.Tracer)
    kind = _kinds[t] = (_PADDED if issubclass(t, Padded) else _ARRAY if array
                        else _STRUCT if issubclass(t, jax.ShapeDtypeStruct) else _OTHER)
  return kind


def _own_sharding(x: Any) -> Sharding | None:
  """The sharding of an array (or `pj.Padded`'s data, or a
  `jax.ShapeDtypeStruct`'s: `precompile`'s examples) on several devices."""
  kind = _kind(type(x))
  if kind == _OTHER:
    return None
  if kind == _PADDED:
    return _own_sharding(x.data)
  if kind == _ARRAY and not x.committed:   # one device; `jax.jit` moves it to the default
    return None
  sharding: Sharding | None = x.sharding
  if kind == _STRUCT and not isinstance(sharding, Sharding):  # (none, or only a layout)
    return None
  assert sharding is not None
  if type(sharding) is SingleDeviceSharding or sharding.num_devices == 1:
    # on the default device: the one-device path. On another one (committed
    # there, `jax.device_put(x, jax.devices()[1])`), `jax.jit` runs there, and
    # so do the programs compiled for this placement (the structure key holds it)
    return None if _device_of(sharding) is jc.default_device() else sharding
  return sharding


_devices: dict[Sharding, Any] = {}   # a one-device sharding -> its device


def _device_of(sharding: Sharding) -> Any:
  device = _devices.get(sharding)
  if device is None:
    device = _devices[sharding] = next(iter(sharding.device_set))
  return device


def one_device(shardings: Sequence[Sharding | None] | None) -> SingleDeviceSharding | None:
  """The sharding of the one device that a structure's placed leaves are all
  on (`leaf_shardings`: committed to a device other than the default, or
  given one device's `in_shardings`), or None: the default device's path
  (no shardings), a mesh, or leaves on several devices."""
  if shardings is None:
    return None
  found: SingleDeviceSharding | None = None
  for s in shardings:
    if s is None:
      continue
    if type(s) is not SingleDeviceSharding or (
        found is not None and _device_of(s) is not _device_of(found)):
      return None
    found = s
  return found


def _committed_where_they_are(leaves: Sequence[Any],
                              own: list[Sharding | None]) -> list[Sharding | None]:
  """With a leaf committed to a device other than the default, every committed
  leaf keeps its own device (one committed to the default one too), so that
  leaves committed to different devices fail as `jax.jit` fails them
  ("incompatible devices"), not as a program compiled for the other device."""
  def placed(x: Any, o: Sharding | None) -> Sharding | None:
    data = x.data if _kind(type(x)) == _PADDED else x
    if o is None and _kind(type(data)) == _ARRAY and data.committed:
      sharding: Sharding = data.sharding
      return sharding
    return o
  return [placed(x, o) for x, o in zip(leaves, own, strict=True)]


def _is_sharding_leaf(x: Any) -> bool:
  return x is None or isinstance(x, Sharding)


def _broadcast_in_shardings(in_shardings: Any, treedef: Any) -> list[Any]:
  """Per-leaf shardings of the positional leaves (keyword leaves: None)."""
  args_tree, kwargs_tree = treedef.children()
  subtrees = args_tree.children()
  if isinstance(in_shardings, Sharding):
    per_arg = [in_shardings] * len(subtrees)
  else:
    per_arg = list(in_shardings)
    if len(per_arg) != len(subtrees):
      raise ValueError(
          f"in_shardings has {len(per_arg)} entries but the call has {len(subtrees)} "
          "dynamic positional argument(s); give one Sharding (or pytree prefix of "
          "Shardings, None for the argument's own) per positional argument, as in jax.jit.")
  out: list[Any] = []
  for prefix, sub in zip(per_arg, subtrees, strict=True):
    dummy = sub.unflatten([0] * sub.num_leaves)
    out.extend(sub.flatten_up_to(jax.tree.broadcast(prefix, dummy, is_leaf=_is_sharding_leaf)))
  return out + [None] * kwargs_tree.num_leaves


# --- shards along an axis ------------------------------------------------------

def shards_along(sharding: Sharding | None, ndim: int) -> tuple[int, ...]:
  """How many ways each axis is split (1 for a sharding that is not named)."""
  if not isinstance(sharding, NamedSharding):
    return (1,) * ndim
  spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
  mesh = sharding.mesh.shape
  return tuple(math.prod(mesh[a] for a in _axis_names(entry)) for entry in spec[:ndim])


def _axis_names(entry: Any) -> tuple[Any, ...]:
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


_auto_meshes: dict[Any, Any] = {}


def auto(sharding: Sharding | None) -> Sharding | None:
  """`sharding` on its mesh with every axis `Auto` (see the module docstring)."""
  if not isinstance(sharding, NamedSharding):
    return sharding
  mesh = sharding.mesh
  if all(t == AxisType.Auto for t in mesh.axis_types):
    return sharding
  auto_mesh = _auto_meshes.get(mesh)
  if auto_mesh is None:
    auto_mesh = _auto_meshes[mesh] = mesh.update(axis_types=(AxisType.Auto,) * len(mesh.axis_names))
  return NamedSharding(auto_mesh, sharding.spec, memory_kind=sharding.memory_kind)


def user_mesh(shardings: Sequence[Sharding | None]) -> Any:
  """The mesh to relabel outputs with: the first non-`Auto` one, or None."""
  for s in shardings:
    if isinstance(s, NamedSharding) and any(t != AxisType.Auto for t in s.mesh.axis_types):
      return s.mesh
  return None


def relabel(x: Any, mesh: Any) -> Any:
  """`x` (an output on the `Auto` twin of `mesh`) on `mesh` itself: same buffers."""
  sharding = getattr(x, "sharding", None)
  if mesh is None or not isinstance(sharding, NamedSharding) or sharding.mesh == mesh:
    return x
  if sharding.mesh.devices.shape != mesh.devices.shape or sharding.mesh.axis_names != mesh.axis_names:
    return x
  target = NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)
  return jax.make_array_from_single_device_arrays(
      x.shape, target, [shard.data for shard in x.addressable_shards])


@overload
def for_program(sharding: Sharding, shape: Sequence[int]) -> Sharding: ...
@overload
def for_program(sharding: None, shape: Sequence[int]) -> None: ...
@overload
def for_program(sharding: Sharding | None, shape: Sequence[int]) -> Sharding | None: ...
def for_program(sharding: Sharding | None, shape: Sequence[int]) -> Sharding | None:
  """The sharding a program's argument of `shape` gets: `Auto`, and fitted."""
  return fit(auto(sharding), shape)


def fit(sharding: Sharding | None, shape: Sequence[int]) -> Sharding | None:
  """`sharding` with the mesh axes dropped from every axis of `shape` whose
  size they do not split evenly (those axes are replicated instead)."""
  if not isinstance(sharding, NamedSharding):
    return sharding
  return fit_named(sharding, shape)


def fit_named(sharding: NamedSharding, shape: Sequence[int]) -> NamedSharding:
  """`fit` for a `NamedSharding`."""
  counts = shards_along(sharding, len(shape))
  if all(n % k == 0 for n, k in zip(shape, counts, strict=True)):
    return sharding
  # The spec padded (or cut) to the rank: a spec may name fewer axes than the array has.
  spec = (tuple(sharding.spec) + (None,) * len(shape))[:len(shape)]
  kept = [entry if n % k == 0 else None for entry, n, k in zip(spec, shape, counts, strict=True)]
  return NamedSharding(sharding.mesh, PartitionSpec(*kept),  # type: ignore[no-untyped-call, unused-ignore]
                       memory_kind=sharding.memory_kind)


def dim_multiples(binding: Any, shardings: Sequence[Sharding | None]) -> dict[str, int]:
  """Dimension -> the number its buckets must be a multiple of: the least
  common multiple of the shard counts of the axes it is the size of."""
  out: dict[str, int] = {}
  for leaf, sharding in zip(binding.leaves, shardings, strict=True):
    dims = leaf.symbolic_shape
    for d, k in zip(dims, shards_along(sharding, len(dims)), strict=True):
      if k == 1 or not jc.is_symbolic_dim(d):
        continue
      form = _dims.linear_form(d)
      if form is not None and form[1] == 0 and len(form[0]) == 1 and set(form[0].values()) == {1}:
        name = next(iter(form[0]))
        out[name] = math.lcm(out.get(name, 1), k)
  return out


def round_up(size: int, multiple: int) -> int:
  return -(-size // multiple) * multiple


# --- compile and run -----------------------------------------------------------

def lower(body: Callable[..., Any], name: str, padded_shapes: Any, avals: Any,
          n_dims: int, donate: tuple[int, ...],
          shardings: Sequence[Sharding | None] | None = None,
          out_shardings: Any = None) -> Any:
  """`jax.jit(body)` lowered for the leaves at `padded_shapes` placed with
  `shardings` (each fitted to its shape; None: one device), and `n_dims`
  logical sizes (replicated on a mesh); `name` names it for JAX."""
  body.__name__ = name
  if shardings is None:
    shardings = (None,) * len(padded_shapes)
  placed = [for_program(s, p) for s, p in zip(shardings, padded_shapes, strict=True)]
  # jax.ShapeDtypeStruct's and PartitionSpec's __init__ are unannotated in JAX (a stub gap).
  leaves = [jax.ShapeDtypeStruct(p, a[0], weak_type=a[1], sharding=s)  # type: ignore[no-untyped-call, unused-ignore]
            for p, a, s in zip(padded_shapes, avals, placed, strict=True)]
  mesh = next((s.mesh for s in placed if isinstance(s, NamedSharding)), None)
  replicated = None if mesh is None else NamedSharding(mesh, PartitionSpec())  # type: ignore[no-untyped-call, unused-ignore]
  sizes = tuple(jax.ShapeDtypeStruct((), jc.dim_value_dtype(), sharding=replicated)  # type: ignore[no-untyped-call, unused-ignore]
                for _ in range(n_dims))
  options: dict[str, Any] = {} if out_shardings is None else {"out_shardings": out_shardings}
  return jax.jit(body, donate_argnums=donate, **options).lower(*leaves, sizes)


def run(program: Any, leaves: Sequence[Any], padded_shapes: Any, dtypes: Any, logical: Any,
        shardings: Sequence[Sharding | None] | None) -> Any:
  """The padded outputs of `program` for these leaves, each padded on the
  host (one device, or a leaf not on a mesh) or on its mesh."""
  if shardings is None:
    ins = [pad(x, p, d) for x, p, d in zip(leaves, padded_shapes, dtypes, strict=True)]
    return program(*ins, logical)
  ins = [pad(x, p, d) if s is None else place(x, p, d, for_program(s, p))
         for x, p, d, s in zip(leaves, padded_shapes, dtypes, shardings, strict=True)]
  outs = program(*ins, logical)
  mesh = user_mesh(shardings)
  return outs if mesh is None else jax.tree.map(lambda o: relabel(o, mesh), outs)


def place(x: Any, padded_shape: tuple[int, ...], dtype: Any, sharding: Sharding) -> jax.Array:
  """`x` (array or `pj.Padded`) padded to `padded_shape`, placed with
  `sharding`, built shard by shard."""
  data = x.data if isinstance(x, Padded) else x
  shape = logical_shape(x)
  if isinstance(data, jax.Array):
    if tuple(data.shape) == padded_shape and data.dtype == dtype:
      if data.sharding == sharding:
        return data
      if isinstance(sharding, NamedSharding) and auto(data.sharding) == sharding:
        relabelled: jax.Array = relabel(data, sharding.mesh)  # same placement, Auto label: no copy
        return relabelled
      moved: jax.Array = jax.device_put(data, sharding)
      return moved
    return jax.make_array_from_callback(
        padded_shape, sharding, _ShardSource(data, shape, padded_shape, dtype).piece)
  host = np.asarray(data, dtype)
  if tuple(host.shape) == padded_shape:
    put: jax.Array = jax.device_put(host, sharding)
    return put
  return jax.make_array_from_callback(padded_shape, sharding,
                                      lambda index: _host_piece(host, shape, padded_shape, index, dtype))


def unpad_for(shardings: Sequence[Sharding | None] | None) -> Callable[[Any, tuple[int, ...]], Any]:
  """How outputs of a program placed with `shardings` are unpadded: `unpad`,
  or for one device the host path it would take anyway (without asking each
  output for its sharding on every call)."""
  return unpad_on_host if shardings is None else unpad


def unpad(x: Any, shape: tuple[int, ...]) -> Any:
  """The leading `shape` corner of a padded output, keeping its sharding
  (shard by shard); single-device outputs take the host path."""
  if tuple(x.shape) == tuple(shape):
    return x
  sharding = getattr(x, "sharding", None)  # (float0 outputs are NumPy arrays)
  if not isinstance(sharding, NamedSharding) or sharding.num_devices == 1:
    return unpad_on_host(x, shape)
  return jax.make_array_from_callback(tuple(shape), fit_named(sharding, shape),
                                      _ShardSource(x, shape, shape, x.dtype).piece)


def _bounds(index: Any, shape: Sequence[int]) -> list[tuple[int, int]]:
  return [sl.indices(n)[:2] for sl, n in zip(index, shape, strict=True)]


def _host_piece(host: np.ndarray[Any, Any], logical: Sequence[int], padded_shape: Sequence[int],
                index: Any, dtype: Any) -> np.ndarray[Any, Any]:
  """The shard at `index` of the padded array: `host`'s data, zeros after."""
  bounds = _bounds(index, padded_shape)
  out = np.zeros([b - a for a, b in bounds], dtype)
  region = tuple(slice(a, min(b, n)) for (a, b), n in zip(bounds, logical, strict=True))
  if all(r.stop > r.start for r in region):
    target = tuple(slice(0, r.stop - r.start) for r in region)
    out[target] = host[region]
  return out


class _ShardSource:
  """Fills target shards from the overlapping addressable shards of `array`
  (each copied to the host once, shard by shard)."""

  def __init__(self, array: jax.Array, logical: Sequence[int], target_shape: Sequence[int],
               dtype: Any) -> None:
    self.logical = tuple(logical)
    self.target_shape = tuple(target_shape)
    self.dtype = dtype
    seen: set[Any] = set()
    self.shards: list[tuple[Any, Any]] = []
    for shard in array.addressable_shards:
      bounds = tuple(_bounds(shard.index, array.shape))
      if bounds not in seen:  # replicas hold the same data
        seen.add(bounds)
        self.shards.append((bounds, shard))
    self._host: dict[Any, Any] = {}

  def piece(self, index: Any) -> np.ndarray[Any, Any]:
    bounds = _bounds(index, self.target_shape)
    out = np.zeros([b - a for a, b in bounds], self.dtype)
    want = [(a, min(b, n)) for (a, b), n in zip(bounds, self.logical, strict=True)]
    need = math.prod(max(0, b - a) for a, b in want)
    covered = 0
    for src, shard in self.shards:
      lo = [max(a, s) for (a, _), (s, _) in zip(want, src, strict=True)]
      hi = [min(b, e) for (_, b), (_, e) in zip(want, src, strict=True)]
      if any(h <= l for l, h in zip(lo, hi, strict=True)):
        continue
      host = self._host.get(src)
      if host is None:
        host = self._host[src] = np.asarray(shard.data)
      out[tuple(slice(l - a, h - a) for l, h, (a, _) in zip(lo, hi, bounds, strict=True))] = host[
          tuple(slice(l - s, h - s) for l, h, (s, _) in zip(lo, hi, src, strict=True))]
      covered += math.prod(h - l for l, h in zip(lo, hi, strict=True))
    if covered < need:
      raise ShapeError(
          "padding this sharded array moves data across processes: its shard at "
          f"{tuple(bounds)} needs entries that no device of this process holds (a "
          "dynamic axis sharded across processes whose shard boundaries change with "
          "the bucket). Build the padded array on each process instead: "
          "pj.Ragged.from_process_local(...) for examples, or pass pj.Padded(data, "
          "logical_shape) whose data already has the bucket's shape.")
    return out


# --- several processes ---------------------------------------------------------

def single_process() -> bool:
  single: bool = jax.process_count() == 1
  return single


def agree_on_program(padded_shapes: Any, bucket: Any, what: str) -> None:
  """In a multi-process run: checks that every process compiles the same
  program now (a digest of its padded shapes and bucket), before compiling."""
  if single_process():
    return
  digest = hashlib.sha256(repr((tuple(padded_shapes), tuple(bucket))).encode()).digest()
  multihost_utils.assert_equal(
      np.frombuffer(digest[:8], np.int32),
      f"{what}: the processes chose different programs for one call (padded shapes "
      f"{padded_shapes} on this process). Every process must make the same pj.jit calls "
      "with the same global shapes; build process-local data into global arrays first "
      "(pj.Ragged.from_process_local, jax.make_array_from_process_local_data).")


def agree_on_batch(local_max: Sequence[int], local_count: int) -> tuple[list[int], int]:
  """(the maximum of each ragged axis's local maximum over all processes, the
  global number of examples): one small collective (`process_allgather`).
  Every process must hold the same number of examples."""
  mine = np.asarray([local_count, *local_max], np.int64)
  if single_process():
    return mine[1:].tolist(), int(local_count)
  rows = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), -1)
  counts = rows[:, 0].tolist()
  if len(set(counts)) != 1:
    raise ShapeError(
        f"Ragged.from_process_local: the processes hold {counts} examples; each process "
        "must hold the same number (its share of the global batch). Drop or repeat "
        "examples so the counts agree.")
  return rows[:, 1:].max(axis=0).tolist(), int(rows[:, 0].sum())


def batch_sharding(sharding: Any) -> NamedSharding:
  if not isinstance(sharding, NamedSharding):
    raise TypeError(
        "a Ragged batch is placed with a jax.sharding.NamedSharding, e.g. "
        f"NamedSharding(mesh, P('data')); got {sharding!r}.")
  return sharding


def batch_multiple(sharding: NamedSharding) -> int:
  """How many shards the batch axis is split into."""
  return shards_along(sharding, 1)[0]


def check_batch(batch: int, sharding: NamedSharding, what: str) -> None:
  k = batch_multiple(sharding)
  if batch % k:
    raise ShapeError(
        f"{what}: a batch of {batch} examples does not split evenly over the {k} shards "
        f"of the batch axis of {sharding.spec}. Give a multiple of {k} examples, or "
        f"pass batch_buckets={k} (rows padded out to a multiple of {k}, which every "
        "output skips).")


def put_batch(host: np.ndarray, sharding: NamedSharding | None) -> Any:
  """A host batch (rows on axis 0) on the device(s): on `sharding`'s mesh,
  each device receiving only its own rows."""
  if sharding is None:
    return jax.device_put(host)
  return jax.device_put(host, fit_batch(sharding, host.ndim))


def put_replicated(value: Any, sharding: NamedSharding | None) -> Any:
  if sharding is None:
    return jax.device_put(value)
  return jax.device_put(value, NamedSharding(sharding.mesh, PartitionSpec()))  # type: ignore[no-untyped-call, unused-ignore]


def put_process_local(host: np.ndarray, sharding: NamedSharding, global_batch: int) -> jax.Array:
  """This process's rows of a global batch (`jax.make_array_from_process_local_data`)."""
  # jax.make_array_from_process_local_data is unannotated in JAX (a stub gap).
  array: jax.Array = jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call, unused-ignore]
      fit_batch(sharding, host.ndim), host, (global_batch, *host.shape[1:]))
  return array


def fit_batch(sharding: NamedSharding, ndim: int) -> NamedSharding:
  """A batch sharding for an array of rank `ndim`: the named spec's entries
  past `ndim` dropped (a P('data', 'seq') batch still places its lengths)."""
  if len(sharding.spec) > ndim:
    return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[:ndim]),  # type: ignore[no-untyped-call, unused-ignore]
                         memory_kind=sharding.memory_kind)
  return sharding


def on_auto_axes(fun: Callable[..., Any], args: Any) -> Any:
  """`fun(*args)`; inside a trace whose batch (the first leaf, rows on axis 0)
  is typed as sharded over `Explicit` mesh axes, run with those axes `Auto`
  (`jax.sharding.auto_axes`), outputs whose leading axis is the batch split as
  the batch is and the rest replicated. The masking rules build masks that
  sharding-in-types would refuse to combine with sharded data."""
  first = jax.tree.leaves(args)[0]
  sharding: Any = getattr(jax.typeof(first), "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  if mesh is None or not any(t == AxisType.Explicit for t in mesh.axis_types):
    return fun(*args)
  batch, entry = first.shape[0], tuple(sharding.spec)[0] if len(sharding.spec) else None
  plain = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.typeof(x).dtype),  # type: ignore[no-untyped-call, unused-ignore]
                       args)
  shapes = jax.eval_shape(fun, *plain)
  out_sharding = jax.tree.map(
      lambda s: PartitionSpec(entry) if s.ndim and s.shape[0] == batch else PartitionSpec(),  # type: ignore[no-untyped-call, unused-ignore]
      shapes)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.sharding.auto_axes(fun, out_sharding=out_sharding)(*args)


def jit_options(in_shardings: Any, out_shardings: Any) -> dict[str, Any]:
  """The keyword arguments of `jax.jit` for these shardings (given ones only)."""
  options: dict[str, Any] = {}
  if in_shardings is not None:
    options["in_shardings"] = in_shardings
  if out_shardings is not None:
    options["out_shardings"] = out_shardings
  return options
