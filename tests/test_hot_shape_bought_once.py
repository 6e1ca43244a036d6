"""A plan buys its shapes' own program once (`polyjit/_jit/hot_shapes.py`),
even where other call signatures lead to the same plan while that program
compiles (a NumPy array of a `jax.Array`'s shape and dtype: another hot key,
the same structure and shapes): one "hot shape" compile in `pj.stats`, on
both call paths."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jit import hot_shapes
from call_paths import buy_at_once, path, settle  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("buy_at_once")  # (buys at the first hot call)


def test_plan_found_by_another_signature_while_compiling_buys_once(path: str) -> None:
  def fun(x):
    return jnp.cumsum(x) * 1.25 - 0.5

  f = pj.jit(fun, buckets=pj.buckets.PowersOfTwo())
  x5, x6 = (jax.device_put(np.arange(n, dtype=np.float32)) for n in (5, 6))
  host6 = np.arange(6, dtype=np.float32)
  want = np.cumsum(host6) * np.float32(1.25) - np.float32(0.5)  # (exact in float32)
  f(x5)
  f(x6)  # the bucket's plan for these shapes
  gate = threading.Event()
  hot_shapes._executor().submit(gate.wait)  # (holds the compile thread: the buy stays pending)
  try:
    f(x6)  # a hot call: buys, its compile queued
    for _ in range(3):
      np.testing.assert_array_equal(np.asarray(f(host6)), want)
  finally:
    gate.set()
  settle()
  bought = [e for e in f.stats.compile_events if e.cause.kind == "hot shape"]
  assert len(bought) == 1, [(e.cause.kind, e.events) for e in f.stats.compile_events]
  for x in (x6, host6):
    np.testing.assert_array_equal(np.asarray(f(x)), want)
