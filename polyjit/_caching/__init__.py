"""Compiled programs: built once, kept in memory and on disk, and counted.

`executables` is the thread-safe compile-once cache, `disk` the warm on-disk cache
(polyjit's own serialized programs and remembered buckets; no JAX setting is
changed), `compiles` counts compiles (with `jax.monitoring`) and loads, `probe_memo`
keeps which JAX probes passed for a second process.
"""
from . import probe_memo as probe_memo  # (registers itself with the JAX boundary)
