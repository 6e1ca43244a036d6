"""A size comparison asked by JAX's own derivative rule is refused with a MaskingError.

`jnp.linalg.qr`'s derivative branches on `m < n` (wide or tall matrices).
For x of shape (n, 3) the forward pass asks nothing, so its trace did not
choose a side; the gradient's trace, which serves every size, cannot either.
JAX's raw InconclusiveDimensionOperation escaped before; now a MaskingError
names the rule, the jnp function and the constraint that decides it, and
that constraint gives JAX's gradient on the unpadded input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

pytestmark = pytest.mark.filterwarnings("ignore::polyjit.PerformanceWarning")


def fun(x):
  return jnp.sum(jnp.sin(jnp.linalg.qr(x)[1]))


def _padded(x, rows=8):
  xp = np.full((rows, x.shape[1]), np.nan, np.float32)
  xp[:len(x)] = x
  return xp


def _check_refusal(info):
  text = str(info.value)
  assert "qr_jvp_rule" in text and "jnp.linalg.qr" in text, text
  assert 'constraints=["n >= 3"]' in text, text


def test_grad_of_mask_refuses_the_rule_s_size_comparison():
  x = np.random.default_rng(0).random((5, 3)).astype(np.float32)
  masked = pj.mask(fun, ["(n, _)"])
  with pytest.raises(pj.MaskingError) as info:
    jax.grad(lambda xp: masked([xp], {"n": 5}))(_padded(x))
  _check_refusal(info)


def test_grad_of_vmap_refuses_the_rule_s_size_comparison():
  rng = np.random.default_rng(1)
  batch = pj.Ragged.from_list([jnp.asarray(rng.random((n, 3)), jnp.float32) for n in (5, 4)])
  with pytest.raises(pj.MaskingError) as info:
    jax.grad(lambda s: pj.vmap(lambda x: fun(x * s))(batch).sum())(np.float32(1.5))
  assert "qr_jvp_rule" in str(info.value)


def test_the_constraint_it_names_gives_jax_s_gradient():
  rng = np.random.default_rng(2)
  masked = pj.mask(fun, ["(n, _)"], constraints=["n >= 3"])
  grad = jax.grad(lambda xp, n: masked([xp], {"n": n}))
  for n in (5, 3, 8):
    x = rng.random((n, 3)).astype(np.float32)
    want = jax.grad(fun)(x)
    for got in (grad(_padded(x), n), jax.jit(grad)(_padded(x), n)):
      np.testing.assert_allclose(got[:n], want, rtol=2e-4, atol=2e-5)
