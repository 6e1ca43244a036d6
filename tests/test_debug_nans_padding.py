"""`jax_debug_nans` / `jax_debug_infs` and pj.jit's uninitialized padding.

Those flags check every output of a program, its padding included. pj.jit pads
arguments into uninitialized host buffers (`_masking/padding.py`), so where
the memory held NaN bit patterns (a freed array of -1, say) `x * 2` raised a
FloatingPointError now and then in a call that has no NaN at all. While the
flags are on, the padding is zeroed, as it always was before. Memory garbage
is made certain here by an `np.empty` that returns all-ones bytes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._masking import padding

_empty = np.empty


def nan_empty(shape, dtype=float, *args, **kwargs):
  out = _empty(shape, dtype, *args, **kwargs)
  if np.dtype(dtype).kind in "fcu":  # all-ones bytes: NaN for floats
    out.view(np.uint8)[...] = 0xFF
  return out


@pytest.mark.parametrize("flag", [jax.debug_nans, jax.debug_infs])
def test_padding_is_zero_while_jax_checks_for_nan(flag, monkeypatch):
  monkeypatch.setattr(np, "empty", nan_empty)
  for shape in [(7,), (padding.ALIGN_FROM // 4 + 3,), (5, 9)]:
    assert np.isnan(padding.host_buffer(shape, np.dtype(np.float32))).all()
    with flag(True):
      assert not padding.host_buffer(shape, np.dtype(np.float32)).any()


@pytest.mark.parametrize("bucket", [64, padding.ALIGN_FROM])
def test_debug_nans_sees_no_nan_from_padding(bucket, monkeypatch):
  def fun(x, w):
    return x * w, jnp.sum(x * w), jnp.cumsum(x)

  f = pj.jit(fun, polymorphic_shapes=["n", None], buckets=[bucket])
  ref = jax.jit(fun)
  monkeypatch.setattr(np, "empty", nan_empty)
  w = np.float32(2.0)
  with jax.debug_nans(True):
    for n in [5, 9, 31]:
      x = np.arange(1, n + 1, dtype=np.float32)
      for g, r in zip(f(x, w), ref(x, w), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
