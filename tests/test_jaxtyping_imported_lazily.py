"""`import polyjit` does not import jaxtyping (about 10 ms of CPU time after
JAX's import); annotations are still read where the user imported
it, before or after polyjit, and `pj.shapecheck(f)` imports it itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("jaxtyping")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import sys
import jax.numpy as jnp
import polyjit as pj
from polyjit._jit.annotations import annotated_specs
print("after polyjit:", "jaxtyping" in sys.modules)
from jaxtyping import Array, Float   # imported after polyjit, as a user module may

def f(x: Float[Array, "n"]) -> Float[Array, ""]:
  return jnp.sum(x)

print("specs:", annotated_specs(f))
del sys.modules["jaxtyping"]   # (pj.shapecheck imports it where nothing did)
pj.shapecheck(f)
print("shapecheck: ok")
'''


def test_polyjit_does_not_import_jaxtyping_and_still_reads_its_annotations():
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert "after polyjit: False" in lines
  assert "specs: ('(n,)',)" in lines
  assert "shapecheck: ok" in lines
