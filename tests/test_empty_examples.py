"""Empty examples (issue 33 §2): logical sizes 0..padded work wherever JAX
works on empty arrays, under every way polyjit takes sizes.

A sum of nothing is 0, a mean NaN (as NumPy), `jnp.max` without `initial=`
raises as NumPy does where sizes are concrete and is NaN (poisoned, never a
plausible number) where they are traced. Each function runs under `pj.mask`
with concrete sizes, `jax.jit(pj.mask)` (traced sizes), `pj.vmap` over a
`pj.Ragged` holding empty examples, and `pj.jit` in both modes, always with
NaN padding, against `fun` on the unpadded arrays; gradients included. The
out-of-range contract is "outside [0, padded]".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import nan_padded

P = 6
SIZES = (0, 1, 4, P)


def data(n, seed=0):
  return (np.random.default_rng(n + 10 * seed).standard_normal(n) + 0.5).astype(np.float32)


def _scan(x):
  carry, ys = lax.scan(lambda c, v: (c * 0.5 + v, c * v), jnp.float32(1.0), x)
  return carry, ys


FUNS = {
    "sum": jnp.sum,
    "mean": jnp.mean,
    "max_initial": lambda x: jnp.max(x, initial=-2.0),
    "cumsum": jnp.cumsum,
    "slice": lambda x: x[1:] * 2.0,
    "dot": lambda x: jnp.dot(x, x) + 1.0,
    "scan": _scan,
    "softmax": lambda x: jnp.sum(jax.nn.softmax(x) * x),
    "size_as_value": lambda x: jnp.sum(x) + x.shape[0] * 0.5,
    "outer": lambda x: jnp.outer(x, x).sum(0),
}


def _same(got, want):
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  for g, w in zip(got, want, strict=True):
    g, w = np.asarray(g), np.asarray(w)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", sorted(FUNS))
def test_pj_mask_with_concrete_and_traced_sizes(name):
  fun = FUNS[name]
  masked = pj.mask(fun, ["n"])
  traced = jax.jit(lambda xp, n: masked([xp], {"n": n}))
  for n in SIZES:
    x = data(n)
    want = fun(jnp.asarray(x))
    xp = nan_padded(x, P)
    _same(masked.unpad(masked([xp], {"n": n}), [xp], {"n": n}), want)
    _same(masked.unpad(traced(xp, n), [xp], {"n": n}), want)


@pytest.mark.parametrize("name", sorted(FUNS))
def test_pj_vmap_over_a_ragged_batch_with_empty_examples(name):
  fun = FUNS[name]
  xs = [data(n, 1) for n in (3, 0, P, 0, 1)]
  r = pj.Ragged(np.stack([nan_padded(x, P) for x in xs]), np.array([len(x) for x in xs]))
  out = pj.vmap(fun)(r)
  for i, x in enumerate(xs):
    want = fun(jnp.asarray(x))
    got = jax.tree.map(lambda o: o.to_list()[i] if isinstance(o, pj.Ragged) else np.asarray(o)[i],
                       out, is_leaf=lambda o: isinstance(o, pj.Ragged))
    _same(got, want)


@pytest.mark.parametrize("mode", ["auto", "explicit"])
@pytest.mark.parametrize("name", ["sum", "mean", "cumsum", "scan", "slice"])
def test_pj_jit_both_modes(name, mode):
  fun = FUNS[name]
  f = pj.jit(fun, polymorphic_shapes=None if mode == "auto" else ["n"])
  for n in (3, 0, 5, 0, 1, 2):
    x = data(n, 2)
    _same(f(x), jax.jit(fun)(x))


def test_from_list_takes_empty_examples():
  xs = [data(3), data(0), data(2)]
  r = pj.Ragged.from_list(xs)
  assert list(np.asarray(r.lengths)) == [3, 0, 2]
  np.testing.assert_allclose(np.asarray(pj.vmap(jnp.sum)(r)), [float(np.sum(x)) for x in xs],
                             rtol=1e-6)
  empty = pj.Ragged.from_list([data(0), data(0)])
  np.testing.assert_array_equal(np.asarray(pj.vmap(jnp.sum)(empty)), [0.0, 0.0])
  assert [x.shape for x in pj.vmap(jnp.cumsum)(empty).to_list()] == [(0,), (0,)]


def _loss(w, x):
  return jnp.sum(jnp.tanh(w * x) ** 2) + w * x.shape[0] + jnp.sum(jnp.cumsum(x) * w)


def test_gradients_with_empty_examples():
  xs = [data(n, 3) for n in (2, 0, 5, 0)]
  lengths = np.array([len(x) for x in xs])
  total = lambda w, d: jnp.sum(pj.vmap(_loss, in_axes=(None, 0))(w, pj.Ragged(d, lengths)))
  gw, gdata = jax.jit(jax.grad(total, argnums=(0, 1)))(
      0.7, np.stack([nan_padded(x, P) for x in xs]))
  want_w = sum(jax.grad(_loss)(0.7, jnp.asarray(x)) for x in xs)
  np.testing.assert_allclose(float(gw), float(want_w), rtol=1e-5)
  gdata = np.asarray(gdata)
  assert np.isfinite(gdata).all()
  for i, x in enumerate(xs):
    np.testing.assert_allclose(gdata[i, :len(x)], jax.grad(_loss, 1)(0.7, jnp.asarray(x)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(gdata[i, len(x):], 0.0)
  # jax.jit(pj.mask) at a traced n = 0: the gradient is the empty one (w's) and 0 in x.
  masked = pj.mask(_loss, [None, "n"])
  g = jax.jit(jax.grad(lambda w, xp, n: masked([w, xp], {"n": n}), argnums=(0, 1)))
  gw0, gx0 = g(0.7, nan_padded(data(0), P), 0)
  assert float(gw0) == pytest.approx(float(jax.grad(_loss)(0.7, jnp.zeros(0))))
  np.testing.assert_array_equal(np.asarray(gx0), 0.0)


def test_max_without_initial_raises_or_is_poisoned_at_zero():
  masked = pj.mask(jnp.max, ["n"])
  xp = nan_padded(data(0), P)
  with pytest.raises(ValueError, match="zero-size"):
    masked([xp], {"n": 0})
  with pytest.raises(ValueError, match="zero-size"):
    pj.jit(jnp.max, polymorphic_shapes=["n"])(data(0))
  traced = jax.jit(lambda xp, n: masked([xp], {"n": n}))
  assert np.isnan(float(traced(xp, 0)))
  x = data(4)
  assert float(traced(nan_padded(x, P), 4)) == pytest.approx(float(np.max(x)))
  r = pj.Ragged(np.stack([nan_padded(data(3), P), xp]), np.array([3, 0]))
  out = np.asarray(pj.vmap(jnp.max)(r))
  assert out[0] == pytest.approx(float(np.max(data(3)))) and np.isnan(out[1])


def test_two_sizes_either_or_both_empty():
  fun = lambda x, y: (jnp.sum(x) * 2.0 + jnp.sum(y), jnp.concatenate([x, y]))
  masked = pj.mask(fun, ["n", "m"])
  traced = jax.jit(lambda xp, yp, n, m: masked([xp, yp], {"n": n, "m": m}))
  for n, m in ((0, 2), (3, 0), (0, 0), (2, 5)):
    x, y = data(n, 4), data(m, 5)
    args = [nan_padded(x, P), nan_padded(y, P)]
    want = fun(jnp.asarray(x), jnp.asarray(y))
    _same(masked.unpad(traced(*args, n, m), args, {"n": n, "m": m}), want)
    _same(masked.unpad(masked(args, {"n": n, "m": m}), args, {"n": n, "m": m}), want)


def test_sizes_outside_zero_to_padded():
  masked = pj.mask(jnp.sum, ["n"])
  xp = nan_padded(data(3), P)
  for n in (-1, P + 1):
    with pytest.raises(pj.ShapeError, match="between 0 and"):
      masked([xp], {"n": n})
    assert np.isnan(float(jax.jit(lambda xp, n: masked([xp], {"n": n}))(xp, n)))
