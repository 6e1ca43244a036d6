"""The accelerator path: device-resident arguments and outputs stay on the device.

On a GPU or TPU a `jax.Array` lives in device memory, and a host round trip
(read it into host memory, pad or slice there, upload it again) is a
synchronisation and two copies over the bus. So where programs run on JAX's
own client (any backend but CPU, or a CPU with `POLYJIT_INLINE_CPU=0`: the
same path, which is how CI tests it), a plan (`plans.py`) pads and unpads
`jax.Array`s here, on their device:

* **Padding** (`pad`): a small program per (shape, padded shape, dtype),
  `lax.pad` under `jax.jit`, cached. Which is cheaper, that program's
  compile (tens of milliseconds) or a round trip through the host (tens of
  microseconds for a small array on a GPU, more where it waits for queued
  work), depends on how often the shape comes back, so it is rented first:
  a shape is padded through the host (explicit `jax.device_get`/`device_put`,
  each round trip timed) until its round trips have cost `RENT` x a compile
  (the mean of the pad and slice compiles timed in this process, `COMPILE`
  seconds until one is), then its program is compiled and every later call
  runs it. A shape that keeps coming back (a training loop's batch, the hot
  call) moves nothing through the host after that; a long run of ever new
  sizes (the seed workload: 8,600 distinct lengths in 20,000 calls) compiles
  no pad programs where compiling one for every shape seen twice would have
  cost thousands of compiles. An array of `COMPILE_AT_ONCE` bytes or more
  compiles at its first call, and so does any array where the user's
  `jax.transfer_guard("disallow_explicit")` refuses the round trip. `RENT = 0`
  compiles at a shape's second call.
* **Unpadding** (`unpad`): an output with a dynamic dim is the leading corner
  of its padded buffer, cut by a small slice program per (padded shape,
  logical shape, dtype), rented the same way. A zero-copy view is not to be
  had: `jax.Array` has no view of part of a buffer, and DLPack's importers
  copy or refuse a strided corner.
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
import time
from typing import Any, Callable

import jax
import numpy as np

from .. import _jax as jc
from .._masking import padding as _padding
from .kept import KeptWhileAlive

#: Arrays of this many bytes or more compile their pad or slice program at
#: their first call (a round trip of them costs about what a compile does).
COMPILE_AT_ONCE = 64 << 20
#: A shape's program is compiled once its host round trips have cost RENT x
#: a compile (0: at its second call).
RENT = 1.0
#: A pad or slice program's compile, in seconds, until one is timed.
COMPILE = 0.05
#: Sliced outputs whose padded buffer is kept for a chained call (`origin`).
ORIGINS = 64

# (shape, padded or logical shape, dtype) -> its program
_pads: dict[tuple[Any, ...], Callable[[Any], Any]] = {}
_slices: dict[tuple[Any, ...], Callable[[Any], Any]] = {}
# key -> seconds its host round trips have cost so far (a key without a program)
_seen: dict[tuple[Any, ...], float] = {}
_compiles = [0, 0.0]   # pad and slice programs compiled and timed, their seconds
# a sliced output -> its padded buffer
_origins = KeptWhileAlive(ORIGINS)
_lock = threading.Lock()


def seconds_compiling() -> float:
  """The seconds this process has spent compiling pad and slice programs (a
  hot shape's account leaves them out: `hot_shapes.py`)."""
  return _compiles[1]


def accelerator_path() -> bool:
  """Whether programs run on JAX's own client for the default backend: any
  backend but CPU, or a CPU with `POLYJIT_INLINE_CPU=0` (asked per plan)."""
  return os.environ.get("POLYJIT_INLINE_CPU", "1") == "0" or jax.default_backend() != "cpu"


def pad(x: Any, padded: tuple[int, ...], dtype: Any, region: Any = None,
        where: Any = None) -> Any:
  """`x` as an array of shape `padded`, on `x`'s device where `x` is a
  `jax.Array` (a `pj.Padded` that fits passes as it is; NumPy arrays and
  scalars in a host buffer, uploaded explicitly to `where`, the device the
  other arguments are committed to, else the default one). `region`:
  `Plan.pads`'s (unused: the call signature of `pad_into`)."""
  if type(x) is not jc.ARRAY_TYPE or not isinstance(x.dtype, np.dtype):
    return _through_host(x, padded, dtype, where)
  if x.is_deleted():  # type: ignore[no-untyped-call, unused-ignore]
    # (deleted or donated: refused as jax.jit refuses it, never read through a
    # padded buffer kept for it)
    raise RuntimeError(f"Array has been deleted with shape={x.dtype}{list(x.shape)}.")
  data = _origins.get(x)
  if data is not None and data.shape == padded and data.dtype == dtype \
      and not data.is_deleted():
    return data
  key = (x.shape, padded, x.dtype)
  program = _pads.get(key)
  if program is not None:
    return program(x)
  return _rented(_pads, key, x, _pad_program, padded, dtype,
                 lambda: _through_host(x, padded, dtype))


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
  if program is not None:
    out = program(x)
  else:
    def through_host() -> Any:
      host = jax.device_get(x)[tuple(slice(0, n) for n in shape)]
      return jc.host_to_device(np.ascontiguousarray(host), x.sharding, x.weak_type)
    out = _rented(_slices, key, x, _slice_program, shape, x.dtype, through_host)
  _origins.put(out, x)   # (kept while `out` lives, for a chained call)
  return out


def _rented(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], x: Any,
            make: Callable[..., Any], shape: tuple[int, ...], dtype: Any,
            through_host: Callable[[], Any]) -> Any:
  """`key`'s result for `x` where it has no program yet: through the host
  (timed, as rent) until that has cost `RENT` x a compile, then by its
  program, compiled now (timed). See the module docstring."""
  rent = _seen.get(key)
  if x.nbytes < COMPILE_AT_ONCE and (rent is None or rent < RENT * compile_seconds()):
    t0 = time.perf_counter()
    try:
      out = through_host()
    except Exception as e:  # `jax.transfer_guard("disallow_explicit")`: buy it now
      if not jc.transfer_refused(e):
        raise
    else:
      if len(_seen) > 1 << 16:  # (a long run of new sizes: start the accounts over)
        _seen.clear()
      _seen[key] = _seen.get(key, 0.0) + time.perf_counter() - t0
      return out
  with _lock:
    program = cache.get(key)
    if program is not None:
      return program(x)
    program = make(shape, dtype)
    t0 = time.perf_counter()
    out = program(x)  # (compiles: jax.jit's first call)
    _compiles[0] += 1
    _compiles[1] += time.perf_counter() - t0
    cache[key] = program
    _seen.pop(key, None)
    return out


def compile_seconds() -> float:
  """What a pad or slice program's compile costs: the mean of those timed in
  this process (`COMPILE` until one is)."""
  count, seconds = _compiles
  return seconds / count if count else COMPILE


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


def _through_host(x: Any, padded: tuple[int, ...], dtype: Any, where: Any = None) -> Any:
  """`_masking/padding.pad` (through a host buffer), its reads and uploads
  explicit; the result on `x`'s device, else on `where` or the default one."""
  out = jc.explicitly(jc.explicitly_read, _padding.pad, x, padded, dtype)
  if type(out) is np.ndarray:
    if type(x) is jc.ARRAY_TYPE:
      where = x.sharding
    return jc.host_to_device(out, jc.default_sharding() if where is None else where)
  return out


# --- chains ---------------------------------------------------------------------

def origin(x: Any) -> Any | None:
  """The padded buffer behind a polyjit output `x`, if it is still kept."""
  return _origins.get(x)


def forget() -> None:
  """Drops every cached program and kept buffer (for tests)."""
  with _lock:
    _pads.clear()
    _slices.clear()
    _seen.clear()
    _origins.clear()
    _compiles[:] = [0, 0.0]
