"""Programs `pj.jit` compiles in a thread are lowered under the caller's configuration.

JAX keeps a context manager's configuration (`with jax.enable_x64():`,
`jax.numpy_rank_promotion(...)`, ...) per thread. `pj.jit` traces on the
calling thread, but lowers and compiles some programs in a thread pool:
`precompile`, `background_compile=True` (a new bucket runs on a larger one
while its own compiles), a cost-aware bucket bought once its waste paid for
it. Lowered there under the global configuration, a program traced under
`jax.enable_x64()` failed to lower (float32 and float64 operands: precompile
raised JAX's TypeError; a background compile failed silently, and the calls
stayed in the larger bucket for good). Each test compares with `jax.jit`
under the same context manager and counts compiles with `jax.monitoring`
(`pj.diagnostics.count_compiles`).
"""

from __future__ import annotations

import concurrent.futures
import threading

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj

X = np.linspace(0.5, 9.5, 400)   # float64: float64 programs under x64


def scaled_cumsum(x):
  return jnp.cumsum(x) * 2 + jnp.arange(x.shape[0]) + jnp.sum(x.shape[0] * x)


def assert_like_jax_jit(got, n):
  want = jax.jit(scaled_cumsum)(X[:n])
  assert got.dtype == want.dtype == np.float64
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


def test_precompile_under_x64_context_manager():
  f = pj.jit(scaled_cumsum, polymorphic_shapes=["n"], buckets=[128, 512])
  with jax.enable_x64():
    assert f.precompile(X[:100], sizes={"n": [100]}, progress=False) == [{"n": 128}]
    with pj.diagnostics.count_compiles() as events:
      out = f(X[:100])
    assert len(events) == 0   # the precompiled program serves the call
    assert_like_jax_jit(out, 100)


def test_background_compile_under_x64_context_manager():
  f = pj.jit(scaled_cumsum, polymorphic_shapes=["n"], buckets=[128, 512],
             background_compile=True)
  with jax.enable_x64():
    assert_like_jax_jit(f(X), 400)
    assert_like_jax_jit(f(X[:100]), 100)   # runs on 512 while 128 compiles in a thread
    concurrent.futures.wait([f._cache.peek(k) for k in f._cache.keys()])
    assert_like_jax_jit(f(X[:100]), 100)
  assert pj.stats(f).buckets.get((("n", 128),)) == 1   # the last call ran in its own bucket


def test_background_compile_queued_before_a_global_config_update():
  # A compile that starts after `jax.config.update` changed a global option
  # is still lowered under the options of the call that queued it: its key
  # holds that call's trace context. (It was lowered under x64 on for a call
  # under x64 off, and the next call under x64 off raised JAX's TypeError,
  # "Argument types differ from the types for which this computation was
  # compiled".) The pool's threads are held busy so that the compile starts
  # after the update, as it does behind other compiles.
  f = pj.jit(scaled_cumsum, polymorphic_shapes=["n"], buckets=[128, 512],
             background_compile=True)
  x = X.astype(np.float32)
  f(x)   # 512, compiled here
  gate = threading.Event()
  pool = f._cache._executor()
  busy = [pool.submit(gate.wait) for _ in range(pool._max_workers)]
  try:
    f(x[:100])   # runs on 512; 128 is queued behind the busy threads
    jax.config.update("jax_enable_x64", True)
  finally:
    gate.set()
  try:
    concurrent.futures.wait(busy + [f._cache.peek(k) for k in f._cache.keys()])
  finally:
    jax.config.update("jax_enable_x64", False)
  got = f(x[:100])
  want = jax.jit(scaled_cumsum)(x[:100])
  assert got.dtype == want.dtype == np.float32
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)
  assert pj.stats(f).buckets.get((("n", 128),)) == 1   # the last call ran in its own bucket
