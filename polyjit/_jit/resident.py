"""The accelerator path: device-resident arguments and outputs stay on the device.

On a GPU or TPU a `jax.Array` lives in device memory, and a host round trip
(read it into host memory, pad or slice there, upload it again) is a
synchronisation and two copies over the bus. So where programs run on JAX's
own client (any backend but CPU, or a CPU with `POLYJIT_INLINE_CPU=0`: the
same path, which is how CI tests it), a plan (`plans.py`) pads and unpads
`jax.Array`s here, on their device:

* **Padding** (`pad`): a small program per (shape, padded shape, dtype),
  `lax.pad` under `jax.jit`, cached. A shape never seen before is padded
  through the host once instead (explicit `jax.device_get`/`device_put`), since a
  compile (milliseconds) costs more than a round trip of a small array (tens
  of microseconds on a GPU); the second call of that shape compiles its pad
  program, and every later one runs it. An array of `COMPILE_AT_ONCE` bytes or
  more, whose round trip costs about a compile, compiles at its first call.
  So a sequence of distinct sizes compiles only its buckets' programs, and a
  shape seen before moves nothing through the host.
* **Unpadding** (`unpad`): an output with a dynamic dim is the leading corner
  of its padded buffer, cut by a small slice program per (padded shape,
  logical shape, dtype), chosen the same way (the host once, then the
  program). A zero-copy view is not to be had: `jax.Array` has no view of
  part of a buffer, and DLPack's importers copy or refuse a strided corner.
* **Chains** (`origin`): each sliced output keeps its padded buffer (weakly
  keyed by the output, at most `ORIGINS` of them), so a polyjit output passed
  to a `pj.jit` function whose bucket has that padded shape is taken as it
  lies: the automatic form of `call_padded` and `pj.Padded`. Padding content is
  unspecified (the invariant), so the padded buffer serves as it is.

Every transfer made here is explicit, so these calls run under
`jax.transfer_guard("disallow")`. On the default CPU path (polyjit's inline
client, `_jax/inline_cpu.py`) host memory is the device's and the host
buffers of `_masking/padding.py` are cheaper: nothing here runs there.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

import jax
import numpy as np

from .. import _jax as jc
from .._masking import padding as _padding

#: Arrays of this many bytes or more compile their pad or slice program at
#: their first call (a round trip of them costs about what a compile does).
COMPILE_AT_ONCE = 64 << 20
#: Sliced outputs whose padded buffer is kept for a chained call (`origin`).
ORIGINS = 64

# (shape, padded or logical shape, dtype) -> its program; a key in `_seen`
# only: met once, padded or sliced through the host
_pads: dict[tuple[Any, ...], Callable[[Any], Any]] = {}
_slices: dict[tuple[Any, ...], Callable[[Any], Any]] = {}
_seen: set[tuple[Any, ...]] = set()
# id(sliced output) -> (weak reference to it, its padded buffer)
_origins: dict[int, tuple[weakref.ref[Any], Any]] = {}
_lock = threading.Lock()


def accelerator_path() -> bool:
  """Whether programs run on JAX's own client for the default backend: any
  backend but CPU, or a CPU with `POLYJIT_INLINE_CPU=0` (asked per plan)."""
  return os.environ.get("POLYJIT_INLINE_CPU", "1") == "0" or jax.default_backend() != "cpu"


def pad(x: Any, padded: tuple[int, ...], dtype: Any, region: Any = None) -> Any:
  """`x` as an array of shape `padded`, on `x`'s device where `x` is a
  `jax.Array` (a `pj.Padded` that fits passes as it is; NumPy arrays and
  scalars in a host buffer, uploaded explicitly). `region`: `Plan.pads`'s
  (unused: the call signature of `pad_into`)."""
  if type(x) is not jc.ARRAY_TYPE or not isinstance(x.dtype, np.dtype):
    return _through_host(x, padded, dtype)
  entry = _origins.get(id(x))
  if entry is not None and entry[0]() is x:
    data = entry[1]
    if data.shape == padded and data.dtype == dtype and not data.is_deleted():
      return data
  key = (x.shape, padded, x.dtype)
  program = _pads.get(key)
  if program is None:
    program = _program(_pads, key, x, _pad_program, padded, dtype)
    if program is None:
      return _through_host(x, padded, dtype)
  return program(x)


def unpad(x: Any, shape: tuple[int, ...]) -> Any:
  """The leading `shape` corner of a padded output, as an array on its
  device; the padded buffer is kept for a chained call (`origin`)."""
  if x.shape == shape:
    return x
  if type(x) is not jc.ARRAY_TYPE or not isinstance(x.dtype, np.dtype) \
      or len(x.sharding.device_set) != 1:
    return jc.explicitly(jc.explicitly_read, _padding.unpad, x, shape)  # (keys, float0)
  key = (x.shape, shape, x.dtype)
  program = _slices.get(key)
  if program is None:
    program = _program(_slices, key, x, _slice_program, shape, x.dtype)
  if program is None:
    host = jax.device_get(x)[tuple(slice(0, n) for n in shape)]
    out = jc.host_to_device(np.ascontiguousarray(host), x.sharding)
  else:
    out = program(x)
  _keep_origin(out, x)
  return out


def _program(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], x: Any,
             make: Callable[..., Any], shape: tuple[int, ...], dtype: Any) -> Any:
  """The cached program for `key`, or None where this is the key's first
  call and `x` is small: the host serves it (see the module docstring)."""
  with _lock:
    program = cache.get(key)
    if program is not None:
      return program
    if key not in _seen and x.nbytes < COMPILE_AT_ONCE:
      _seen.add(key)
      return None
    program = cache[key] = make(shape, dtype)
    return program


def _pad_program(padded: tuple[int, ...], dtype: Any) -> Callable[[Any], Any]:
  def polyjit_pad(a: Any) -> Any:
    a = a.astype(dtype)
    # (the padding's content is unspecified: zeros are the cheapest to write)
    return jax.lax.pad(a, np.zeros((), dtype), [(0, p - n, 0) for n, p in zip(
        a.shape, padded, strict=True)])
  fn: Callable[[Any], Any] = jax.jit(polyjit_pad)
  return fn


def _slice_program(shape: tuple[int, ...], dtype: Any) -> Callable[[Any], Any]:
  def polyjit_slice(a: Any) -> Any:
    return jax.lax.slice(a, (0,) * len(shape), shape)
  fn: Callable[[Any], Any] = jax.jit(polyjit_slice)
  return fn


def _through_host(x: Any, padded: tuple[int, ...], dtype: Any) -> Any:
  """`_masking/padding.pad` (through a host buffer), its reads and uploads explicit."""
  out = jc.explicitly(jc.explicitly_read, _padding.pad, x, padded, dtype)
  if type(out) is np.ndarray:
    where = x.sharding if type(x) is jc.ARRAY_TYPE else jc.default_sharding()
    return jc.host_to_device(out, where)
  return out


# --- chains ---------------------------------------------------------------------

def _keep_origin(out: Any, padded: Any) -> None:
  """Keeps `padded` as long as `out` lives (at most `ORIGINS` outputs)."""
  key = id(out)

  def drop(ref: weakref.ref[Any]) -> None:
    entry = _origins.get(key)
    if entry is not None and entry[0] is ref:
      _origins.pop(key, None)
  _origins[key] = (weakref.ref(out, drop), padded)
  if len(_origins) > ORIGINS:
    try:
      del _origins[next(iter(_origins))]
    except (KeyError, StopIteration, RuntimeError):  # (another thread got there)
      pass


def origin(x: Any) -> Any | None:
  """The padded buffer behind a polyjit output `x`, if it is still kept."""
  entry = _origins.get(id(x))
  return entry[1] if entry is not None and entry[0]() is x else None


def forget() -> None:
  """Drops every cached program and kept buffer (for tests)."""
  with _lock:
    _pads.clear()
    _slices.clear()
    _seen.clear()
    _origins.clear()
