"""Flax under pj.jit: a linen model's apply, and an NNX module through
nnx.split / nnx.merge (forward and gradient), over a variable number of
tokens. Results equal jax.jit's; compiles (jax.monitoring) one per bucket.
Skipped without Flax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_jit import default_compiles as expected_compiles

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

D = 8
LENGTHS = (5, 9, 17)


def tokens(n):
  return np.random.default_rng(n).standard_normal((n, D)).astype(np.float32)


def check(pj_fun, jax_fun, *args):
  refs = [jax_fun(*args, tokens(n)) for n in LENGTHS]
  with pj.diagnostics.count_compiles() as compiles:
    outs = [pj_fun(*args, tokens(n)) for n in LENGTHS]
  for out, ref in zip(outs, refs):
    assert jax.tree.structure(out) == jax.tree.structure(ref)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
      assert a.shape == b.shape and a.dtype == b.dtype
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert len(compiles) == expected_compiles(LENGTHS)


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(D)(nn.LayerNorm()(x))
    return nn.Dense(3)(nn.gelu(x + h)), nn.softmax(h.mean(-1))


def test_linen_apply():
  model = Block()
  params = model.init(jax.random.key(0), jnp.ones((4, D)))
  check(pj.jit(model.apply, fallback="error"), jax.jit(model.apply), params)


class Net(nnx.Module):
  def __init__(self, rngs):
    self.norm = nnx.LayerNorm(D, rngs=rngs)
    self.hidden = nnx.Linear(D, D, rngs=rngs)
    self.out = nnx.Linear(D, 2, rngs=rngs)

  def __call__(self, x):
    h = nnx.relu(self.hidden(self.norm(x)))
    return self.out(h * nnx.softmax(h.sum(-1))[:, None])   # mixes tokens


def test_nnx_split_merge_forward_and_gradient():
  graphdef, state = nnx.split(Net(nnx.Rngs(0)))

  def loss(state, x):
    return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

  step = jax.value_and_grad(loss)
  check(pj.jit(step, fallback="error"), jax.jit(step), state)
