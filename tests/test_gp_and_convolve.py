"""The last refusals of real code under traced sizes (issue 33 §3).

* `jax.scipy.signal.convolve(x, k, mode="same")` (and "full", `correlate`)
  for examples shorter than the kernel: JAX swaps operands on comparing their
  sizes; polyjit's spelling keeps the fixed kernel as the kernel
  (`_spellings/signal.py`), exact on both sides. mode="valid", whose length
  depends on the side, stays refused with a polyjit error.
* NumPyro's Gaussian-process marginal likelihood, `MultivariateNormal` over an
  n x n kernel, exact, gradients included, with NumPyro's validation off and
  on (validation runs under `jax.ensure_compile_time_eval()`, where what needs
  a size is staged: `_jax/compile_time.py`); a constant invalid parameter is
  still rejected as under jax.jit.

Each runs under `pj.vmap` over a NaN-padded `pj.Ragged`, `jax.jit(pj.mask)`
with a traced length, and `pj.jit` in both modes, against the unpadded call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy import signal

import polyjit as pj
from harness import nan_padded

P = 12
KERNEL = np.array([1.0, -2.0, 3.0, 0.5, 4.0], np.float32)
LENGTHS = (2, 3, 5, 9, 12, 1)

CONVOLUTIONS = {
    "same": lambda x: signal.convolve(x, KERNEL, mode="same"),
    "full": lambda x: signal.convolve(x, KERNEL, mode="full"),
    "kernel_first_same": lambda x: jnp.sum(signal.convolve(KERNEL, x, mode="same") ** 2),
    "correlate_same": lambda x: signal.correlate(x, KERNEL, mode="same"),
    "smooth_loss": lambda x: jnp.mean(signal.convolve(x, KERNEL / 5, mode="same") - x) ** 2,
}


def series(n, seed=0):
  return np.random.default_rng(n + 100 * seed).standard_normal(n).astype(np.float32)


def ragged(xs):
  return pj.Ragged(np.stack([nan_padded(x, P) for x in xs]), np.array([len(x) for x in xs]))


def _same(got, want):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONVOLUTIONS))
def test_convolve_under_pj_vmap_and_jit_of_mask(name):
  fun = CONVOLUTIONS[name]
  xs = [series(n) for n in LENGTHS]
  out = pj.vmap(fun)(ragged(xs))
  outs = out.to_list() if isinstance(out, pj.Ragged) else list(np.asarray(out))
  for x, o in zip(xs, outs, strict=True):
    _same(o, fun(jnp.asarray(x)))
  masked = pj.mask(fun, ["n"])
  run = jax.jit(lambda xp, n: masked([xp], {"n": n}))
  for x in xs:
    xp = nan_padded(x, P)
    _same(masked.unpad(run(xp, len(x)), [xp], {"n": len(x)}), fun(jnp.asarray(x)))


@pytest.mark.parametrize("mode", ["auto", "explicit"])
@pytest.mark.parametrize("name", ["same", "kernel_first_same"])
def test_convolve_under_pj_jit(name, mode):
  fun = CONVOLUTIONS[name]
  f = pj.jit(fun, polymorphic_shapes=None if mode == "auto" else ["n"], fallback="error")
  for n in LENGTHS:
    x = series(n, 1)
    _same(f(x), jax.jit(fun)(x))


def test_convolve_gradient_under_pj_vmap():
  fun = CONVOLUTIONS["smooth_loss"]
  xs = [series(n, 2) for n in LENGTHS]
  lengths = np.array([len(x) for x in xs])
  total = lambda d: jnp.sum(pj.vmap(fun)(pj.Ragged(d, lengths)))
  g = np.asarray(jax.jit(jax.grad(total))(np.stack([nan_padded(x, P) for x in xs])))
  for i, x in enumerate(xs):
    np.testing.assert_allclose(g[i, :len(x)], jax.grad(fun)(jnp.asarray(x)), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(g[i, len(x):], 0.0)


def test_valid_mode_is_refused_with_what_works():
  fun = lambda x: signal.convolve(x, KERNEL, mode="valid")
  with pytest.raises(pj.PolyjitError, match="What to do"):   # its length depends on the side
    pj.vmap(fun)(ragged([series(3), series(8)]))


# --- NumPyro's Gaussian-process marginal likelihood -----------------------------------

dist = pytest.importorskip("numpyro.distributions")


def gp_loglik(params, x, y, validate_args=False):
  ls, amp, noise = params
  d = x[:, None] - x[None, :]
  K = amp * jnp.exp(-0.5 * (d / ls) ** 2) + noise * jnp.eye(x.shape[0])
  mvn = dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=K,
                                validate_args=validate_args)
  return mvn.log_prob(y)


PARAMS = (jnp.float32(0.4), jnp.float32(1.3), jnp.float32(0.2))


def _data(n):
  x = np.sort(np.random.default_rng(n).uniform(0, 3, n)).astype(np.float32)
  return x, (np.sin(2 * x) + 0.1 * series(n, 3)).astype(np.float32)


def test_gp_marginal_likelihood_under_pj_vmap_with_gradients():
  data = [_data(n) for n in (3, 7, 1, 10)]
  xs, ys = ragged([d[0] for d in data]), ragged([d[1] for d in data])
  f = pj.vmap(gp_loglik, in_axes=(None, 0, 0))
  got = np.asarray(f(PARAMS, xs, ys))
  values, per_example = _unpadded_values_and_grads(gp_loglik, data)
  for g, want in zip(got, values, strict=True):
    assert g == pytest.approx(want, rel=1e-4)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(f(p, xs, ys))))(PARAMS)
  want = [sum(float(g[i]) for g in per_example) for i in range(3)]
  np.testing.assert_allclose([float(g) for g in grads], want, rtol=1e-3)


def _unpadded_values_and_grads(fun, data):
  """`fun`'s value and gradient (parameters) on each unpadded example, one
  jitted call each (a compile per length) instead of eager JAX op by op."""
  value_and_grad = jax.jit(jax.value_and_grad(fun))
  out = [value_and_grad(PARAMS, x, y) for x, y in data]
  return [float(v) for v, _ in out], [g for _, g in out]


def test_gp_marginal_likelihood_under_jit_of_mask_and_pj_jit():
  masked = pj.mask(gp_loglik, [None, "n", "n"])
  run = jax.jit(lambda p, xp, yp, n: masked([p, xp, yp], {"n": n}))
  reference = jax.jit(gp_loglik)   # the unpadded call: a compile per length, not op by op
  for mode in ("auto", "explicit"):
    f = pj.jit(gp_loglik, polymorphic_shapes=None if mode == "auto" else [None, "n", "n"],
               fallback="error")
    for n in (2, 6, 11):
      x, y = _data(n)
      want = float(reference(PARAMS, x, y))
      assert float(run(PARAMS, nan_padded(x, P), nan_padded(y, P), n)) == pytest.approx(want, rel=1e-4)
      assert float(f(PARAMS, x, y)) == pytest.approx(want, rel=1e-4)


def test_gp_with_numpyro_validation_on_under_pj_vmap_and_pj_jit():
  """Validation runs under `jax.ensure_compile_time_eval()`: what cannot be
  evaluated at a symbolic size is staged (`_jax/compile_time.py`), so the
  check of traced parameters is left to the program as under jax.jit."""
  from jax._src.interpreters import partial_eval as pe
  before = (jax.ensure_compile_time_eval, pe.DynamicJaxprTrace.process_primitive)
  validated = lambda p, x, y: gp_loglik(p, x, y, validate_args=True)
  data = [_data(n) for n in (3, 7, 1, 10)]
  xs, ys = ragged([d[0] for d in data]), ragged([d[1] for d in data])
  f = pj.vmap(validated, in_axes=(None, 0, 0))
  got = np.asarray(f(PARAMS, xs, ys))
  values, per_example = _unpadded_values_and_grads(validated, data)
  for g, want in zip(got, values, strict=True):
    assert g == pytest.approx(want, rel=1e-4)
  grads = jax.grad(lambda p: jnp.sum(f(p, xs, ys)))(PARAMS)
  want = [sum(float(g[i]) for g in per_example) for i in range(3)]
  np.testing.assert_allclose([float(g) for g in grads], want, rtol=1e-3)
  jf = pj.jit(validated, fallback="error")
  reference = jax.jit(validated)   # the unpadded call: a compile per length, not op by op
  for n in (2, 6, 11):
    x, y = _data(n)
    assert float(jf(PARAMS, x, y)) == pytest.approx(float(reference(PARAMS, x, y)), rel=1e-4)
  assert (jax.ensure_compile_time_eval, pe.DynamicJaxprTrace.process_primitive) == before


def test_numpyro_validation_still_rejects_a_constant_invalid_parameter():
  def bad(x):
    return dist.Normal(jnp.zeros(x.shape[0]), -1.0, validate_args=True).log_prob(x).sum()
  with pytest.raises(ValueError, match="invalid scale"):
    jax.jit(bad)(np.ones(4, np.float32))
  with pytest.raises(ValueError, match="invalid scale"):
    pj.jit(bad, fallback="error")(np.ones(4, np.float32))
