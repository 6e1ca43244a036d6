"""`jax.checkpoint` (remat) inside a packed `pj.vmap`: the checkpointed part
runs packed, inside a `jax.checkpoint` of its own policy (it ran the whole
call unpacked with a warning). Each example's values and gradients as that
example alone gives under `jax.jit`, NaN and inf in the rows' tails; token
values, reductions, attention scores inside and across the boundary,
`checkpoint_name` with a names policy, `nn.remat`, and a body with no packed
rule (still the unpacked run with the warning, exact).
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


POLICIES = {
    "default": None,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
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


# (every body under the default policy; the other policies on two of them)
@pytest.mark.parametrize("name,policy", [*((n, "default") for n in sorted(CASES)),
                                         *((n, p) for n in ("attention_inside", "tokens")
                                           for p in sorted(POLICIES) if p != "default")])
def test_checkpointed_parts_run_packed_and_exact(name, policy):
  ck = lambda f: jax.checkpoint(f, policy=POLICIES[policy])
  rng = np.random.default_rng(31)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  _check(CASES[name](ck), w, _examples(rng))


def test_checkpoint_name_with_a_names_policy():
  policy = jax.checkpoint_policies.save_only_these_names("hidden")
  def fun(w, x):
    def body(w, x):
      h = checkpoint_name(jnp.tanh(x @ w), "hidden")
      return jnp.sum(jnp.sin(h) @ w.T, axis=0)
    return jax.checkpoint(body, policy=policy)(w, x)
  rng = np.random.default_rng(32)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  _check(fun, w, _examples(rng))


def test_packed_call_keeps_the_checkpoint():
  """The packed evaluation holds a checkpoint of its own (what JAX saves or
  recomputes follows the user's policy), not the body inlined."""
  rng = np.random.default_rng(33)
  w = jnp.asarray(rng.normal(size=(3, 3)).astype(np.float32))
  packed = pj.Ragged.from_list(_examples(rng), packing=pj.Packing(row_length=16))
  fun = pj.vmap(lambda w, x: jax.checkpoint(_mlp)(w, x), in_axes=(None, 0))
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)   # (the packed path)
    jaxpr = jax.make_jaxpr(lambda w: fun(w, packed).data)(w)
  assert "remat2" in _primitives(jaxpr.jaxpr), _primitives(jaxpr.jaxpr)


def _primitives(jaxpr):
  """Every primitive's name in `jaxpr` and the jaxprs its equations hold."""
  names = set()
  for e in jaxpr.eqns:
    names.add(e.primitive.name)
    for p in e.params.values():
      for sub in p if isinstance(p, (tuple, list)) else [p]:
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          names |= _primitives(sub)
  return names


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
