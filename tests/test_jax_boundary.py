"""The JAX boundary (`polyjit/_jax/`): which frames are the user's, the probes
of JAX internals, and per-trace swaps seen from other threads."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit import _jax as jc
from polyjit._jax import frames, size_class

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
  _forget_user_paths()
  yield fake
  # (what was decided while JAX's files passed for the user's: a later test in
  # this process would otherwise take JAX's own `x.shape[0]` for user code's)
  _forget_user_paths()


def _forget_user_paths():
  frames.is_user_path.cache_clear()
  size_class._user_file.clear()


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
  from polyjit._masking import errors as _errors
  with pytest.warns(pj.FallbackWarning) as record:
    _errors.warn_user("hello", pj.FallbackWarning); line = sys._getframe().f_lineno
  assert (record[0].filename, record[0].lineno) == (__file__, line)


# --- probes: a missing internal gets a clear error, never a wrong answer ---------------

def test_a_missing_internal_at_import_names_the_feature_and_versions():
  code = ("import jax._src.export.shape_poly as sp\n"
          "del sp._bounds_decision\n"
          "import polyjit\n")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert done.returncode != 0
  assert "JaxBoundaryError" in done.stderr, done.stderr[-2000:]
  for part in ("size comparisons in user code", "_bounds_decision", jax.__version__,
               f"tested with JAX {jc.NEWEST_TESTED}"):
    assert part in done.stderr, (part, done.stderr[-2000:])


def test_a_missing_swapped_internal_refuses_the_trace(monkeypatch):
  from jax._src.numpy import lax_numpy
  monkeypatch.delattr(lax_numpy, "searchsorted")
  jc.registry.forget()
  f = pj.jit(lambda a, v: jnp.searchsorted(a, v), polymorphic_shapes=["n", None])
  with pytest.raises(jc.JaxBoundaryError, match="exact spellings during traces"):
    f(np.arange(5.0, dtype=np.float32), np.array([2.5], np.float32))
  monkeypatch.undo()
  jc.registry.forget()
  f = pj.jit(lambda a, v: jnp.searchsorted(a, v), polymorphic_shapes=["n", None])
  np.testing.assert_array_equal(
      f(np.arange(5.0, dtype=np.float32), np.array([2.5], np.float32)), [3])


def test_every_installed_patch_was_probed():
  from polyjit._jax import patches, registry
  assert patches.INSTALLED  # polyjit is imported: the patches are in place
  probed = {r.name for r in registry.ROWS.values() if r.kind == "patch"}
  assert {"shape_poly._DimExpr.__eq__", "source_info_util.register_exclusion(path)",
          "ad.primitive_jvps"} <= probed
  with pj.diagnostics.count_compiles() as compiles:
    for row in registry.ROWS.values():
      row.probe()  # every probe holds on the installed JAX
  assert len(compiles) == 0  # and compiles nothing (compile counts are user-visible)


# --- per-trace swaps never change what another thread computes ------------------------

def _plain_jax_checks(rounds, errors):
  x = np.array([3.0, -1.0, 0.0, 2.0, -5.0, 2.0], np.float32)
  xs = np.sort(x)
  for _ in range(rounds):
    try:
      np.testing.assert_array_equal(jnp.where(x > 0, x, 0.0), np.where(x > 0, x, 0.0))
      np.testing.assert_array_equal(jnp.nonzero(x > 0, size=4, fill_value=-1)[0], [0, 3, 5, -1])
      np.testing.assert_array_equal(jnp.unique(x, size=6, fill_value=9.0),
                                    [-5.0, -1.0, 0.0, 2.0, 3.0, 9.0])
      np.testing.assert_array_equal(jnp.searchsorted(xs, np.float32(1.5)),
                                    np.searchsorted(xs, 1.5))
      np.testing.assert_array_equal(jax.lax.fori_loop(0, 4, lambda i, c: c + i, 0), 6)
      np.testing.assert_array_equal(jnp.asarray(x)[jnp.asarray(x) > 0], x[x > 0])
      np.testing.assert_array_equal(
          jax.jit(lambda v: jnp.nonzero(v > 0, size=3)[0])(x), [0, 3, 5])
    except Exception as e:  # reported in the main thread
      errors.append(e)
      return


def test_plain_jax_in_another_thread_while_polyjit_traces():
  errors, seen = [], []
  started, ran, traced = threading.Event(), threading.Event(), threading.Event()

  def other_thread():
    started.wait(60)  # polyjit is inside its first trace: the swaps are installed
    seen.append(hasattr(jnp.searchsorted, "_polyjit_spelling") and not jc.spellings_active())
    # The replacements equal JAX wherever JAX works, so the plain results alone
    # cannot show a leak; JAX's own refusal at a symbolic size can.
    n, = jax.export.symbolic_shape("n")
    try:
      jax.make_jaxpr(jnp.searchsorted)(jax.ShapeDtypeStruct((n,), jnp.float32),
                                       jax.ShapeDtypeStruct((3,), jnp.float32))
      seen.append("replacement leaked into this thread")
    except Exception:
      pass
    _plain_jax_checks(1, errors)
    ran.set()
    # plain JAX keeps running for as long as polyjit traces (and a few rounds
    # at least), instead of a fixed number of rounds that could end before
    # the traces do, or run on long after them
    rounds = 0
    while not errors and (rounds < 3 or not traced.is_set()):
      _plain_jax_checks(1, errors)
      rounds += 1

  def masked(x):
    if not started.is_set():
      started.set()
      ran.wait(60)
    y = jnp.where(x > 0, x, 0.0)
    idx = jnp.searchsorted(jnp.sort(x), 0.0)
    return jnp.sum(x[x > 0]) + y.sum() + idx + jax.lax.fori_loop(0, x.shape[0], lambda i, c: c + 1.0, 0.0)

  thread = threading.Thread(target=other_thread)
  thread.start()
  try:
    for n in (3, 4, 7, 11):  # a fresh pj.jit each: four traces
      x = np.linspace(-1.0, 1.0, n, dtype=np.float32)
      jf = pj.jit(masked, polymorphic_shapes=["n"])
      want = x[x > 0].sum() * 2 + np.searchsorted(np.sort(x), 0.0) + n
      np.testing.assert_allclose(jf(x), want, rtol=1e-6)
  finally:
    traced.set()
    thread.join()
  assert seen == [True]  # the other thread ran while the swaps were in place
  assert not errors, errors
  _plain_jax_checks(1, errors)  # and after
  assert not errors, errors
