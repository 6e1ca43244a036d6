"""A hot shape's own program (`polyjit/_jit/hot_shapes.py`) is a compile like
any other: `pj.stats` records it with the events `jax.monitoring` reported for
it, whatever the function's name (a `functools.partial` or a callable object
has none of its own; JAX names their programs its own way), on both call
paths."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from call_paths import buy_at_once, backend_compiles, bought, path, settle  # noqa: F401 (fixtures)


def _scaled_cumsum(x, k):
  return jnp.cumsum(x) * k + 0.25  # (a body no other test compiles: nothing cached)

pytestmark = pytest.mark.usefixtures("buy_at_once")  # (buys at the first hot call)


class _Scaler:
  def __call__(self, x):
    return jnp.cumsum(x) * 3.5 - 0.125


@pytest.mark.parametrize("kind", ["partial", "callable object"])
def test_hot_shape_compile_is_in_stats_as_jax_monitoring_counts_it(path: str, kind: str) -> None:
  fun = (functools.partial(_scaled_cumsum, k=1.5 if path == "defaults" else 2.5)
         if kind == "partial" else _Scaler())
  f = pj.jit(fun, buckets=pj.buckets.PowersOfTwo())
  x5, x6 = (jax.device_put(np.arange(n, dtype=np.float32) + (path == "defaults")) for n in (5, 6))
  f(x5)
  f(x6)  # the bucket
  compiles, recorded = backend_compiles(), pj.stats(f).compiles
  assert bought(f, x6)
  assert backend_compiles() - compiles == 1  # (its own program: not in jax.jit's caches before)
  assert pj.stats(f).compiles - recorded == backend_compiles() - compiles
  [event] = [e for e in f.stats.compile_events if e.cause.kind == "hot shape"]
  assert event.events == 1 and event.seconds > 0
  np.testing.assert_allclose(f(x6), jax.jit(fun)(x6), rtol=1e-6)
