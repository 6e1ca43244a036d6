"""`jax.checkpoint` (remat) inside a packed `pj.vmap`: the checkpointed part
runs packed, inside a `jax.checkpoint` of its own policy (it ran the whole
call unpacked with a warning). Each example's values and gradients as that
example alone gives under `jax.jit`, NaN and inf in the rows' tails; token
values, reductions, attention scores inside and across the boundary, three
policies (one saving `checkpoint_name`-tagged values), `nn.remat`, and a body
with no packed rule (still the unpacked run with the warning, exact); and the
gradient program still recomputes what the policy does not save.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.flatten_util import ravel_pytree

import polyjit as pj

from test_packing import _check, _examples, _poison


def _mlp(w, x):
  return jnp.tanh(x @ w) @ w.T + x


def _attention(w, x):
  s = (x @ w) @ (x @ w).T / 2.0
  return jax.nn.softmax(s, axis=-1) @ x


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

CASES = {
    "tokens": lambda ck: lambda w, x: ck(_mlp)(w, x),
    "reduction_inside": lambda ck: lambda w, x: ck(lambda w, x: jnp.sum(_mlp(w, x), 0))(w, x),
    "attention_inside": lambda ck: lambda w, x: ck(_attention)(w, x),
    "scores_across": lambda ck: lambda w, x: ck(
        lambda s, x: jax.nn.softmax(s, axis=-1) @ x)((x @ w) @ (x @ w).T, x),
    "nested": lambda ck: lambda w, x: ck(lambda w, x: ck(_mlp)(w, _attention(w, x)))(w, x),
    "per_example_out": lambda ck: lambda w, x: (ck(_mlp)(w, x), ck(
        lambda x: jnp.max(x, axis=0))(x)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_checkpointed_parts_run_packed_and_exact(name):
  ck = jax.checkpoint
  rng = np.random.default_rng(31)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  _check(CASES[name](ck), w, _examples(rng))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_checkpointed_layers_under_each_policy(policy):
  """Two causal attention layers, each checkpointed with the policy (one
  saves its `checkpoint_name`-tagged values)."""
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  layer = jax.checkpoint(_block, policy=POLICIES[policy])
  _check(lambda w, x: jnp.sum(layer(w, layer(w, x)) ** 2, axis=0), w, _examples(rng))


def test_the_gradient_still_recomputes():
  """The packed gradient program computes the checkpointed `sin` twice (forward and
  again in the backward pass), as the example alone's does: the checkpoint is kept
  around the packed evaluation, not inlined."""
  rng = np.random.default_rng(4)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  model = lambda w, x: jnp.sum(jax.checkpoint(lambda w, x: jnp.tanh(jnp.sin(x @ w) @ w))(w, x))
  xs = _examples(rng)
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)   # (the packed path)
    grad = jax.make_jaxpr(jax.grad(
        lambda w: jnp.sum(pj.vmap(model, in_axes=(None, 0))(w, packed))))(w)
  alone = jax.make_jaxpr(jax.grad(lambda w: model(w, xs[0])))(w)
  assert str(alone).count("= sin ") == 2
  assert str(grad).count("= sin ") == 2


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(3)(jnp.tanh(nn.Dense(3)(x)))


def test_flax_remat_block():
  block = nn.remat(_Block)()
  rng = np.random.default_rng(34)
  params = block.init(jax.random.PRNGKey(0), jnp.zeros((2, 3)))
  flat, unravel = ravel_pytree(params)   # (one array as the shared argument `w`)
  _check(lambda w, x: block.apply(unravel(w), x), flat, _examples(rng), tol=1e-4)


def test_body_with_no_packed_rule_runs_unpacked_exactly():
  def body(w, x):   # a loop whose step reads the whole sequence: no packed rule
    return lax.fori_loop(0, x.shape[0], lambda i, c: c * 0.5 + jnp.max(x, 0), w[0] * 0) @ w
  rng = np.random.default_rng(35)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  xs = [x for x in _examples(rng) if len(x)]
  _check(lambda w, x: jax.checkpoint(body)(w, x), w, xs, expect_warning=True)
