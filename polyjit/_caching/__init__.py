"""Compiled programs: built once, kept in memory and on disk, and counted.

`executables` is the thread-safe compile-once cache, `disk` the warm on-disk cache
(JAX persistent cache and remembered buckets), `compiles` counts compiles with
`jax.monitoring`.
"""
