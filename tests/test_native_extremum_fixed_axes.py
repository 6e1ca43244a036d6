"""Native mode: a max/min over fixed axes of a padded value keeps its wrap.

JAX's own derivative of `reduce_max` over axes that hold no padding divides by
the count of positions equal to the maximum; in a padding row holding NaN that
count is 0, and 0/0 = NaN lands in the padding of the reduction's input. A
broadcast parameter's transpose (a sum over rows) then carries it into the
parameter's gradient unless the broadcast's output is wrapped, so
`native.wrap_plan` must not treat that cotangent as clean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

PADDED = 8


def _examples():
  rng = np.random.default_rng(0)
  return [rng.standard_normal((n, 3)).astype(np.float32) for n in (3, 1, 6)]


def _padded(x, fill):
  out = np.full((PADDED, 3), fill, np.float32)
  out[:len(x)] = x
  return out


MODELS = {
    "max_rows": lambda p, x: jnp.sum(jnp.max(x + p, axis=1)),
    "min_rows": lambda p, x: jnp.sum(jnp.min(x - p, axis=1)),
    "relu_of_max_rows": lambda p, x: jnp.sum(jax.nn.relu(jnp.max(x * 2.0 + p, axis=1))),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("fill", [np.nan, np.inf, -np.inf])
def test_max_over_fixed_axes_gradient_is_exact(name, fill):
  f = MODELS[name]
  p = jnp.asarray([0.1, -0.2, 0.3], jnp.float32)
  masked = pj.mask(f, [None, "(n, _)"])
  examples = _examples()
  for x in examples:
    n = len(x)
    want_p, want_x = jax.grad(f, argnums=(0, 1))(p, jnp.asarray(x))
    step = jax.jit(jax.grad(lambda p, xp, n: masked([p, xp], {"n": n}), argnums=(0, 1)))
    concrete = jax.grad(lambda p, xp: masked([p, xp], {"n": n}), argnums=(0, 1))
    for got_p, got_x in (step(p, _padded(x, fill), n), concrete(p, _padded(x, fill))):
      np.testing.assert_allclose(got_p, want_p, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(np.asarray(got_x)[:n], want_x, rtol=1e-5, atol=1e-6)
      assert np.all(np.asarray(got_x)[n:] == 0)
  batch = pj.Ragged(jnp.asarray(np.stack([_padded(x, fill) for x in examples])),
                    jnp.asarray([len(x) for x in examples], jnp.int32))
  got = jax.jit(jax.grad(lambda p: pj.vmap(f, in_axes=(None, 0))(p, batch).sum()))(p)
  want = sum(jax.grad(f)(p, jnp.asarray(x)) for x in examples)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
