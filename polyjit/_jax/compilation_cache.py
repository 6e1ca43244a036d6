"""polyjit's compiled programs as bytes: the key, the serialization, the load.

polyjit keeps its own programs on disk (`_caching/disk.py`); it never turns
on, reconfigures or replaces JAX's persistent compilation cache, and writes no
`jax.config` value. This module only reads:

* `program_key(lowered)`: a hash of everything that decides what a lowered
  program compiles to: the StableHLO text (without locations: a moved source
  line is the same program), the JAX and jaxlib versions, the platform and its
  version, the devices' kinds and count, the XLA flags in the environment, and
  every `jax.config` value at this moment (conservative: a changed option is a
  miss, never a stale program). polyjit's own trace-epoch option is left out.
* `serialize_program` / `load_program`: `jax.experimental.serialize_executable`
  (public, experimental). The pytrees are not stored: a load takes them from
  the `Lowered` the key was computed from, so they always match the call.

Loading runs what the bytes say (pickle and an XLA executable): the cache
directory must be as trusted as JAX's own cache directory would be.
"""
from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import jax
import jaxlib
from jax.experimental import serialize_executable as _serialize

#: Environment variables that change what XLA compiles.
_XLA_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "TPU_ACCELERATOR_TYPE")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_JAXLIB_VERSION = str(getattr(jaxlib, "__version__", ""))  # (not in jaxlib's stubs)


def _require() -> None:
  from .registry import PROGRAMS, require  # (their probe, at their first use)
  require(PROGRAMS)


def config_values() -> dict[str, str]:
  """Every `jax.config` option and its current value (as text), JAX's own
  options only (polyjit's registered trace epoch varies by design)."""
  values: dict[str, Any] = dict(jax.config.values)
  out: dict[str, str] = {}
  for name in sorted(values):
    if name.startswith("polyjit_"):
      continue
    # the thread's value where the option has one (a context manager's), else the global
    out[name] = _ADDRESS.sub("", repr(getattr(jax.config, name, values[name])))
  return out


def default_device_chosen() -> bool:
  """Whether `jax_default_device` names a device (a program compiled for it may
  live on another backend than the one a load would put it on)."""
  return getattr(jax.config, "jax_default_device", None) is not None


def program_key(lowered: Any) -> str:
  """The hash under which the program `lowered` compiles to is stored."""
  _require()
  devices = jax.devices()
  parts = [lowered.as_text(), jax.__version__, _JAXLIB_VERSION,
           devices[0].platform, devices[0].client.platform_version,
           ",".join(sorted({d.device_kind for d in devices})), str(len(devices))]
  parts += [f"{k}={os.environ.get(k, '')}" for k in _XLA_ENV]
  parts += [f"{k}={v}" for k, v in config_values().items()]
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def serialize_program(compiled: Any) -> bytes | None:
  """The bytes of `compiled`, or None where JAX cannot serialize it (closed-over
  constants, a backend without serialization): such a program is not kept."""
  _require()
  try:
    data, _, _ = _serialize.serialize(compiled)
  except Exception:  # (ValueError, NotImplementedError, XLA's own errors)
    return None
  return bytes(data)


def load_program(data: bytes, lowered: Any) -> Any:
  """The compiled program `data` holds, for the calls `lowered` was lowered for
  (raises on bytes that do not load)."""
  _require()
  return _serialize.deserialize_and_load(data, lowered.in_tree, lowered.out_tree)
