"""A custom_jvp rule may return JAX's documented float0 tangent for an integer output.

Native mode's zero-padding facts (`_masking/native_zeros.py`) read the
literals of a rule's jaxpr; a float0 zero is a void-dtype literal that numpy
cannot compare with 0 ("Cannot compare structured or void to non-void
arrays"). Gradients are compared with `jax.grad` on the unpadded input, NaN
in the padding, eagerly, under jit and under pj.vmap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

FLOAT0_ZEROS = {
    "jnp_zeros": lambda i: jnp.zeros(i.shape, jax.dtypes.float0),
    "broadcast": lambda i: jnp.broadcast_to(np.zeros((), jax.dtypes.float0), i.shape),
    "zeros_like": lambda i: jnp.zeros_like(i, dtype=jax.dtypes.float0),
}


def _model(spelling):
  zeros = FLOAT0_ZEROS[spelling]

  @jax.custom_jvp
  def sin_and_floor(x):
    return jnp.sin(x), jnp.floor(x).astype(jnp.int32)

  @sin_and_floor.defjvp
  def _jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    y, i = sin_and_floor(x)
    return (y, i), (jnp.cos(x) * t, zeros(i))

  def fun(x, s):
    y, i = sin_and_floor(x * s)
    return jnp.sum(y * i)

  return fun


@pytest.mark.parametrize("spelling", list(FLOAT0_ZEROS))
def test_float0_tangent_of_an_integer_output(spelling):
  fun = _model(spelling)
  masked = pj.mask(fun, ["n", None])
  rng = np.random.default_rng(0)
  s = np.float32(1.3)
  grad = jax.grad(lambda xp, s, n: masked([xp, s], {"n": n}), argnums=(0, 1))
  xs = []
  for n in (5, 8):
    x = (rng.random(n) * 4).astype(np.float32)
    xs.append(x)
    xp = np.full(8, np.nan, np.float32)
    xp[:n] = x
    want = jax.grad(fun, argnums=(0, 1))(x, s)
    for got in (grad(xp, s, n), jax.jit(grad)(xp, s, n)):
      np.testing.assert_allclose(got[0][:n], want[0], rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
  batch = pj.Ragged.from_list([jnp.asarray(x) for x in xs])
  got = jax.grad(lambda s: pj.vmap(fun, in_axes=(0, None))(batch, s).sum())(s)
  np.testing.assert_allclose(got, sum(jax.grad(fun, argnums=1)(x, s) for x in xs), rtol=1e-5)
