"""Host-side padding and unpadding, and `pj.Padded` for staying on the device.

`pj.jit` must not compile a device program per distinct shape, and an eager
`jnp.pad(x)` or `y[:n]` on a new shape compiles one (tens of milliseconds).
So arguments are padded on the host (a zeroed NumPy buffer of the bucket's
shape with the data copied in) and outputs with dynamic dims are sliced on the
host and put back on the device: no compiler on the call path.

On a CPU the host *is* the device and this costs a copy. On a GPU it is a
device-to-host round trip for device-resident arguments of a new shape and
for outputs with dynamic dims. To chain calls without it, `f.call_padded`
returns `pj.Padded` values (the padded buffer plus its logical shape), which
another `pj.jit` function takes as they are when they fit its bucket.
"""

from __future__ import annotations

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
  out = np.zeros(padded_shape, dtype)
  out[tuple(slice(0, s) for s in shape)] = host
  return out


def pad_into(x: Any, padded_shape: tuple[int, ...], dtype: Any,
             region: tuple[slice, ...]) -> np.ndarray:
  """A zeroed host buffer of `padded_shape` with `x` (array or scalar, not
  `Padded`) copied into `region`, its leading corner: `pad`'s hot path."""
  out = np.zeros(padded_shape, dtype)
  out[region] = x
  return out


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
  return jc.host_to_device(np.ascontiguousarray(host), x.sharding)
