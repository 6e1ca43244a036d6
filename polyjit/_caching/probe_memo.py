"""The JAX probes that passed, kept next to polyjit's on-disk programs.

Every JAX internal polyjit relies on has a probe (`_jax/registry.py`), run at
the first use of its feature in each process. In a second process (a script
run again) those first uses fall in its first call, and the probe of the
on-disk programs lowers a program of its own: about a third of that call.
So, where polyjit's disk cache is on (`_caching/disk.py`), the names of the
probes that passed are written to `<cache>/probes/<key>.json`, and a process
whose key is the same skips them.

The key says that nothing a probe reads can have changed: the Python version,
the default backend,
the RECORD files of the installed `jax` and `jaxlib` wheels (pip writes each
installed file's sha256 there, so a reinstall or an upgrade changes it), and
the size and modification time of each of polyjit's `_jax/` modules (the
probes themselves). It is read only once a compile has turned the cache on
(`disk.root_if_decided`): polyjit's import and first trace neither start
JAX's backend for it nor touch the cache's directory, and the probes that run
before (a trace's) are not skipped; the programs probe, the costly one, runs
after. Where JAX or jaxlib is not installed from a wheel (an
editable install, a source tree on the path: its files change without a
RECORD), there is no key and every probe runs, as without a cache. A failed
probe is never remembered; a memo that cannot be read or written only means
that the probes run. `registry.forget()` (tests) runs them again in this
process whatever the memo says.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys

import jax

from .. import _jax as jc
from .disk import root_if_decided, write_atomically  # (the module, not the package: its __init__ imports this one)

_state: dict[str, str | None] = {}   # "key": computed once per process


def _wheel_record(name: str) -> bytes | None:
  """The RECORD of an installed wheel (its files' hashes), or None where the
  package is not installed from one (editable, a source tree)."""
  try:
    dist = importlib.metadata.distribution(name)
    direct = dist.read_text("direct_url.json")
    if direct and json.loads(direct).get("dir_info", {}).get("editable"):
      return None
    record = dist.read_text("RECORD")
  except Exception:  # noqa: BLE001  (not installed as a distribution)
    return None
  return record.encode() if record else None


def key() -> str | None:
  """What the probes' results depend on, hashed; None: no memo."""
  if "key" in _state:
    return _state["key"]
  # (the backend too: a probe that moves an array may behave otherwise on another)
  digest = hashlib.sha256(f"{sys.version}\n{jax.default_backend()}\n".encode())
  result: str | None = None
  records = [_wheel_record(name) for name in ("jax", "jaxlib")]
  if all(r is not None for r in records):
    for r in records:
      digest.update(r or b"")
    here = os.path.dirname(os.path.abspath(jc.__file__))
    try:
      for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
          st = os.stat(os.path.join(here, name))
          digest.update(f"{name} {st.st_size} {st.st_mtime_ns}\n".encode())
      result = digest.hexdigest()[:32]
    except OSError:
      result = None
  _state["key"] = result
  return result


def _path(base: str | None) -> str | None:
  k = key() if base is not None else None
  return None if k is None or base is None else os.path.join(base, "probes", k + ".json")


def load() -> set[str] | None:
  """The names of the probes that passed in an earlier process (none if
  unknown); None until a compile has turned the cache on (ask again then):
  before it nothing is read, created or warned about, and JAX's backend,
  part of the key, is not started by polyjit's import or first trace."""
  base = root_if_decided()
  if base is None:
    return None
  path = _path(base)
  if path is None:
    return set()
  try:
    with open(path) as f:
      names = json.load(f)
  except (OSError, ValueError):
    return set()
  return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def save(names: set[str]) -> None:
  """Keeps `names` (atomically: a reader sees a whole memo or none), once a
  compile turned the cache on (until then the names wait for the next save)."""
  path = _path(root_if_decided())
  if path is None:
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  write_atomically(path, json.dumps(sorted(names)).encode())


jc.registry.use_memo(load, save)
