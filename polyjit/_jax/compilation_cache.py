"""polyjit's compiled programs as bytes: the key, the serialization, the load.

polyjit keeps its own programs on disk (`_caching/disk.py`); it never turns
on, reconfigures or replaces JAX's persistent compilation cache, and writes no
`jax.config` value. This module only reads:

* `program_key(lowered)`: a hash of everything that decides what a lowered
  program compiles to and how it is called: the StableHLO text (without
  locations: a moved source line is the same program), its calling convention
  (`calling_convention`), the JAX and jaxlib versions, the platform and its
  version, the devices' kinds and count, the XLA flags in the environment, and
  every `jax.config` value at this moment (conservative: a changed option is a
  miss, never a stale program). polyjit's own trace-epoch option is left out.
* `calling_convention(stage)`: what a loaded program replays besides its
  text. The text alone is not enough: JAX drops unused arguments from it, and
  a serialized executable brings back the argument types of the process that
  compiled it (and the weak types of its results), so two programs with one
  text and different unused arguments (shape, dtype, weak type), donation or
  result weak types would share an entry, and the load would refuse the call
  ("Argument types differ") or return a weak type where the call has none.
  The convention is every argument's type, pruned ones included (dtype,
  shape, weak type, sharding, memory space), its donation, which arguments the
  program keeps, every result's type with its weak type, and the pytrees; the
  key adds the requested shardings and layouts.
* `serialize_program` / `load_program`: `jax.experimental.serialize_executable`
  (public, experimental). The pytrees are not stored: a load takes them from
  the `Lowered` the key was computed from. A load also reads the convention
  back from the loaded program and refuses one that differs from the
  `Lowered`'s (`ProgramMismatch`: the cache treats it as a miss), so no entry
  is ever run for a call it was not compiled for, whatever wrote it.

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


class ProgramMismatch(ValueError):
  """A stored program whose calling convention is not the call's."""


def _text(value: Any) -> str:
  """`value` as text that is the same in every process (no addresses, sets sorted)."""
  if isinstance(value, (set, frozenset)):
    return "{" + ", ".join(sorted(_text(v) for v in value)) + "}"
  if isinstance(value, (list, tuple)):
    return "(" + ", ".join(_text(v) for v in value) + ")"
  return _ADDRESS.sub("", repr(value))


def _aval_text(aval: Any) -> str:
  """Every field of a type that a program's call checks or its results carry."""
  return " ".join([type(aval).__name__, str(getattr(aval, "dtype", None)),
                   str(getattr(aval, "shape", None)),
                   f"weak_type={getattr(aval, 'weak_type', None)}"]
                  + [f"{name}={_text(getattr(aval, name, None))}"
                     for name in ("sharding", "memory_space", "vma")])


def calling_convention(stage: Any) -> tuple[str, ...]:
  """What a program replays when it is loaded (see the module docstring), read
  from a `Lowered` (what the call needs) or from a `Compiled` (what a loaded
  program brings back): the same lines for the same convention."""
  if isinstance(stage, jax.stages.Compiled):
    executable: Any = stage._executable  # (a MeshExecutable: its fields are not in JAX's stubs)
    kept, every, outs = (executable._kept_var_idx, executable._all_args_info,
                         executable.out_avals)
  else:
    args = stage._lowering.compile_args
    kept, every, outs = args["kept_var_idx"], args["all_args_info"], args["global_out_avals"]
  infos, in_tree = jax.tree_util.tree_flatten(stage.args_info)
  return (
      "args " + "; ".join(f"{_aval_text(i._aval)} donated={i.donated}" for i in infos),
      "in_avals " + "; ".join(_aval_text(a) for a in jax.tree_util.tree_leaves(stage.in_avals)),
      "all_args " + ("None" if every is None else "; ".join(_aval_text(a) for a in every.in_avals)),
      "kept " + _text(sorted(kept)),
      "outs " + "; ".join(_aval_text(a) for a in outs),
      f"in_tree {_text(in_tree)}", f"out_tree {_text(stage.out_tree)}")


def _placement(lowered: Any) -> tuple[str, ...]:
  """The shardings and layouts `lowered` asks for (a compiled program has
  them resolved, so they are in the key, not in the check on load)."""
  args = lowered._lowering.compile_args
  return tuple(f"{name} {_text(args[name])}"
               for name in ("in_shardings", "out_shardings", "in_layouts", "out_layouts"))


def program_key(lowered: Any) -> str:
  """The hash under which the program `lowered` compiles to is stored."""
  _require()
  devices = jax.devices()
  parts = [lowered.as_text(), *calling_convention(lowered), *_placement(lowered),
           jax.__version__, _JAXLIB_VERSION,
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
  (raises on bytes that do not load, and `ProgramMismatch` on a program
  compiled for another calling convention)."""
  _require()
  program = _serialize.deserialize_and_load(data, lowered.in_tree, lowered.out_tree)
  loaded, wanted = calling_convention(program), calling_convention(lowered)
  if loaded != wanted:
    differ = [f"{a} | {b}" for a, b in zip(loaded, wanted, strict=True) if a != b]
    raise ProgramMismatch("a stored program compiled for another calling convention "
                          "(loaded | wanted): " + "; ".join(differ))
  return program
