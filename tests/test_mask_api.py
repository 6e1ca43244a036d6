"""pj.mask beyond single rules: compiles, retracing, pytrees, gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import pad_to, valid


def loglik(x, mu, sigma):
  return jnp.sum(-0.5 * ((x - mu) / sigma) ** 2 - jnp.log(sigma)) - 0.5 * x.shape[0] * np.log(2 * np.pi)


def padded_vector(x, size, rng):
  return pad_to(np.asarray(x, np.float32), np.zeros(size, np.float32), rng)


def test_jit_compiles_once_for_every_logical_size():
  rng = np.random.default_rng(0)
  calls = []

  def f(x):
    calls.append(1)
    return loglik(x, 0.3, 1.5)

  masked = jax.jit(pj.mask(f, ["n"]))
  data = rng.standard_normal(16).astype(np.float32)
  padded = [padded_vector(data[:n], 16, rng) for n in range(1, 17)]
  with pj.diagnostics.count_compiles() as compiles:
    got = [masked([x], {"n": n}) for n, x in zip(range(1, 17), padded)]
  assert len(compiles) == 1, [c.fun_name for c in compiles]
  assert len(calls) == 2  # one symbolic trace, and one with n = 0 (an empty example)
  reference = jax.jit(lambda x: loglik(x, 0.3, 1.5))   # (eager JAX: each op at each length)
  for n, g in zip(range(1, 17), got):
    np.testing.assert_allclose(g, reference(data[:n]), rtol=1e-5)


def test_new_padded_size_reuses_the_symbolic_trace():
  calls = []

  def f(x):
    calls.append(x.shape)
    return jnp.cumsum(x)

  masked = pj.mask(f, ["n"])
  for size in (4, 8, 16):
    jax.jit(masked)([np.ones(size, np.float32)], {"n": 3})
  assert len(calls) == 2 and (0,) in calls  # one symbolic trace, one for an empty example
  assert "n" in str(calls[0][0])


def test_vmap_over_logical_sizes_and_grad():
  rng = np.random.default_rng(1)
  sizes = [2, 5, 8]
  data = [rng.standard_normal(n).astype(np.float32) for n in sizes]
  xs = np.stack([padded_vector(d, 8, rng) for d in data])
  masked = pj.mask(lambda x, mu: loglik(x, mu, 2.0), ["n", None])
  grad_mu = jax.jit(jax.vmap(jax.grad(lambda x, n: masked([x, 0.5], {"n": n}).sum(), 0)))
  dx = grad_mu(xs, np.array(sizes, np.int32))
  reference = jax.jit(jax.grad(lambda x: loglik(x, 0.5, 2.0)))
  for b, d in enumerate(data):
    ref = reference(d)
    np.testing.assert_allclose(dx[b, :len(d)], ref, rtol=1e-5)
    assert np.all(dx[b, len(d):] == 0)


def test_grad_wrt_unpadded_and_closed_over_params_under_jit():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((5, 3)).astype(np.float32)
  xp = pad_to(x, np.zeros((8, 3), np.float32), rng)
  w0 = rng.standard_normal((3, 2)).astype(np.float32)
  b0 = rng.standard_normal(2).astype(np.float32)

  def ref_loss(w, b):
    return jnp.mean(jnp.tanh(x @ w + b) ** 2)

  @jax.jit
  def loss(w, b, n):  # w is closed over by the masked function, b is passed
    return pj.mask(lambda x, b: jnp.mean(jnp.tanh(x @ w + b) ** 2), ["(n, _)", None])(
        [xp, b], {"n": n})

  gw, gb = jax.grad(loss, (0, 1))(w0, b0, 5)
  rw, rb = jax.grad(ref_loss, (0, 1))(w0, b0)
  np.testing.assert_allclose(gw, rw, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gb, rb, rtol=1e-5, atol=1e-6)


def test_second_order_gradients_are_exact_and_finite():
  rng = np.random.default_rng(3)
  d = rng.standard_normal(5).astype(np.float32)
  xp = padded_vector(d, 8, rng)

  def f(x, a):
    return jnp.sum(jnp.sin(a * x) * jnp.cumsum(x)) + jnp.var(x) * a

  masked = pj.mask(f, ["n", None])
  d2a = jax.grad(jax.grad(lambda a: masked([xp, a], {"n": 5})))(0.7)
  ref = jax.grad(jax.grad(lambda a: f(d, a)))(0.7)
  np.testing.assert_allclose(d2a, ref, rtol=1e-4)

  hvp = jax.grad(lambda x: jnp.vdot(jax.grad(lambda x: masked([x, 0.7], {"n": 5}))(x), xp * 0 + 1.0))
  got = hvp(xp)
  ref_hvp = jax.grad(lambda x: jnp.sum(jax.grad(lambda x: f(x, 0.7))(x)))(d)
  np.testing.assert_allclose(got[:5], ref_hvp, rtol=1e-4, atol=1e-5)
  assert np.all(np.isfinite(got))


def test_pytree_arguments_and_outputs():
  rng = np.random.default_rng(4)

  def f(batch, scale):
    return {"total": jnp.sum(batch["x"] * batch["y"]) * scale, "prod": batch["x"] * batch["y"]}

  x, y = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
  batch = {"x": padded_vector(x, 6, rng), "y": padded_vector(y, 6, rng)}
  masked = pj.mask(f, ["n", None])  # "n" is a prefix: both leaves of the dict
  out = masked((batch, 2.0), {"n": 3})
  np.testing.assert_allclose(out["total"], np.sum(x * y) * 2.0, rtol=1e-5)
  np.testing.assert_allclose(valid(out["prod"], (3,)), x * y, rtol=1e-6)
  assert masked.logical_shapes((batch, 2.0), {"n": 3}) == {"total": (), "prod": (3,)}


def test_per_leaf_specs_and_unpad():
  masked = pj.mask(lambda d: d["a"].sum() + d["b"].sum(), [{"a": "n", "b": "(m, _)"}])
  args = ({"a": np.ones(4, np.float32), "b": np.ones((5, 2), np.float32)},)
  assert float(masked(args, {"n": 2, "m": 3})) == 2 + 6
  outs = pj.mask(lambda x: x * 2, ["n"])
  padded = outs([np.arange(6.0)], {"n": 4})
  np.testing.assert_array_equal(outs.unpad(padded, [np.arange(6.0)], {"n": 4}), [0, 2, 4, 6])


def test_out_shape_accepted_when_it_matches():
  masked = pj.mask(lambda x, y: jnp.concatenate([x, y]), ["n", "m"], out_shape="n + m")
  out = masked([np.ones(4), np.zeros(3)], {"n": 2, "m": 1})
  np.testing.assert_array_equal(valid(out, (3,)), [1, 1, 0])


def test_out_shape_with_none_outputs():
  # A None output is an empty subtree: its None spec is no leaf to pair with an output.
  xp = np.arange(8.0, dtype=np.float32)
  out, none = pj.mask(lambda x: (x, None), ["n"], ("n", None))([xp], {"n": 3})
  assert none is None
  np.testing.assert_array_equal(valid(out, (3,)), [0, 1, 2])
  none, out = pj.mask(lambda x: (None, x), ["n"], (None, "n"))([xp], {"n": 3})
  assert none is None
  with pytest.raises(pj.ShapeError, match=r"out_shape declares \(n \+ 1,\)"):
    pj.mask(lambda x: (None, x), ["n"], (None, "n + 1"))([xp], {"n": 3})


def test_constraints_allow_size_comparisons():
  masked = pj.mask(lambda x: lax.dynamic_slice(x, (1,), (3,)).sum(), ["n"],
                   constraints=["n >= 4"])
  assert float(masked([np.arange(8.0)], {"n": 5})) == 1 + 2 + 3
  with pytest.raises(pj.ShapeError, match="violate the constraint 'n >= 4'"):
    masked([np.arange(8.0)], {"n": 3})


def test_integer_inputs_and_outputs_with_grad():
  masked = pj.mask(lambda x, idx: (x[idx].sum(), jnp.argmax(x)), ["n", None])
  x = np.array([1.0, 5.0, 2.0, np.nan, np.inf], np.float32)
  idx = np.array([0, 2], np.int32)
  (total, arg), pull = jax.vjp(lambda x: masked([x, idx], {"n": 3}), x)
  assert float(total) == 3.0 and int(arg) == 1
  g, = pull((np.float32(1.0), np.zeros((), jax.dtypes.float0)))
  np.testing.assert_array_equal(g, [1, 0, 1, 0, 0])


def test_forward_mode_of_a_masked_function_ignores_the_padding():
  masked = pj.mask(jnp.sum, ["n"])
  x = np.array([1.0, 2.0, np.nan, np.inf], np.float32)
  t = np.array([1.0, 3.0, np.nan, np.inf], np.float32)
  y, ty = jax.jvp(lambda x: masked([x], {"n": 2}), (x,), (t,))
  assert (float(y), float(ty)) == (3.0, 4.0)


def test_jvp_inside_the_masked_function_works():
  f = lambda x: jax.jvp(jnp.cumsum, (x,), (jnp.ones_like(x),))[1].sum()
  x = np.array([1.0, 2.0, 3.0, np.nan], np.float32)
  assert float(pj.mask(f, ["n"])([x], {"n": 3})) == 6.0


def test_garbage_padding_everywhere_leaves_outputs_unchanged():
  """The same logical data with different garbage gives identical outputs."""
  rng = np.random.default_rng(5)
  x = rng.standard_normal((4, 3)).astype(np.float32)
  f = lambda x: (jax.nn.softmax(x @ x.T, axis=-1) @ x).sum(0)
  masked = jax.jit(pj.mask(f, ["(n, _)"]))
  outs = [masked([pad_to(x, np.zeros((8, 3), np.float32), rng)], {"n": 4}) for _ in range(3)]
  for o in outs[1:]:
    np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("size", [8, 40])  # an 8x8 mask slices a constant, 40x40 compares
def test_small_and_large_masks_are_exact_with_gradients_under_vmap(size):
  rng = np.random.default_rng(7)
  w = rng.standard_normal((4, 4)).astype(np.float32)

  def f(x, w):  # softmax attention: masked max, sum and contractions, forward and backward
    s = (x @ w) @ x.T
    return jnp.sum(jax.nn.softmax(s, axis=-1) @ x) + jnp.max(x)

  sizes = [3, size - 1, size]
  data = [rng.standard_normal((n, 4)).astype(np.float32) for n in sizes]
  xs = np.stack([pad_to(d, np.zeros((size, 4), np.float32), rng) for d in data])
  masked = pj.mask(f, ["(n, _)", None])
  value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(
      lambda x, w, n: masked([x, w], {"n": n}), (0, 1)), (0, None, 0)))
  values, (dx, dw) = value_and_grad(xs, w, np.array(sizes, np.int32))
  reference = jax.jit(jax.value_and_grad(f, (0, 1)))
  for b, d in enumerate(data):
    ref, (rx, rw) = reference(d, w)
    np.testing.assert_allclose(values[b], ref, rtol=1e-4)
    np.testing.assert_allclose(dx[b, :len(d)], rx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw[b], rw, rtol=1e-4, atol=1e-5)
    assert np.all(dx[b, len(d):] == 0)
