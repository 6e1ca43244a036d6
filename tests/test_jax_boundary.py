"""The JAX boundary (`polyjit/_jax/`): which frames are the user's, the probes
of JAX internals, and per-trace swaps seen from other threads."""
from __future__ import annotations

import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit import _jax as jc
from polyjit._jax import frames

BRANCHY = '''
import jax.numpy as jnp

def equal_one(x):
  return x[0] * 0 + 42.0 if x.shape[0] == 1 else jnp.sum(x)
'''


def _import_file(path, name):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def fake_jax_dir(tmp_path, monkeypatch):
  """JAX's package directory pretended to be tmp_path/jax, so that a sibling
  tmp_path/jax_md_fake/ is what `site-packages/jax_md/` is to the real one."""
  fake = str(tmp_path / "jax")
  monkeypatch.setattr(frames, "_JAX_DIR", fake)
  frames.is_user_path.cache_clear()
  yield fake
  frames.is_user_path.cache_clear()


def test_a_package_whose_name_starts_with_jax_is_user_code(tmp_path, fake_jax_dir):
  sibling = tmp_path / "jax_md_fake"
  sibling.mkdir()
  (sibling / "branchy.py").write_text(BRANCHY)
  inside = tmp_path / "jax" / "_src"
  inside.mkdir(parents=True)
  (inside / "branchy.py").write_text(BRANCHY)
  assert jc.is_user_path(str(sibling / "branchy.py"))
  assert not jc.is_user_path(str(inside / "branchy.py"))  # the check can fail

  f = _import_file(sibling / "branchy.py", "jax_md_fake_branchy").equal_one
  jf = pj.jit(f)
  for n in (1, 3, 1, 5):
    x = np.arange(1.0, n + 1, dtype=np.float32)
    want = 42.0 if n == 1 else x.sum()
    np.testing.assert_allclose(jf(x), want)  # n == 1 answered False would give 1.0


def test_the_real_jax_and_polyjit_are_not_user_code():
  frames.is_user_path.cache_clear()
  assert not jc.is_user_path(jnp.__file__)
  assert not jc.is_user_path(pj.__file__)
  assert not jc.is_polyjit_path(__file__) and jc.is_user_path(__file__)
  # a sibling of polyjit's directory named like it is not polyjit's
  assert not jc.is_polyjit_path(os.path.dirname(os.path.dirname(pj.__file__)) + "/polyjit_extras/x.py")


def test_warnings_point_at_the_users_line():
  from polyjit import _errors
  with pytest.warns(pj.FallbackWarning) as record:
    _errors.warn_user("hello", pj.FallbackWarning); line = sys._getframe().f_lineno
  assert (record[0].filename, record[0].lineno) == (__file__, line)
