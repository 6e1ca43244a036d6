"""The masked scan's per-step cost in reverse mode: no more than a hand-masked scan's.

A `lax.scan` over a dynamic length runs over the padded length with its carry
frozen past the logical end; in native mode (JAX differentiates the masked
evaluation) the frozen steps run on a real step's inputs, so that their local
derivatives are finite (`rules/control_flow.py`). How those selects are
written decides what JAX's partial evaluation stacks per step for the
backward scan: each distinct select predicate is a stacked boolean residual,
and a select of a slice of `xs` inside the loop makes the selected slice a
stacked residual where the raw `xs` would be forwarded. Each is one more
pass per step, forward and backward (the text classifier of
`benchmarks/training.py` spent its extra CPU there).

The structural test counts the stacked residuals the forward scans of the
gradient's jaxpr emit, against the same LSTM written by hand for a padded
batch (`jnp.where(mask[t], new, old)`): polyjit's may not be more, and its
boolean ones no more than one per distinct carry shape. The exactness tests
put NaN/inf in every padding (an integer `xs` too) and check the loss and
the gradients of the shared weights and of the padded input under
`pj.vmap`, `jax.vmap(pj.mask)` and `jax.jit(pj.mask)`, with a step whose
derivative is infinite at the padding's zero inputs (`sqrt`), forward and
reverse, lengths 1 to the padded length.
"""

from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

D, H, V = 5, 4, 11
LENGTHS = (3, 1, 9, 6, 9)
PADDED = 9
GARBAGE = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)


def _params(rng):
  n = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.5, jnp.float32)
  return {"wi": n(D, 4 * H), "wh": n(H, 4 * H), "b": n(4 * H), "emb": n(V, H)}


def _cell(p, carry, xt, tok):
  h, c = carry
  g = xt @ p["wi"] + h @ p["wh"] + p["b"]
  i, f, o, u = jnp.split(g, 4)
  c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u) + 0.1 * p["emb"][tok]
  h = jax.nn.sigmoid(o) * jnp.tanh(c)
  return (h, c), h


def one(p, x, toks):
  """One sequence: a forward and a reverse LSTM over (x, toks); sqrt(x^2)
  has an infinite derivative at a zero input."""
  x = jnp.sqrt(x * x + 0.0)
  zeros = (jnp.zeros(H), jnp.zeros(H))
  (hf, _), ys = lax.scan(lambda c, a: _cell(p, c, *a), zeros, (x, toks))
  (hb, _), _ = lax.scan(lambda c, a: _cell(p, c, *a), zeros, (x, toks), reverse=True)
  return jnp.sum(hf * hb) + jnp.sum(jnp.log1p(ys ** 2))


def padded_by_hand(p, x, toks, mask):
  """The same loss for a padded batch, masked by hand (time-major scans)."""
  x = jnp.swapaxes(jnp.sqrt(x * x + 0.0), 0, 1)
  toks, mask = jnp.swapaxes(toks, 0, 1), jnp.swapaxes(mask, 0, 1)
  cell = jax.vmap(_cell, in_axes=(None, 0, 0, 0))

  def step(carry, a):
    xt, tt, mt = a
    new, y = cell(p, carry, xt, tt)
    new = jax.tree.map(lambda n, o: jnp.where(mt[:, None], n, o), new, carry)
    return new, y

  zeros = (jnp.zeros((x.shape[1], H)),) * 2
  (hf, _), ys = lax.scan(step, zeros, (x, toks, mask))
  (hb, _), _ = lax.scan(step, zeros, (x, toks, mask), reverse=True)
  ys = jnp.where(mask[..., None], ys, 0.0)
  return jnp.sum(hf * hb) + jnp.sum(jnp.log1p(ys ** 2))


def _data(rng, garbage=True):
  xs = [rng.standard_normal((n, D)).astype(np.float32) for n in LENGTHS]
  ts = [rng.integers(0, V, n).astype(np.int32) for n in LENGTHS]
  x = (rng.choice(GARBAGE, (len(LENGTHS), PADDED, D)) if garbage
       else np.zeros((len(LENGTHS), PADDED, D))).astype(np.float32)
  t = np.full((len(LENGTHS), PADDED), 10 ** 6 if garbage else 0, np.int32)
  for i, (a, b) in enumerate(zip(xs, ts, strict=True)):
    x[i, :len(a)], t[i, :len(b)] = a, b
  return xs, ts, x, t, np.array(LENGTHS, np.int32)


@functools.cache
def _reference():
  """Each unpadded example's loss and gradients, for the tests' data (seed 0:
  the parameters and the unpadded examples are the same in every test, only
  the padding differs): one compile per length, once for the module."""
  rng = np.random.default_rng(0)
  p = _params(rng)
  xs, ts, *_ = _data(rng)
  value_and_grad = jax.jit(jax.value_and_grad(one, argnums=(0, 1)))
  results = [value_and_grad(p, jnp.asarray(a), jnp.asarray(b)) for a, b in zip(xs, ts, strict=True)]
  return results


