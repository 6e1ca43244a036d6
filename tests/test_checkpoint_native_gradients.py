"""`jax.checkpoint` (`nn.remat`) inside a padded `pj.vmap`: gradients with respect
to shared parameters are one batched program that keeps the checkpoint.

`remat2` had no native-safe masking rule (`_masking/native.py`), so a model
with a checkpointed layer had its shared parameters' gradient built one
example at a time (a PerformanceWarning), and the gradient program lost the
checkpoint (what the policy does not save was kept, not recomputed). It is
now judged by its body and bound again over the body masked in native mode,
as a scan is. Checked against each example alone under `jax.jit`, with NaN
in the padding, for several bodies and policies, and through `nn.remat`.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.flatten_util import ravel_pytree

import polyjit as pj
from harness import nan_padded
from test_packing_checkpoint import POLICIES, _Block

LENGTHS = (2, 5, 9, 1, 16)


def _block(w, x):
  h = checkpoint_name(jnp.tanh(x @ w), "h")
  return jax.nn.softmax(h @ h.T) @ h + x


BODIES = {
    "tokens": lambda w, x: jnp.tanh(x @ w) @ w.T + x,
    "attention": _block,
    "reduction_inside": lambda w, x: jnp.sum(jnp.tanh(x @ w), axis=0) * x,
}


def _check(fun, w, xs):
  batch = pj.Ragged(np.stack([nan_padded(x, 16) for x in xs]), np.array([len(x) for x in xs]))
  loss = lambda w, x: jnp.sum(fun(w, x) ** 2)  # noqa: E731
  run = lambda w: jnp.sum(pj.vmap(loss, in_axes=(None, 0))(w, batch))  # noqa: E731
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)   # (one batched gradient)
    value, grad = jax.jit(jax.value_and_grad(run))(w)
  want = jax.jit(lambda w, xs: [jax.value_and_grad(loss)(w, x) for x in xs])(w, list(xs))
  np.testing.assert_allclose(value, sum(v for v, _ in want), rtol=1e-5)
  want_grad = jax.tree.map(lambda *g: sum(g), *[g for _, g in want])
  for g, r in zip(jax.tree.leaves(grad), jax.tree.leaves(want_grad), strict=True):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("body", sorted(BODIES))
def test_checkpointed_body_gradient_is_batched_and_exact(body, policy):
  rng = np.random.default_rng(7)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  _check(jax.checkpoint(BODIES[body], policy=POLICIES[policy]), w, xs)


def test_the_gradient_still_recomputes():
  """The batched gradient program computes the checkpointed `sin` twice (forward and
  again in the backward pass), as the example alone's does."""
  rng = np.random.default_rng(8)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  model = lambda w, x: jnp.sum(jax.checkpoint(lambda w, x: jnp.tanh(jnp.sin(x @ w) @ w))(w, x))
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  batch = pj.Ragged(np.stack([nan_padded(x, 16) for x in xs]), np.array([len(x) for x in xs]))
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)
    grad = jax.make_jaxpr(jax.grad(
        lambda w: jnp.sum(pj.vmap(model, in_axes=(None, 0))(w, batch))))(w)
  alone = jax.make_jaxpr(jax.grad(lambda w: model(w, xs[0])))(w)
  assert str(alone).count("= sin ") == 2
  assert str(grad).count("= sin ") == 2


def test_flax_remat_block():
  block = nn.remat(_Block)()
  rng = np.random.default_rng(9)
  params = block.init(jax.random.PRNGKey(0), jnp.zeros((2, 3)))
  flat, unravel = ravel_pytree(params)   # (one array as the shared argument)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  _check(lambda w, x: block.apply(unravel(w), x), flat, xs)
