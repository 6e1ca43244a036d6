"""Host buffers of every dtype pj.jit pads, at sizes where they are aligned.

A padded argument of `ALIGN_FROM` bytes or more is an aligned view of a larger
block (`_masking/padding.py: host_buffer`). The address of that block was
once taken with `ctypes.c_char.from_buffer` on a block of the argument's
dtype, which NumPy's buffer protocol cannot describe for bfloat16 or the
float8 types: such an argument of a large bucket raised `ValueError: cannot
include dtype 'E' in a buffer` instead of running.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import polyjit as pj
from polyjit._masking.padding import ALIGN, ALIGN_FROM, host_buffer

DTYPES = [jnp.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.float16,
          np.float32, np.complex128, np.int8, np.uint16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(ALIGN_FROM + 5,), (ALIGN_FROM // 64 + 1, 65)])
def test_large_host_buffers_of_every_dtype_are_aligned(dtype, shape):
  dtype = np.dtype(dtype)
  for _ in range(3):  # (malloc's alignment varies between blocks)
    buf = host_buffer(shape, dtype)
    assert buf.shape == shape and buf.dtype == dtype and buf.flags.c_contiguous
    assert buf.flags.writeable and buf.ctypes.data % ALIGN == 0


@pytest.mark.parametrize("dtype", [jnp.bfloat16, ml_dtypes.float8_e5m2, np.float16])
def test_low_precision_arguments_of_a_large_bucket_run_exactly(dtype):
  def fun(x):
    return jnp.max(x), jnp.sort(x)[:4], jnp.argmin(x), x * 2

  bucket = ALIGN_FROM  # elements: at least ALIGN_FROM bytes for every dtype here
  f = pj.jit(fun, polymorphic_shapes=["n"], buckets=[bucket])
  ref = jax.jit(fun)
  data = np.random.default_rng(0).standard_normal(bucket).astype(dtype)
  for n in [bucket - 1, bucket // 2 + 3, bucket]:
    got, want = f(data[:n]), ref(data[:n])
    for g, w in zip(got, want, strict=True):
      assert g.dtype == w.dtype and g.shape == w.shape
      np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
