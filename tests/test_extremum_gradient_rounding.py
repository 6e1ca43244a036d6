"""An extremum's gradient does not depend on how XLA rounds its operand.

The derivative of a max divides the tangent among the positions that reach
it. Found as `x == max`, the comparison read `x` computed again in another
fused loop than the reduction's, where XLA rounded it differently (a
multiply-add contracted in one loop and not in the other): in a jitted
`pj.vmap` training step of `jnp.sum(jnp.max(x[:, None] + x[None, :] * s,
axis=0))` no position, or not the one counted, equalled the maximum, and the
gradient was NaN, inf, or missing terms. Compared with `jax.grad` of the
unpadded examples in float64 (the float32 gradients differ from it by
rounding only), with random values (no ties) and small integers (many ties).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def loss(s, x):
  return jnp.sum(jnp.max(x[:, None] + x[None, :] * s, axis=0))


def min_loss(s, x):
  return jnp.sum(jnp.min(x[:, None] * s - x[None, :], axis=1) ** 2)


def _examples(kind):
  rng = np.random.default_rng(5)
  lengths = (33, 30, 16, 6)
  if kind == "ties":
    return [rng.integers(-3, 4, n).astype(np.float32) for n in lengths]
  return [rng.uniform(-1, 1, n).astype(np.float32) for n in lengths]


def _want(f, s, examples, argnums):
  with jax.enable_x64():
    got = jax.grad(f, argnums=argnums)(np.float64(s), np.asarray(examples, np.float64))
    return jax.tree.map(np.asarray, got)


@pytest.mark.parametrize("f", [loss, min_loss])
@pytest.mark.parametrize("kind", ["random", "ties"])
def test_jitted_ragged_training_step(f, kind):
  examples = _examples(kind)
  batch = pj.Ragged.from_list(examples)   # (zero padding, to 64)
  step = jax.jit(jax.grad(lambda s, b: pj.vmap(f, in_axes=(None, 0))(s, b).sum()))
  for s in (0.3, -1.25, 0.7):
    want = sum(_want(f, s, x, 0) for x in examples)
    np.testing.assert_allclose(step(np.float32(s), batch), want, rtol=1e-4)


@pytest.mark.parametrize("kind", ["random", "ties"])
def test_jitted_vmap_of_mask_gradients_per_example(kind):
  examples = _examples(kind)
  padded = np.zeros((len(examples), 64), np.float32)
  for row, x in zip(padded, examples, strict=True):
    row[:len(x)] = x
  lengths = np.array([len(x) for x in examples], np.int32)
  masked = pj.mask(loss, [None, "n"], constraints=["n >= 1"])
  grads = jax.jit(jax.vmap(jax.grad(lambda s, x, n: masked([s, x], {"n": n}), argnums=(0, 1)),
                           in_axes=(None, 0, 0)))
  s = 0.3
  got_s, got_x = grads(np.float32(s), padded, lengths)
  for gs, gx, x in zip(np.asarray(got_s), np.asarray(got_x), examples, strict=True):
    want_s, want_x = _want(loss, s, x, (0, 1))
    np.testing.assert_allclose(gs, want_s, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx[:len(x)], want_x, rtol=1e-4, atol=1e-5)
    assert np.all(gx[len(x):] == 0)
