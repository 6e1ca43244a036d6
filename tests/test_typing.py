"""Types: mypy passes on polyjit/ (pyproject.toml's [tool.mypy]: strict, on every
module), and every public function and
method of `polyjit` has annotated parameters and a return type (UNTYPED, the
list of exceptions, is empty and may only shrink: an entry that became typed
fails the test until it is removed).
"""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import polyjit as pj

ROOT = Path(__file__).resolve().parent.parent

PYTREE_PROTOCOL = {"tree_flatten", "tree_flatten_with_keys", "tree_unflatten"}

#: (public name, parameter or "return") not annotated yet: none. Kept as the
#: place to list an exception, which the test then requires to stay unannotated.
UNTYPED: set[tuple[str, str]] = set()


def _public_callables():
  for name in pj.__all__:
    value = getattr(pj, name)
    if inspect.isfunction(value):
      yield name, value
    elif inspect.isclass(value) and value.__module__.startswith("polyjit"):
      for attr, member in vars(value).items():
        if inspect.isfunction(member) and (not attr.startswith("_") or attr in
                                           ("__init__", "__call__")):
          yield f"{name}.{attr}", member
        elif isinstance(member, classmethod) and not attr.startswith("_"):
          yield f"{name}.{attr}", member.__func__


def missing_annotations() -> set[tuple[str, str]]:
  missing = set()
  for name, fun in _public_callables():
    if name.split(".")[-1] in PYTREE_PROTOCOL:
      continue
    signature = inspect.signature(fun)
    for param in list(signature.parameters.values()):
      if param.name in ("self", "cls"):
        continue
      if param.annotation is inspect.Parameter.empty:
        missing.add((name, param.name))
    if signature.return_annotation is inspect.Signature.empty:
      missing.add((name, "return"))
  return missing


def test_the_public_api_is_annotated():
  missing = missing_annotations()
  new = sorted(missing - UNTYPED)
  assert not new, f"public functions without annotations: {new}"
  done = sorted(UNTYPED - missing)
  assert not done, f"these are annotated now; remove them from UNTYPED: {done}"


@pytest.mark.heavy
def test_mypy_passes():
  if importlib.util.find_spec("mypy") is None:
    pytest.skip("mypy is not installed (pip install -e '.[test]')")
  run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
