"""A float64 jax.Array passed while jax_enable_x64 is off (made under
`jax.enable_x64(True)`) runs as jax.jit runs it.

jax.jit keeps such an array's dtype (its program takes float64; `jnp.sin`
stays float64, an identity returns float64). pj.jit crashed on its first call
("Argument types differ from the types for which this computation was
compiled") and then computed on a float32 padded copy (an identity returned
float32; `jnp.sin` differed in the last bit). Now such calls run jax.jit's own
program, with a warning that says why and what to do.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def _made_with_x64(n):
  with jax.enable_x64(True):
    return jnp.arange(n, dtype=jnp.float64) / 3 + 0.1


FUNS = {"sin": lambda x: jnp.sin(x) * 2, "identity": lambda x: x,
        "sum": lambda x: jnp.sum(x), "mixed": lambda x: x[1:] * jnp.float32(1.5)}


@pytest.mark.parametrize("name", sorted(FUNS))
def test_results_equal_jax_jit_in_dtype_and_bits(name):
  f = FUNS[name]
  want_f, got_f = jax.jit(f), pj.jit(f, fallback="silent")
  for n in (5, 7, 9, 5, 30):
    x = _made_with_x64(n)
    assert x.dtype == np.float64 and not jax.config.jax_enable_x64
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", UserWarning)   # JAX's own float64 notices
      want, got = want_f(x), got_f(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8), np.atleast_1d(want).view(np.uint8))


def test_the_call_is_announced_and_refused_under_fallback_error():
  x = _made_with_x64(5)
  with pytest.warns(pj.FallbackWarning, match="float64 jax.Array while jax_enable_x64 is off"):
    pj.jit(FUNS["identity"])(x)
  with pytest.raises(pj.MaskingError, match=r"x.astype\(jnp.float32\)"):
    pj.jit(FUNS["identity"], fallback="error")(x)


def test_arrays_of_the_mode_still_run_bucketed():
  f = pj.jit(FUNS["sin"])
  for n in (5, 7, 9):
    x = jnp.arange(n, dtype=jnp.float32)
    np.testing.assert_array_equal(f(x), jax.jit(FUNS["sin"])(x))
  assert f.stats.compiles < 3
