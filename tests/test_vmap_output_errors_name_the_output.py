"""pj.vmap's error for an output whose length-dependent axis follows a fixed
one names that output: "output 1 of the function", not "argument 1" (the
outputs' paths were described as the arguments' are), packed or not."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


@pytest.mark.parametrize("packing", [None, pj.Packing()])
def test_the_error_names_the_output(packing):
  xs = [np.ones((n, 2, 2), np.float32) for n in [3, 5]]
  batch = pj.Ragged.from_list(xs, packing=packing)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.PerformanceWarning)   # (packed: it runs unpacked first)
    with pytest.raises(pj.ShapeError, match=r"^output 1 of the function has shape "
                       r"float32\[2,2,n0_0\]: its axis 2"):
      pj.vmap(lambda x: (jnp.sum(x), jnp.swapaxes(x, 0, 2)))(batch)
