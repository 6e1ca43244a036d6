"""An output pj.vmap cannot return over a packed batch: its error, no warning.

An output whose length-dependent axis follows a fixed one (`x.T` of an
`(n, 3)` example) cannot come back as a `pj.Ragged` (whose varying axes come
first): the padded `pj.vmap` raises a ShapeError naming it. Over a packed
batch the same call warned that it ran unpacked (a `pj.PerformanceWarning`:
the packed evaluation refused the output) and then raised that error from
the unpacked run; the warning was misleading. Now the packed call raises the
padded call's error, before running anything, and warns of nothing.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def _examples():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in (5, 3, 7)]
  return [jnp.asarray(x) for x in xs]


def _error(fun, batch, *, jit):
  call = pj.vmap(fun)
  if jit:
    call = jax.jit(call)
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    with pytest.raises(pj.ShapeError) as e:
      call(batch)
  return e.value, [w for w in seen if issubclass(w.category, pj.PerformanceWarning)]


@pytest.mark.parametrize("jit", [False, True])
def test_transposed_output_raises_without_a_performance_warning(jit):
  fun = lambda x: (jnp.sum(x), x.T)
  packed = pj.Ragged.from_list(_examples(), packing=pj.Packing(row_length=16))
  error, warned = _error(fun, packed, jit=jit)
  assert not warned, [str(w.message) for w in warned]
  assert "output 1" in str(error) and "float32[3,n0_0]" in str(error)
  # the padded batch's error, word for word
  padded, _ = _error(fun, pj.Ragged.from_list(_examples()), jit=jit)
  assert str(error) == str(padded)
