"""Attention whose softmax saturates (one weight 1, the others 0): its gradient on packed rows.

With large scores (`q @ k.T` of inputs in the thousands) each query's softmax
is one-hot, and JAX's derivative of `softmax(s) @ v` with respect to the
scores, `p * (g - sum(p * g))` with `g = ct @ v.T`, is exactly 0: the one
`p` that is 1 takes the same `g` twice. The packed product must give that
same gradient, not the rounding difference of two ways to compute `sum(p * g)`
(`ct . (p @ v)` per token against `g` per pair), which the key's
derivative `ct_s @ k` then multiplies by the keys: 8% of the gradient at
inputs of 1e3, a million times it at 1e6, inf and NaN at larger ones. At
1e15 the scores overflow for each example alone as well: the gradient must
still be what JAX gives it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def _attend(w, x):
  q = x @ w
  k = x[:, ::-1] @ w
  return jax.nn.softmax(q @ k.T, axis=-1) @ x


def _token_grads(xs, w, row_length):
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=row_length))
  attend = pj.vmap(_attend, in_axes=(None, 0))

  def loss(data):
    out = attend(w, pj.PackedRagged(data, packed.lengths, packed.starts, packed.segments,
                                    packed.positions, packed.nonempty))
    return jnp.sum(jnp.where(out._mask_like(out.data), out.data, 0.0) ** 2)

  grad = jax.jit(jax.grad(loss))(packed.data)
  return pj.PackedRagged(grad, packed.lengths, packed.starts, packed.segments,
                         packed.positions, packed.nonempty).to_list()


@pytest.mark.parametrize("scale", [1e3, 1e6, 1e15])
def test_saturated_softmax_gradient_is_each_examples_own(scale):
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = [(rng.normal(size=(n, 3)) * scale).astype(np.float32) for n in [3, 5, 2, 4]]
  alone = jax.jit(lambda w, xs: [jax.grad(lambda x: jnp.sum(_attend(w, x) ** 2))(x)
                                 for x in xs])(w, [jnp.asarray(x) for x in xs])
  for row_length in (16, 8):   # (each example alone in a row, and several per row)
    grads = _token_grads(xs[:1] if row_length == 16 else xs, w, row_length)
    for got, want in zip(grads, alone):
      want = np.asarray(want)
      assert np.all(np.isfinite(want))
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.max(np.abs(want)))
