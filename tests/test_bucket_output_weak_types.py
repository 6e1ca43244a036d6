"""A bucketed call's outputs have `jax.jit`'s weak types: `x_int32 * 2.5` is a
weakly typed float32 under `jax.jit`, so that `out + bf16` stays bfloat16. An
output with a dynamic dim, cut from its padded buffer (on the host or by a
slice program on the device), keeps it on both call paths: else the same
call's result dtype in later arithmetic would change once its shapes buy their
own program (`_jit/hot_shapes.py`: `jax.jit` itself)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jit import resident
from call_paths import path  # noqa: F401 (fixtures)


def test_dynamic_output_keeps_weak_type(path: str) -> None:
  fun = lambda x, s: x * s  # noqa: E731  (int32 * Python float: weak float32)
  f = pj.jit(fun, buckets=pj.buckets.PowersOfTwo())
  for n in (5, 7, 6):
    x = jax.device_put(np.arange(n, dtype=np.int32))
    got, want = f(x, 2.5), jax.jit(fun)(x, 2.5)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type), n
    bf16 = jnp.ones(n, jnp.bfloat16)
    assert (got + bf16).dtype == (want + bf16).dtype, n


def test_sliced_on_the_device_keeps_weak_type(monkeypatch: pytest.MonkeyPatch) -> None:
  # (the accelerator path's slice program, compiled at a shape's second call)
  monkeypatch.setenv("POLYJIT_INLINE_CPU", "0")
  monkeypatch.setattr(resident, "RENT", 0.0)
  resident.forget()
  fun = lambda x, s: x * s  # noqa: E731
  f = pj.jit(fun, buckets=pj.buckets.PowersOfTwo())
  for n in (5, 7, 6):
    x = jax.device_put(np.arange(n, dtype=np.int32))
    want = jax.jit(fun)(x, 2.5)
    for _ in range(3):
      got = f(x, 2.5)
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
      assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type), n
  assert resident._slices  # (the device slice programs did run)
  resident.forget()
