"""Native mode judges a constant factor by the value the program computes with.

`native.wrap_plan` leaves a cotangent unwrapped through `mul`/`div` by a finite
nonzero literal. A literal may hold a Python float that its dtype cannot hold:
`lax.mul(x, 1e300)` on float32 multiplies by inf, `lax.div(x, 1e-46)` divides
by 0, and XLA on CPU flushes a subnormal divisor (1e-45) to 0. Judged by the
Python float, the padding's zero cotangent became 0 * inf = NaN and reached a
broadcast parameter's gradient (NaN where JAX gives inf).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

MODELS = {
    "mul_overflowing_literal": lambda p, x: jnp.sum(lax.mul(x + p, 1e300)),
    "div_underflowing_literal": lambda p, x: jnp.sum(lax.div(x + p, 1e-46)),
    "div_subnormal_literal": lambda p, x: jnp.sum(lax.div(x + p, 1e-45)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_padding_cotangent_stays_zero_through_nonfinite_factors(name):
  f = MODELS[name]
  p = jnp.asarray([0.1, 0.2, 0.3], jnp.float32)
  x = np.full((8, 3), np.nan, np.float32)
  x[:3] = np.arange(1.0, 10.0).reshape(3, 3)
  masked = pj.mask(f, [None, "(n, _)"])
  want = jax.grad(f)(p, jnp.asarray(x[:3]))
  got = jax.grad(lambda p: masked([p, x], {"n": 3}))(p)
  np.testing.assert_array_equal(got, want)
  got = jax.jit(jax.grad(lambda p, n: masked([p, x], {"n": n})))(p, 3)
  np.testing.assert_array_equal(got, want)
