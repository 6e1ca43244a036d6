"""The older supported JAX line: a fast subset of the suite on JAX 0.9.2.

pyproject.toml declares jax>=0.9.2 (no upper bound: probes); the whole suite runs on 0.10.2
(the environment it is installed in), and this test runs a subset on 0.9.2
in a virtual environment of its own, `.venv-jax09` at the repository root
(built on first use with pip, reused afterwards; delete it to rebuild). The
subset covers specs, `pj.mask` (gradients, jit and vmap over sizes), `pj.jit`
and the errors; what 0.9 lacks is handled in one place, the version section
of polyjit/_jax/. POLYJIT_SKIP_OLD_JAX=1 skips it (offline machines).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = ROOT / ".venv-jax09"
VERSION = "0.9.2"
REQUIREMENTS = [f"jax=={VERSION}", f"jaxlib=={VERSION}", "numpy>=1.26", "pytest>=8",
                "hypothesis>=6.100"]
SUBSET = ["tests/test_spec.py", "tests/test_mask_api.py", "tests/test_jit.py",
          "tests/test_errors.py", "tests/test_jax_boundary.py", "tests/test_data_dependent_cached_helpers.py"]


def _python() -> Path:
  return ENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _ensure_env() -> Path:
  stamp = ENV / "polyjit-requirements.txt"
  wanted = "\n".join(REQUIREMENTS)
  if stamp.exists() and stamp.read_text() == wanted and _python().exists():
    return _python()
  venv.EnvBuilder(clear=True, with_pip=True).create(ENV)
  run = subprocess.run([str(_python()), "-m", "pip", "install", "-q", *REQUIREMENTS],
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, f"could not install JAX {VERSION}:\n{run.stdout}{run.stderr}"
  stamp.write_text(wanted)
  return _python()


@pytest.mark.skipif(os.environ.get("POLYJIT_SKIP_OLD_JAX") == "1",
                    reason="POLYJIT_SKIP_OLD_JAX=1")
@pytest.mark.heavy
def test_a_fast_subset_passes_on_jax_0_9():
  python = _ensure_env()
  env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
  run = subprocess.run([str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        *SUBSET], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
  assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
  version = subprocess.run([str(python), "-c", "import jax; print(jax.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
  assert version == VERSION
