"""Remembered dynamic axes: a second run of a script skips automatic mode's exact first program.

Automatic mode (`_jit/auto.py`) compiles a function's first call at its exact
shapes, because one call cannot tell which axes vary; the second call with a
new length makes that axis dynamic and compiles (or loads) a bucket program.
In a second process of the same script the exact program is pure start-up
cost: the first run already learned which axes vary. So, where polyjit's
on-disk cache is on (`disk.py`), the dynamic axes a structure learned are kept
in `axes/<hash>.json` (the axes' names, grouped as they share a dimension
variable) and a new structure of a later process starts with them dynamic
(`DimTracker.assume`): its first call runs the bucket program that the bucket
memory and the program cache have for it. Where no bucket an earlier run
compiled holds the first call, it runs its exact shapes, as without the hint
(`Planner._masked_plan`): a first call at the first run's first shapes loads
that program rather than compile a new bucket.

The file is a hint, never a program: what is compiled or loaded is decided by
the trace of the function as it is now, as for any masked call, so a stale
hint costs at most padding (a masked program where the exact shape would do)
and never a wrong result. Its key is a hash of the function's identity (its
module, qualified name and code, nested code included, not its closure's
values), the call structure (static values, pytree, dtypes, ranks, placement,
JAX's trace context, the arguments' names) and the JAX version; a function
without code (a `functools.partial`, a callable object) gets no hint, nor does
a multi-process run (its processes must plan alike, whatever each one's cache
holds). At most
`MAX_PROGRAMS` hints are kept (the least recently written go).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import types
from typing import Any, Callable, Sequence

import jax

from . import disk

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _code_parts(code: types.CodeType, out: list[str]) -> None:
  out += [code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
          code.co_code.hex(), repr(code.co_names), repr(code.co_varnames),
          repr(code.co_freevars)]
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      _code_parts(const, out)
    else:
      out.append(_ADDRESS.sub("", repr(const)))


def key(fun: Callable[..., Any], structure: Any, leaf_names: Sequence[str]) -> str | None:
  """The hint's key for `fun` called with `structure` (a `StructureKey`), or
  None where `fun` has no code of its own to identify it by."""
  code = getattr(fun, "__code__", None)
  if not isinstance(code, types.CodeType) or disk.root() is None:
    return None  # (no code to know it by; or the on-disk cache is off)
  if jax.process_count() > 1:
    return None  # (the processes of a multi-process run must plan alike: no per-process hint)
  try:
    parts = [str(getattr(fun, "__module__", "")), str(getattr(fun, "__qualname__", "")),
             jax.__version__]
    _code_parts(code, parts)
    parts += [_ADDRESS.sub("", repr(p)) for p in structure]  # (a static value's repr may raise)
    parts += list(leaf_names)
  except Exception:  # noqa: BLE001  (no hint: the call goes on as without one)
    return None
  return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _file(hint_key: str) -> str | None:
  base = disk.root()
  return None if base is None else os.path.join(base, "axes", hint_key + ".json")


def recall(hint_key: str | None) -> list[list[str]]:
  """The dynamic axes remembered under `hint_key` (none if unknown, or if the
  on-disk cache is off)."""
  path = None if hint_key is None else _file(hint_key)
  if path is None:
    return []
  try:
    with open(path) as f:
      groups = json.load(f)["groups"]
  except (OSError, ValueError, KeyError, TypeError):
    return []
  if not (isinstance(groups, list) and all(
      isinstance(g, list) and g and all(isinstance(n, str) for n in g) for g in groups)):
    return []
  return groups


def remember(hint_key: str | None, groups: list[list[str]]) -> None:
  """Keeps `groups` (the dynamic axes by name) under `hint_key` (atomic; best effort)."""
  path = None if hint_key is None else _file(hint_key)
  if path is None or not groups or recall(hint_key) == groups:
    return
  try:
    directory = os.path.dirname(path)
    new = not os.path.exists(path)
    os.makedirs(directory, exist_ok=True)
    disk.write_atomically(path, json.dumps({"groups": groups}).encode())
    if new:
      disk._trim(directory)  # (bounded as the bucket memories are)
  except OSError:
    pass  # a hint: losing it costs only the exact first program