def _batch_loss(how):
  masked = pj.mask(one, [None, "(n, _)", "n"], constraints=["n >= 1"])
  if how == "pj.vmap":
    return lambda p, x, t, n: pj.vmap(one, in_axes=(None, 0, 0))(
        p, pj.Ragged(x, n), pj.Ragged(t, n)).sum()
  if how == "jax.vmap(pj.mask)":
    return lambda p, x, t, n: jax.vmap(lambda x, t, n: masked([p, x, t], {"n": n}))(
        x, t, n).sum()
  each = jax.jit(lambda p, x, t, n: masked([p, x, t], {"n": n}))
  return lambda p, x, t, n: sum(each(p, x[i], t[i], n[i]) for i in range(len(LENGTHS)))


@pytest.mark.parametrize("how", ["pj.vmap", "jax.vmap(pj.mask)", "jax.jit(pj.mask)"])
def test_masked_scans_are_exact_and_finite_with_garbage_padding(how):
  rng = np.random.default_rng(0)
  p = _params(rng)
  _, _, x, t, n = _data(rng)
  loss = _batch_loss(how)
  fun = (jax.jit(jax.value_and_grad(loss, argnums=(0, 1))) if how != "jax.jit(pj.mask)"
         else jax.value_and_grad(loss, argnums=(0, 1)))
  value, (gp, gx) = fun(p, jnp.asarray(x), jnp.asarray(t), jnp.asarray(n))
  want = _reference()
  np.testing.assert_allclose(value, sum(float(v) for v, _ in want), rtol=2e-5)
  want_p = jax.tree.map(lambda *g: sum(g), *[g for _, (g, _) in want])
  for got, w in zip(jax.tree.leaves(gp), jax.tree.leaves(want_p), strict=True):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, w, rtol=2e-4, atol=2e-5)
  gx = np.asarray(gx)
  assert np.all(np.isfinite(gx))
  for i, (_, (_, w)) in enumerate(want):
    np.testing.assert_allclose(gx[i, :LENGTHS[i]], w, rtol=2e-4, atol=2e-5)
    assert np.all(gx[i, LENGTHS[i]:] == 0)


def test_hand_masked_model_agrees():
  # the structural comparison below is against a model computing the same thing
  rng = np.random.default_rng(0)
  p = _params(rng)
  _, _, x, t, n = _data(rng, garbage=False)
  mask = np.arange(PADDED)[None, :] < n[:, None]
  got = jax.jit(padded_by_hand)(p, x, t, mask)
  np.testing.assert_allclose(got, sum(float(v) for v, _ in _reference()), rtol=2e-5)


# --- structure: what the forward scans stack for the backward pass -------------

def _scan_eqns(jaxpr):
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _scan_eqns(sub)


def _stacked_residuals(closed):
  """(boolean, other) counts of the stacked outputs of the scans in the
  gradient's jaxpr (the forward ones: the transposed ones stack none here),
  a length-0 scan (an empty example's path) aside."""
  bools = others = 0
  for eqn in _scan_eqns(closed.jaxpr):
    if eqn.params["length"] == 0:
      continue
    # a stacked output has the body's output shape with the length in front; a
    # carry has the body's shape (read from the shapes: JAX 0.12's scan has no
    # `num_carry` parameter)
    body = eqn.params["jaxpr"]
    body = getattr(body, "jaxpr", body)
    stacked = [v for v, b in zip(eqn.outvars, body.outvars, strict=True)
               if v.aval.shape != b.aval.shape]
    bools += sum(v.aval.dtype == jnp.bool_ for v in stacked)
    others += sum(v.aval.dtype != jnp.bool_ for v in stacked)
  return bools, others


def _gradient_jaxpr(how, p, x, t, n):
  if how == "hand":
    mask = jnp.arange(PADDED)[None, :] < n[:, None]
    return jax.make_jaxpr(jax.grad(padded_by_hand))(p, x, t, mask)
  return jax.make_jaxpr(jax.grad(_batch_loss(how)))(p, x, t, n)


@pytest.mark.parametrize("how", ["pj.vmap", "jax.vmap(pj.mask)"])
def test_masked_scans_stack_no_more_per_step_than_hand_masks(how):
  rng = np.random.default_rng(0)
  p = _params(rng)
  _, _, x, t, n = _data(rng)
  args = (p, jnp.asarray(x), jnp.asarray(t), jnp.asarray(n))
  hand_bools, hand_others = _stacked_residuals(_gradient_jaxpr("hand", *args))
  bools, others = _stacked_residuals(_gradient_jaxpr(how, *args))
  # one shared select predicate per carry shape (h and c: one shape) and scan
  assert bools <= 2, (bools, others)
  assert bools + others <= hand_bools + hand_others, (bools, others, hand_bools, hand_others)
