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
