"""Packed attention differentiated in both operands of `q @ k.T`, against each example alone.

A packed attention product's token sums are guarded (a check, and a branch
to an exact row-by-row product where a result is not finite:
`polyjit/_ragged/packed_block_dot.py`). The scores' product `q @ k.T` with
queries, keys and values all made from the parameters has two such sums in
its backward pass, `ct_s @ k` and `ct_s.T @ q`. Checked here: each cotangent
repaired (an inf in one example's keys) under `jax.grad` (eagerly and under
`jax.jit`), and the products under `jax.jacrev`, `jax.vmap` of `jax.grad`
and a Hessian.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _poison, with_data

LENGTHS = [9, 5, 2, 12, 3]
MARKED = 1


def _attend(w, x):
  """Queries, keys and values all made with `w` (the inf, where there is
  one, is in `x[:, 0]`: the keys')."""
  q = jnp.tanh(x[:, 1:] @ w)
  k = x[:, :2] @ w
  v = jnp.tanh(x[:, 1:] @ w.T)
  return jnp.sum(jnp.tanh(jax.nn.softmax(q @ k.T, axis=-1) @ v))


def _inputs(inf):
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(2, 2)).astype(np.float32))
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in LENGTHS]
  if inf:
    xs[MARKED][2, 0] = np.inf
  return w, xs


def _packed(xs):
  return _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_both_cotangents_repaired(jit):
  """An inf in one example's keys: `ct_s @ k` is NaN in its row neighbours'
  dense product, the guard repairs it; each example's gradient with
  respect to its tokens (where a leak shows) is what it alone gives, the
  marked one's own NaN included."""
  w, xs = _inputs(True)
  packed = _packed(xs)
  def grad_tokens(data):
    total = lambda d: jnp.sum(pj.vmap(_attend, in_axes=(None, 0))(w, with_data(packed, d)))
    return jax.grad(total)(data)
  got = with_data(packed, (jax.jit(grad_tokens) if jit else grad_tokens)(packed.data)).to_list()
  want = [jax.jit(jax.grad(_attend, argnums=1))(w, x) for x in xs]
  for i, (g, r) in enumerate(zip(got, want, strict=True)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5, err_msg=str(i))
  finite = [bool(np.isfinite(np.asarray(g)).all()) for g in got]
  assert finite == [i != MARKED for i in range(len(xs))], finite


@pytest.mark.parametrize("transform", ["jacrev", "vmap_grad"])
def test_both_operands_under_vmap(transform):
  """The transposes under `jax.vmap` (`jax.jacrev`: a batch of cotangents)
  and their batching (`jax.vmap` of `jax.grad`), on
  finite values (with one example's NaN, reverse mode gives NaN in every
  row of JAX's own batched Jacobian: its zero cotangent times its NaN
  derivatives)."""
  w, xs = _inputs(False)
  packed = _packed(xs)
  per_example = lambda w: pj.vmap(_attend, in_axes=(None, 0))(w, packed)
  if transform == "jacrev":
    got = jax.jit(jax.jacrev(per_example))(w)
    want = [jax.jit(jax.grad(_attend))(w, x) for x in xs]
  else:   # two parameter matrices at once
    ws = jnp.stack([w, 2 * w])
    got = jax.jit(jax.vmap(jax.grad(lambda w: jnp.sum(per_example(w) ** 2))))(ws)
    want = [jax.jit(jax.grad(lambda w: sum(_attend(w, x) ** 2 for x in xs)))(v) for v in ws]
  for i, (g, r) in enumerate(zip(got, want, strict=True)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4, err_msg=str(i))


def test_hessian_of_packed_attention():
  """Second order through both operands: `jax.hessian` of the batch's
  total, against the examples alone."""
  w, xs = _inputs(False)
  packed = _packed(xs)
  got = jax.jit(jax.hessian(lambda w: jnp.sum(pj.vmap(_attend, in_axes=(None, 0))(w, packed))))(w)
  want = jax.jit(jax.hessian(lambda w: sum(_attend(w, x) for x in xs)))(w)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
