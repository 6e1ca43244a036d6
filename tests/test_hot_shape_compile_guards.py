"""What a hot shape's own program (`polyjit/_jit/hot_shapes.py`) does to the
compile guards and records after warm-up: a compile that happens later, in a
background thread, of `jax.jit(fun)` itself.

Each test here states the behaviour expected of a `pj.jit` function warmed up
on its shapes: the guards' promise that nothing compiles holds (a hot shape
buys after them), and a committed argument of a bought shape (the same call
signature as an uncommitted one) compiles nothing that escapes `pj.stats`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from call_paths import backend_compiles, buy_at_once, settle  # noqa: F401 (fixtures)


pytestmark = pytest.mark.usefixtures("buy_at_once")  # (buys at the first hot call)


def _warm(f: pj.JitFunction, xs: list[jax.Array]) -> None:
  for x in xs:  # every shape called once: its bucket compiled
    f(x)


def test_assert_max_compiles_zero_holds_after_warm_up() -> None:
  f = pj.jit(lambda x: jnp.tanh(x) * 2 - 0.5, buckets=pj.buckets.PowersOfTwo())
  xs = [jax.device_put(np.arange(n, dtype=np.float32)) for n in (5, 6, 7)]
  _warm(f, xs)
  with pj.assert_max_compiles(0):
    for _ in range(5):
      for x in xs:
        f(x)
    settle()
  assert all(p.exact_call is None for p in f._hot.values())  # (nothing bought meanwhile)
  for x in xs:  # after the block: the shapes buy
    f(x)
  settle()
  f(xs[0])
  settle()
  assert any(p.exact_call is not None for p in f._hot.values())


def test_watch_does_not_advise_pj_jit_for_a_pj_jit_function() -> None:
  f = pj.jit(lambda x: jnp.cos(x) * 2 + 0.5, buckets=pj.buckets.PowersOfTwo())
  xs = [jax.device_put(np.arange(n, dtype=np.float32)) for n in (5, 6, 7)]
  _warm(f, xs)
  with pj.watch() as report:
    for _ in range(5):
      for x in xs:
        f(x)
    settle()
  assert "use pj.jit" not in str(report), str(report)


def test_committed_argument_after_buying_compiles_nothing_unrecorded() -> None:
  fun = lambda x: jnp.cumsum(x) * 1.75  # noqa: E731
  f = pj.jit(fun, buckets=pj.buckets.PowersOfTwo())
  x5, x6 = (jax.device_put(np.arange(n, dtype=np.float32)) for n in (5, 6))
  f(x5)
  for _ in range(50):
    f(x6)
    settle()
    if any(p.exact_call is not None for p in f._hot.values()):
      break
  assert any(p.exact_call is not None for p in f._hot.values())
  committed = jax.device_put(np.arange(6, dtype=np.float32), jax.devices()[0])
  assert committed.committed and not x6.committed and committed.aval == x6.aval
  want = np.asarray(jax.jit(fun)(committed))
  compiles, recorded = backend_compiles(), pj.stats(f).compiles
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(f(committed)), want)
  settle()
  assert pj.stats(f).compiles - recorded == backend_compiles() - compiles
