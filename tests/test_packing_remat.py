"""`jax.checkpoint` (rematerialisation) in a packed `pj.vmap`.

A training step that checkpoints its layers ran unpacked (the `remat2`
primitive had no packed rule: a PerformanceWarning, and none of packing's
savings). The checkpointed function is now evaluated packed inside a
`jax.checkpoint` of its own, with the user's policy, so the gradient
program still recomputes what the policy does not save. Checked against each
example alone under `jax.jit`, values and gradients, NaN and inf in the
rows' tails, attention inside the checkpoint included.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

import polyjit as pj
from test_packing import _check, _examples, _poison


def _block(w, x):
  h = checkpoint_name(jnp.tanh(x @ w), "h")
  n = x.shape[0]
  s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), h @ x.T, -jnp.inf)
  return jax.nn.softmax(s) @ h + x


POLICIES = {
    "recompute_all": None,
    "save_tagged": jax.checkpoint_policies.save_only_these_names("h"),
    "save_products": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_checkpointed_layers_run_packed_and_exact(policy):
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  layer = jax.checkpoint(_block, policy=POLICIES[policy])
  fun = lambda w, x: jnp.sum(layer(w, layer(w, x)) ** 2, axis=0)
  _check(fun, w, _examples(rng))   # (no PerformanceWarning: packed)


def _sines(jaxpr):
  """How many `sin` equations the program holds (its nested jaxprs included)."""
  return str(jaxpr).count("= sin ")


def test_the_gradient_still_recomputes():
  """The packed gradient program computes the checkpointed `sin` twice (forward and
  again in the backward pass), as the example alone's does."""
  rng = np.random.default_rng(4)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  model = lambda w, x: jnp.sum(jax.checkpoint(lambda w, x: jnp.tanh(jnp.sin(x @ w) @ w))(w, x))
  xs = _examples(rng)
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  grad = jax.make_jaxpr(jax.grad(
      lambda w: jnp.sum(pj.vmap(model, in_axes=(None, 0))(w, packed))))(w)
  alone = jax.make_jaxpr(jax.grad(lambda w: model(w, xs[0])))(w)
  assert _sines(alone) == 2
  assert _sines(grad) == 2
