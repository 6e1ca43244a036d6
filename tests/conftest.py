"""The test suite never writes to the user's cache directory, and compile counts
are never changed by programs a previous run left on disk: polyjit's default
on-disk cache is off here (`tests/test_disk_cache.py` turns it on, in temporary
directories and fresh processes).

On a GPU, float32 matrix products run in TF32 by default, and a padded product
rounds differently from the unpadded reference (relative differences of 1e-3
were seen on an H100): the tests compare at full float32 precision there."""

import os

os.environ["POLYJIT_NO_CACHE"] = "1"
# (before JAX starts: the variable is read when jax is imported)
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "heavy: a test that keeps one worker busy for a long time (a subprocess "
      "that starts JAX and compiles a benchmark, another JAX, mypy); run first")


def pytest_collection_modifyitems(config, items):
  """Tests marked `heavy` run first. Under `-n 2` (pytest-xdist's `load`
  scheduling) each worker gets its next tests in advance, in collection order:
  a test of minutes sent late keeps one worker busy after the other has run
  out of tests; sent first, it runs while the other worker takes the rest of
  the queue, and both finish with small tests. The rest keep their order."""
  items.sort(key=lambda item: item.get_closest_marker("heavy") is None)
