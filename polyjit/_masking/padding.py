"""Host-side padding and unpadding, and `pj.Padded` for staying on the device.

`pj.jit` must not compile a device program per distinct shape, and an eager
`jnp.pad(x)` or `y[:n]` on a new shape compiles one (tens of milliseconds).
So arguments are padded on the host (a NumPy buffer of the bucket's shape
with the data copied in, `host_buffer`) and outputs with dynamic dims are
sliced on the host and put back on the device: no compiler on the call path.

The padding of such a buffer is left as `np.empty` leaves it: masking makes
no assumption about the padding's content (NaN, inf, any garbage: the
invariant, tested with garbage), so zeroing it would only cost a pass over
the whole bucket on every call. Booleans are the exception: a byte other than
0 or 1 is not a valid XLA PRED, so theirs is zeroed. So is every buffer while
`jax_debug_nans` or `jax_debug_infs` is on: those check every output of a
program, padding included, and garbage that happens to be NaN or inf would
raise a FloatingPointError in a call that has none (now and then, as the
memory's content goes; zero padding keeps `x * 2` quiet). The buffer's data is
aligned to `ALIGN` bytes, which lets XLA:CPU use it in place; an unaligned
NumPy buffer (`malloc` aligns to 16) is copied by XLA into a fresh buffer of
its own on every call: on the test machine 25 us against 12 us a call for a
128 KiB bucket, 150 us against 60 us at 1 MiB. XLA:CPU runs with denormals
flushed, so garbage costs no slow arithmetic either.

On a CPU the host *is* the device and this costs a copy. On the accelerator
path (a GPU or TPU, or `POLYJIT_INLINE_CPU=0`) `jax.Array`s are padded and
sliced on their device instead (`_jit/resident.py`); what comes here there
is NumPy data, and a shape's first call. `f.call_padded` returns `pj.Padded`
values (the padded buffer plus its logical shape), which another `pj.jit`
function takes as they are when they fit its bucket.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import jax
import numpy as np

from .. import _jax as jc


@jax.tree_util.register_pytree_node_class
class Padded:
  """A padded array on the device and the logical shape of its data.

  The data occupies the leading `shape` corner of `data`; the rest is padding
  with unspecified content. `pj.jit` functions accept `Padded` arguments and
  use `data` without copying when it already has their bucket's shape.
  """
  __slots__ = ("data", "shape")

  def __init__(self, data: jax.Array, shape: Sequence[int]) -> None:
    self.data = data
    self.shape = tuple(int(s) for s in shape)

  @property
  def dtype(self) -> np.dtype[Any]:
    return self.data.dtype

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def unpad(self) -> jax.Array:
    """The logical array (a host round trip, no compile)."""
    return unpad(self.data, self.shape)

  def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    return np.asarray(self.unpad(), dtype=dtype)

  def __repr__(self) -> str:
    return f"Padded(shape={self.shape}, padded={tuple(self.data.shape)}, dtype={self.dtype})"

  def tree_flatten(self) -> tuple[tuple[jax.Array], tuple[int, ...]]:
    return (self.data,), self.shape

  @classmethod
  def tree_unflatten(cls, shape: tuple[int, ...], children: Sequence[Any]) -> Padded:
    return cls(children[0], shape)


def is_padded(x: object) -> bool:
  return isinstance(x, Padded)


def logical_shape(x: Any) -> tuple[int, ...]:
  shape = getattr(x, "shape", None)  # arrays, NumPy scalars and Padded have one
  return tuple(np.shape(x)) if shape is None else tuple(shape)


def pad(x: Any, padded_shape: tuple[int, ...], dtype: Any) -> Any:
  """`x` (array, scalar or Padded) as an array of `padded_shape` and `dtype`.

  Arguments that already have the padded shape and dtype pass through
  untouched (device arrays stay on the device).
  """
  data = x.data if isinstance(x, Padded) else x
  if logical_shape(data) == padded_shape and _dtype_of(data) == dtype:
    return data
  if is_key_dtype(dtype):  # typed PRNG keys: pad their raw data, wrap it again
    impl = jax.random.key_impl(data)
    raw = jax.random.key_data(data)
    inner = Padded(raw, (*logical_shape(x), *raw.shape[data.ndim:])) if isinstance(
        x, Padded) else raw
    padded = pad(inner, (*padded_shape, *raw.shape[data.ndim:]), raw.dtype)
    return jax.random.wrap_key_data(padded, impl=impl)
  shape = logical_shape(x)
  host = np.asarray(data)
  if isinstance(x, Padded):
    host = host[tuple(slice(0, s) for s in shape)]
  out = host_buffer(padded_shape, np.dtype(dtype))
  out[tuple(slice(0, s) for s in shape)] = host
  return out


def pad_into(x: Any, padded_shape: tuple[int, ...], dtype: np.dtype[Any],
             region: tuple[slice, ...]) -> np.ndarray:
  """A host buffer of `padded_shape` (`host_buffer`) with `x` (array or
  scalar, not `Padded`) copied into `region`, its leading corner: `pad`'s
  hot path."""
  out = host_buffer(padded_shape, dtype)
  out[region] = x
  return out


#: XLA:CPU uses a host buffer in place when its data is aligned to this many
#: bytes (`cpu_function_runtime::MinAlign()`), and copies it otherwise.
ALIGN = 64
#: Smaller buffers are not aligned: XLA:CPU's copy of them costs about what
#: aligning does (measured: about the same call time at 64 KiB, twice at 128 KiB).
ALIGN_FROM = 1 << 17
_c_char_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def host_buffer(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
  """An uninitialized C-contiguous host array whose data is aligned to `ALIGN`
  bytes from `ALIGN_FROM` bytes on (zeroed for booleans: see the module
  docstring). It is a view, in `dtype`, of a fresh `np.empty` byte block a
  little larger, starting at its first aligned byte. The block is bytes, not
  `dtype`: `ctypes` takes the address of a uint8 array, but refuses
  bfloat16 and float8 ones (dtypes NumPy's buffer protocol cannot describe)."""
  if not isinstance(dtype, np.dtype) or dtype.kind == "b" or _checks_floats():
    return np.zeros(shape, dtype)  # (an extended dtype: as NumPy makes it)
  count = 1
  for n in shape:
    count *= n
  nbytes = count * dtype.itemsize
  if nbytes < ALIGN_FROM:
    return np.empty(shape, dtype)
  raw = np.empty(nbytes + ALIGN, np.uint8)
  # (NumPy's stubs do not declare its buffer protocol)
  start = -_addressof(_c_char_from_buffer(raw)) & (ALIGN - 1)  # type: ignore[arg-type, unused-ignore]
  out = raw[start:start + nbytes].view(dtype)
  return out if len(shape) == 1 else out.reshape(shape)


def _checks_floats() -> bool:
  """Whether JAX checks programs' outputs for NaN or inf (`jax.debug_nans`,
  `jax.debug_infs`; the context managers included): 0.1 us."""
  return bool(jax.config.jax_debug_nans or jax.config.jax_debug_infs)  # type: ignore[attr-defined, unused-ignore]


def _dtype_of(x: Any) -> Any:
  dtype = getattr(x, "dtype", None)
  if dtype is None or is_key_dtype(dtype):
    return dtype
  return np.dtype(dtype)


def is_key_dtype(dtype: Any) -> bool:
  """Whether `dtype` is a typed PRNG key's (an extended dtype NumPy does
  not know: keys are padded and unpadded through their raw data)."""
  return not isinstance(dtype, np.dtype) and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key)


def unpad(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """The leading `shape` corner of a padded device array, as a device array."""
  if tuple(x.shape) == tuple(shape):
    return x
  if x.dtype == jax.dtypes.float0:  # zero-size data, no device buffer: as jax.jit gives it
    return np.zeros(shape, jax.dtypes.float0)  # type: ignore[return-value]
  if is_key_dtype(x.dtype):
    raw = jax.random.key_data(x)
    data = unpad(raw, (*shape, *raw.shape[x.ndim:]))
    keys: jax.Array = jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return keys
  host = np.asarray(x)[tuple(slice(0, s) for s in shape)]
  return jc.host_to_device(np.ascontiguousarray(host), x.sharding, x.weak_type)
