"""polyjit's own small programs on a synchronous CPU client: no thread-pool hand-off.

XLA:CPU runs a program on the calling thread only when its client is
synchronous, when XLA's cost analysis counts fewer than 1,000 flops, or inside
a host callback (`PjRtCpuExecutable::ExecuteHelper`); every other call is
handed to the client's thread pool, and the caller waits for that thread when
it reads the result. For a program of tens of microseconds the hand-off costs
as much as the program: on the 2-core test machine, loaded, the seed's
likelihood at 4,096 elements took 14 us a call on the calling thread against
44 us handed off, result read each call. jaxlib binds no per-call execution
mode (`LoadedExecutable.execute_sharded` has none; `ExecuteOptions.execution_mode`
is not exposed, at 0.10.2 nor at main cec06d1), and `jax_cpu_enable_async_dispatch`
is process-wide: the user's choice, which a library must not change.

So polyjit keeps a CPU client of its own, created synchronous
(`_jax.get_tfrt_cpu_client(asynchronous=False)`, one device), and loads a copy
of a small program there (`inline_copy`: serialized and deserialized, the same
XLA executable, so the same results bit for bit). Arrays cross between the two
clients through the host, without a copy where XLA:CPU can alias the memory:
`jax.Array` inputs of the default client (`to_inline`), and outputs back to
the default client's device (`to_default`), each with its aval (dtype, weak
type), uncommitted, as the program on the default client gives them.

Refused (None, the program runs as JAX runs it): a backend other than CPU, a
default client that is already synchronous, a multi-process (`jax.distributed`) run, a `jax_default_device` chosen, a
program with host callbacks, effects or closed-over constants (those JAX does
not serialize), and `POLYJIT_INLINE_CPU=0` in the environment. Every internal
used here is checked on first use (`_probe`); where one is missing or fails,
`inline_device()` is None. Nothing here writes a `jax.config` value or touches
JAX's default client.
"""
from __future__ import annotations

import os
import threading
from typing import Any

import jax
import numpy as np
from jax._src.array import ArrayImpl as _ArrayImpl
from jax._src.interpreters import pxla as _pxla
from jax.experimental import serialize_executable as _serialize

from .compilation_cache import default_device_chosen

_UNSET: Any = object()
_lock = threading.Lock()
# "device": the private client's device, or None where it cannot be had;
# "default": (sharding, [device]) of the default client's first device
_state: dict[str, Any] = {"device": _UNSET}


def _probe() -> Any:
  """The private synchronous client's device (raises where an internal is missing)."""
  from jax._src.lib import _jax  # type: ignore[attr-defined, unused-ignore]
  from .registry import INLINE, require
  require(INLINE)  # (its row in the registry; a failure turns the feature off)
  client = _jax.get_tfrt_cpu_client(asynchronous=False, num_devices=1)
  device = client.local_devices()[0]
  assert device.platform == "cpu", device.platform
  assert callable(_pxla.batched_device_put) and issubclass(_ArrayImpl, jax.Array)
  assert "backend" in _serialize.deserialize_and_load.__code__.co_varnames
  return device


def inline_device() -> Any | None:
  """The device of polyjit's synchronous CPU client, or None where programs
  run as JAX runs them (see the module docstring). Asked when a program is
  compiled, not per call."""
  if os.environ.get("POLYJIT_INLINE_CPU", "1") == "0" or default_device_chosen():
    return None
  if jax.default_backend() != "cpu" or not jax.config.values.get("jax_cpu_enable_async_dispatch", True):
    return None  # (another backend; or the user made the default client synchronous)
  if jax.process_count() > 1:
    return None  # (a multi-process run: its programs and their order are agreed on)
  device = _state["device"]
  if device is _UNSET:
    with _lock:
      device = _state["device"]
      if device is _UNSET:
        try:
          device = _probe()
          default = jax.devices()[0]
          _state["default"] = (jax.sharding.SingleDeviceSharding(default), [default])
          _state["inline"] = (jax.sharding.SingleDeviceSharding(device), [device])
        except Exception:  # a jaxlib without it, or a client that cannot start
          device = None
        _state["device"] = device
  return device


def inline_copy(program: Any, device: Any, data: bytes | None = None,
                fresh: bool = True) -> Any | None:
  """`program` (a `jax.stages.Compiled` of the default client) loaded on
  `device`'s client, from `data` (its serialized bytes, `_caching/disk.py`)
  or else serialized now where `fresh` (compiled in this process: a loaded
  XLA:CPU executable serializes without its kernels, and then fails to run).
  None where it cannot be: host callbacks, effects or closed-over constants
  (JAX does not serialize those), or a copy that fails its trial run on
  zeros (`_trial`)."""
  try:
    unloaded = program._executable._unloaded_executable
    if (unloaded.host_callbacks or unloaded.ordered_effects or unloaded.unordered_effects
        or unloaded.keepalive or program._params.const_args):
      return None
    if data is None:
      if not fresh:
        return None
      data, _, _ = _serialize.serialize(program)
    copy = _serialize.deserialize_and_load(data, program.in_tree, program.out_tree,
                                           backend=device.client, execution_devices=[device])
    return copy if _trial(copy) else None
  except Exception:  # (an attribute JAX renamed; a program JAX will not serialize)
    return None


def _trial(program: Any) -> bool:
  """Whether `program` runs (on zeros; its outputs are dropped): bytes that
  load but lack a kernel fail here, not in a user's call."""
  leaves = []
  for info in jax.tree.leaves(program.args_info):
    aval = info._aval
    if aval.weak_type:  # (a Python scalar, as a weakly typed argument comes)
      if aval.shape:
        return False
      leaves.append(np.zeros((), aval.dtype).item())
    else:
      leaves.append(np.zeros(aval.shape, aval.dtype))
  args, kwargs = program.in_tree.unflatten(leaves)
  jax.block_until_ready(program(*args, **kwargs))  # type: ignore[no-untyped-call, unused-ignore]
  return True


def program_cost(program: Any) -> tuple[float, float] | None:
  """(flops, bytes accessed) of a compiled program by XLA's cost analysis, or None."""
  try:
    costs = program.cost_analysis()
    if isinstance(costs, (list, tuple)):
      costs = costs[0]
    return float(costs.get("flops", 0.0)), float(costs.get("bytes accessed", 0.0))
  except Exception:
    return None


def inline_sharding() -> Any:
  """The sharding that puts an array on polyjit's synchronous client (after
  `inline_device()` returned its device)."""
  return _state["inline"][0]


def to_inline(x: Any) -> Any:
  """A default-client `jax.Array` as an array of polyjit's synchronous client
  (uncommitted, same aval), through the host: a view where XLA:CPU aliases."""
  sharding, devices = _state["inline"]
  return _pxla.batched_device_put(x.aval, sharding, [np.asarray(x)], devices, committed=False)


def to_default(x: Any) -> Any:
  """An array of polyjit's synchronous client on the default client's device,
  uncommitted, with its aval (dtype, weak type)."""
  sharding, devices = _state["default"]
  return _pxla.batched_device_put(x.aval, sharding, [np.asarray(x)], devices, committed=False)
