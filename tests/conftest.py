"""The test suite never writes to the user's cache directory, and compile counts
are never changed by programs a previous run left on disk: polyjit's default
on-disk cache is off here (`tests/test_disk_cache.py` turns it on, in temporary
directories and fresh processes).

On a GPU, float32 matrix products run in TF32 by default, and a padded product
rounds differently from the unpadded reference (relative differences of 1e-3
were seen on an H100): the tests compare at full float32 precision there.

On the CPU, every program is compiled at XLA's backend optimization level 0
(`_compile_at_backend_level_0` says why that is sound; a sample runs at XLA's
defaults in tests/test_default_xla_options.py)."""

import os

import pytest

os.environ["POLYJIT_NO_CACHE"] = "1"
# (before JAX starts: the variable is read when jax is imported)
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

#: The suite's XLA option, appended to XLA_FLAGS (the user's flags kept) unless
#: POLYJIT_TEST_XLA_DEFAULTS is set (tests/test_default_xla_options.py runs a
#: sample of the suite that way, in a fresh process).
BACKEND_LEVEL_0 = "--xla_backend_optimization_level=0"


def _compile_at_backend_level_0():
  """Every program of the session (the masked ones and the references) is
  compiled at XLA's backend optimization level 0: LLVM's O0 pipeline and code
  generator in place of O3 (a third less backend compile time on the larger
  masked programs of the rule tables; compiling is most of a test's time).

  Why the checks keep their meaning: XLA:CPU reads the level only where it
  builds LLVM's pass pipeline and code generator (IrCompiler::
  GetCodeGenOptLevel, openxla/xla xla/backends/cpu/codegen/ir_compiler.cc);
  XLA's HLO passes (fusion, algebraic simplification, layouts) run as before:
  the optimized HLO of the rule tables' masked programs, compile().as_text(),
  is the same text at both levels. No fast-math flag is set at either level,
  so every operation is IEEE arithmetic. What differs is rounding: XLA marks
  floating-point arithmetic contractible and O3's code generator fuses a
  product and a sum into one multiply-add (one rounding) where O0 rounds
  twice. Over the rule tables (252 cases, value and gradient), 32 cases'
  results moved, by about 1e-7 of their scale, none between finite and not:
  inside every tolerance, while a wrong value, a NaN from the padding or a
  nonzero gradient in the padding shows the same at both levels. Where a test
  compares polyjit's program with jax.jit's bit for bit, both sides are
  compiled at the same level. The default compiler stays covered:
  tests/test_default_xla_options.py runs a sample (rule-table rows, a packed
  model, bit-for-bit checks) at XLA's defaults in a subprocess.

  Set here, before JAX's CPU backend reads XLA_FLAGS (on its first use, not
  at import): pytest-xdist's workers inherit the environment and import this
  file too."""
  if os.environ.get("POLYJIT_TEST_XLA_DEFAULTS"):
    return
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_backend_optimization_level" not in flags:   # the user's own level wins
    os.environ["XLA_FLAGS"] = f"{flags} {BACKEND_LEVEL_0}".strip()


_compile_at_backend_level_0()


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "heavy: a test that keeps one worker busy for a long time (a subprocess "
      "that starts JAX and compiles a benchmark, another JAX, mypy); run first")
  config.addinivalue_line(
      "markers", "xla_defaults: compares two differently built programs bit for bit where "
      "the bits depend on LLVM's rounding (a multiply-add fused or not, a loop that runs to "
      "a fixed point): runs at XLA's default options only, in tests/test_default_xla_options.py's "
      "subprocess; skipped in a session at level 0")


def at_level_0() -> bool:
  """Whether this session compiles at backend optimization level 0."""
  return BACKEND_LEVEL_0 in os.environ.get("XLA_FLAGS", "").split()


def pytest_collection_modifyitems(config, items):
  """Tests marked `heavy` run first. Under `-n 2` (pytest-xdist's `load`
  scheduling) each worker gets its next tests in advance, in collection order:
  a test of minutes sent late keeps one worker busy after the other has run
  out of tests; sent first, it runs while the other worker takes the rest of
  the queue, and both finish with small tests. The rest keep their order.

  Tests marked `xla_defaults` are skipped at level 0: they run at XLA's
  defaults in tests/test_default_xla_options.py's subprocess."""
  items.sort(key=lambda item: item.get_closest_marker("heavy") is None)
  if at_level_0():
    skip = pytest.mark.skip(reason="bit for bit at XLA's default options: run by "
                            "tests/test_default_xla_options.py in a subprocess")
    for item in items:
      if item.get_closest_marker("xla_defaults"):
        item.add_marker(skip)
