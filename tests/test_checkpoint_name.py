"""`jax.ad_checkpoint.checkpoint_name` (remat's tag on a value, the `name`
primitive: the identity) in masked and packed functions.

Models written for rematerialisation tag their activations with it (MaxText
does in every layer); `pj.mask` refused the tag as a primitive with no
masking rule, on any padded operand. It is elementwise: its padding stays in
padding. Checked against each example alone under `jax.jit`, values and
gradients, with NaN and inf in the padding: packed (several examples per
row) and padded, under `jax.checkpoint` with a policy that saves the tagged
values too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

import polyjit as pj
from harness import nan_padded
from test_packing import _check, _examples


def _block(w, x):
  h = checkpoint_name(jnp.tanh(x @ w), "h")
  n = x.shape[0]
  s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), h @ x.T, -jnp.inf)
  return checkpoint_name(jax.nn.softmax(s) @ h, "out")


def test_tagged_values_packed():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  _check(lambda w, x: jnp.sum(_block(w, x) ** 2, axis=0), w, _examples(rng))


def test_tagged_values_under_a_remat_policy_padded():
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  xs = _examples(rng)
  policy = jax.checkpoint_policies.save_only_these_names("h")
  fun = lambda w, x: jnp.sum(jax.checkpoint(_block, policy=policy)(w, x) ** 2)
  batch = pj.Ragged(np.stack([nan_padded(x, 16) for x in xs]), np.array([len(x) for x in xs]))
  run = lambda w: jnp.sum(pj.vmap(fun, in_axes=(None, 0))(w, batch))
  value, grad = jax.jit(jax.value_and_grad(run))(w)
  want = [jax.jit(jax.value_and_grad(fun))(w, x) for x in xs]
  np.testing.assert_allclose(value, sum(v for v, _ in want), rtol=2e-5)
  np.testing.assert_allclose(grad, sum(g for _, g in want), rtol=2e-5, atol=2e-5)
