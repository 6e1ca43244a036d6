"""Every script in examples/ runs, at its default (small) size.

The scripts check their own results against `jax.jit` or the unpadded
computation (they raise when polyjit is wrong), so running them is the test.
They run in this process (importing JAX once) with `__name__ == "__main__"`
and no command-line arguments; an example that needs a package polyjit does
not depend on (optax, equinox) is skipped where it is missing.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
import warnings
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NEEDS = {"ragged_transformer.py": ["optax"], "equinox_model.py": ["equinox", "optax"]}


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_the_example_runs(script, monkeypatch, capsys):
  missing = [m for m in NEEDS.get(script, []) if importlib.util.find_spec(m) is None]
  if missing:
    pytest.skip(f"{script} needs {missing}")
  monkeypatch.setattr(sys, "argv", [str(EXAMPLES / script)])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
  assert capsys.readouterr().out.strip(), f"{script} printed nothing"
