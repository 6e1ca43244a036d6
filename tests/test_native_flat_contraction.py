"""Native mode binds `x @ w` (x padded along its leading axis, w a shared
weight) as a bilinear call node whose batching over `x` alone merges the
batch axis into `x`'s leading one (`_masking/native_dot.py`): the gradient
program contracts one axis, as a hand-flattened batch does.

Checked: the derivatives through the node are JAX's (reverse, forward,
second order, `jax.jacfwd`, a batched weight) with garbage in the padding,
and the gradient program has no contraction over two axes any more. The
references (JAX on the unpadded examples) run under jax.jit: eager JAX
compiled each op at each example's length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._masking import native_dot

GARBAGE = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)
LENGTHS, PADDED, D = (3, 1, 6, 4), 8, 3


def model(w, x):
  h = jnp.tanh(x @ w["a"] + w["b"])
  return jnp.sum(jnp.tanh(h @ w["c"]) ** 2)


def _setup(seed=0):
  rng = np.random.default_rng(seed)
  w = {"a": jnp.asarray(rng.standard_normal((D, D)), jnp.float32),
       "b": jnp.asarray(rng.standard_normal(D), jnp.float32),
       "c": jnp.asarray(rng.standard_normal((D, 2)), jnp.float32)}
  xs = [rng.standard_normal((n, D)).astype(np.float32) for n in LENGTHS]
  data = np.resize(GARBAGE, (len(xs), PADDED, D)).astype(np.float32)
  for i, x in enumerate(xs):
    data[i, :len(x)] = x
  ragged = pj.Ragged(jnp.asarray(data), jnp.asarray(LENGTHS, jnp.int32))
  return w, xs, ragged


def _batched(fun):
  fresh = lambda *a: fun(*a)  # (no trace of another test reused)
  return lambda w, r: pj.vmap(fresh, in_axes=(None, 0))(w, r).sum()


def _summed(fun, w, xs):
  return sum(fun(w, jnp.asarray(x)) for x in xs)


def _close(got, want):
  for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, v, rtol=2e-4, atol=2e-5)


def test_reverse_mode():
  w, xs, r = _setup()
  got = jax.jit(jax.grad(_batched(model)))(w, r)
  grad = jax.jit(jax.grad(model))
  want = jax.tree.map(lambda *g: sum(g), *[grad(w, jnp.asarray(x)) for x in xs])
  _close(got, want)


def test_forward_mode_and_jacfwd():
  w, xs, r = _setup(1)
  t = jax.tree.map(jnp.ones_like, w)
  _, got = jax.jvp(lambda w: _batched(model)(w, r), (w,), (t,))
  _, want = jax.jit(lambda w, t: jax.jvp(lambda w: _summed(model, w, xs), (w,), (t,)))(w, t)
  _close(got, want)
  _close(jax.jacfwd(lambda a: _batched(model)(dict(w, a=a), r))(w["a"]),
         jax.jit(jax.jacfwd(lambda a: _summed(model, dict(w, a=a), xs)))(w["a"]))


def test_second_order():
  w, xs, r = _setup(2)
  got = jax.hessian(lambda c: _batched(model)(dict(w, c=c), r))(w["c"])
  want = jax.jit(jax.hessian(lambda c: _summed(model, dict(w, c=c), xs)))(w["c"])
  _close(got, want)


def test_a_weight_batched_too():
  """Per-example weights: the batching that cannot merge (jax.vmap of the dot)."""
  w, xs, r = _setup(3)
  ws = jnp.stack([w["a"] * (i + 1) for i in range(len(xs))])
  fun = lambda a, x: model(dict(w, a=a), x)
  got = jax.grad(lambda ws: pj.vmap(lambda a, x: fun(a, x), in_axes=(0, 0))(ws, r).sum())(ws)
  grad = jax.jit(jax.grad(fun))
  want = jnp.stack([grad(a, jnp.asarray(x)) for a, x in zip(ws, xs, strict=True)])
  _close(got, want)


def _contractions(fun, *args):
  hlo = jax.jit(fun).lower(*args).as_text()
  return [line for line in hlo.splitlines() if "dot_general" in line]


def test_the_gradient_contracts_one_axis(monkeypatch):
  w, _, r = _setup()
  two_axes = lambda lines: [l for l in lines if "contracting_dims = [0, 1]" in l]
  assert not two_axes(_contractions(jax.grad(_batched(model)), w, r))
  monkeypatch.setattr(native_dot, "applies", lambda eqn: False)  # (the plain dot)
  assert two_axes(_contractions(jax.grad(_batched(model)), w, r))


@pytest.mark.parametrize("case", ["contracted_leading", "padded_weight", "integer"])
def test_applies_only_to_its_case(case):
  n = jax.export.symbolic_shape("n")[0]
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  fun, args = {
      "contracted_leading": (lambda x, w: x.T @ w, (f32(n, D), f32(n, D))),
      "padded_weight": (lambda x, w: x @ w, (f32(n, D), f32(D, n))),
      "integer": (lambda x, w: x @ w, (jax.ShapeDtypeStruct((n, D), jnp.int32),
                                       jax.ShapeDtypeStruct((D, D), jnp.int32))),
  }[case]
  (eqn,) = [e for e in jax.make_jaxpr(fun)(*args).jaxpr.eqns if e.primitive.name == "dot_general"]
  assert not native_dot.applies(eqn)
  x_w = jax.make_jaxpr(lambda x, w: x @ w)(f32(n, D), f32(D, D)).jaxpr.eqns[0]
  assert native_dot.applies(x_w)
