"""The test suite never writes to the user's cache directory, and compile counts
are never changed by programs a previous run left on disk: polyjit's default
on-disk cache is off here (`tests/test_disk_cache.py` turns it on, in temporary
directories and fresh processes)."""

import os

os.environ["POLYJIT_NO_CACHE"] = "1"
