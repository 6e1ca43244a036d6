"""Forward-mode differentiation of masked functions (issue 26).

`jax.jvp`, `jax.jacfwd`, `jax.linearize`, `jax.hessian` (jacfwd over jacrev) and
`jax.linear_transpose` of `pj.mask`, of `jax.jit(pj.mask)` with traced sizes and
of a loss built on `pj.vmap` over a `pj.Ragged` batch, against JAX on the
unpadded data. Every padding holds NaN and inf: results must be exact, finite,
and zero in the padding (as reverse mode always was).

Each function's `jax.jvp` of pj.mask runs eagerly (as every rule table row's
jvp mode does: tests/harness.py); its linearize, jacfwd, Hessian and
jacrev-of-jacrev run under `jax.jit` with the same concrete sizes (eager JAX
dispatched each op of a Hessian by itself, compiling every op at every shape:
most of this module's time). The eager Hessian of pj.mask is checked by
test_forward_over_forward_and_hessian_of_parameters and
test_hessian_of_a_loss_on_pj_vmap_over_ragged. References run under jax.jit.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from harness import reference_options

N, P = 5, 8


def _padded(valid: np.ndarray, size: int = P) -> np.ndarray:
  out = np.full((size,) + valid.shape[1:], np.nan, np.float32)
  out[size - 1] = np.inf
  out[:len(valid)] = valid
  return out


X = (np.arange(1, N + 1, dtype=np.float32) * 0.3 - 0.7)
T = np.linspace(-1.0, 1.0, N).astype(np.float32)


def _attention(x):
  q = jnp.outer(x, jnp.arange(1.0, 4.0))
  w = jax.nn.softmax(q @ q.T / 3.0, axis=-1)
  return jnp.sum((w @ q) ** 2)


FUNCTIONS = {
    "cumsum_var": lambda x: jnp.sum(jnp.cumsum(x) ** 2) / x.shape[0] + jnp.var(x),
    "logsumexp": lambda x: jax.nn.logsumexp(jnp.sin(x) * 3.0) * jnp.mean(x ** 2),
    "attention": _attention,
    "sort": lambda x: jnp.sum(jnp.sort(x) * jnp.arange(x.shape[0])) + jnp.sum(x ** 3),
    "cholesky": lambda x: jnp.sum(jnp.linalg.cholesky(
        jnp.outer(x, x) * 0.1 + jnp.eye(x.shape[0]) * 2.0) * jnp.cos(x)[:, None]),
}


def _close(got, want, rtol=2e-4, atol=2e-5):
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_jvp_jacfwd_linearize_hessian_of_pj_mask(name):
  f = FUNCTIONS[name]
  m = pj.mask(f, ["n"])
  g = lambda xp: m([xp], {"n": N})  # noqa: E731
  x, t = _padded(X), _padded(T)
  y, ty = jax.jvp(g, (x,), (t,))   # eagerly
  # the references (JVP, gradient, Hessian on the unpadded X) in one program
  (want_y, want_ty), want_grad, want_hess = jax.jit(
      lambda x, t: (jax.jvp(f, (x,), (t,)), jax.grad(f)(x), jax.hessian(f)(x)),
      compiler_options=reference_options())(X, T)
  _close(y, want_y)
  _close(ty, want_ty)
  _close(jax.jit(lambda x, t: jax.linearize(g, x)[1](t))(x, t), want_ty)
  jac = np.asarray(jax.jit(jax.jacfwd(g))(x))
  _close(jac[:N], want_grad)
  assert np.all(jac[N:] == 0)
  hess = np.asarray(jax.jit(jax.hessian(g))(x))
  assert np.all(np.isfinite(hess))
  _close(hess[:N, :N], want_hess, rtol=1e-3, atol=1e-4)
  assert np.all(hess[N:] == 0) and np.all(hess[:, N:] == 0)
  # reverse over reverse, the spelling that always worked, agrees
  _close(jax.jit(jax.jacrev(jax.jacrev(g)))(x), hess, rtol=1e-3, atol=1e-4)


def test_hessian_under_jax_jit_of_pj_mask_with_traced_sizes():
  f = FUNCTIONS["cumsum_var"]
  m = pj.mask(f, ["n"])
  hess = jax.jit(jax.hessian(lambda xp, n: m([xp], {"n": n})))
  sizes = (2, 5, 8)
  valids = [X[:n] if n <= N else np.linspace(-1, 1, n).astype(np.float32) for n in sizes]
  # each size's reference Hessian, in one program
  wants = jax.jit(lambda vs: [jax.hessian(f)(v) for v in vs],
                  compiler_options=reference_options())(valids)
  for n, valid, want in zip(sizes, valids, wants, strict=True):
    out = np.asarray(hess(_padded(valid, 16), np.int32(n)))
    _close(out[:n, :n], want, rtol=1e-3, atol=1e-4)
    assert np.all(out[n:] == 0) and np.all(out[:, n:] == 0)


def test_forward_over_forward_and_hessian_of_parameters():
  # Parameters are unpadded; the data is padded with NaN and inf.
  def loglik(x, theta):
    mu, log_sigma = theta[0], theta[1]
    z = (x - mu) / jnp.exp(log_sigma)
    return -0.5 * jnp.sum(z ** 2) - x.shape[0] * log_sigma

  m = pj.mask(loglik, ["n", None])
  theta = np.array([0.3, -0.2], np.float32)
  g = lambda th: m([_padded(X), th], {"n": N})  # noqa: E731
  want = jax.jit(jax.hessian(loglik, argnums=1))(X, theta)
  _close(jax.hessian(g)(theta), want, rtol=1e-4, atol=1e-4)   # eagerly
  _close(jax.jit(jax.jacfwd(jax.jacfwd(g)))(theta), want, rtol=1e-4, atol=1e-4)
  _close(jax.jit(jax.jacrev(jax.jacfwd(g)))(theta), want, rtol=1e-4, atol=1e-4)


def test_hessian_of_a_loss_on_pj_vmap_over_ragged():
  def loss_one(theta, x):
    return jnp.sum(jnp.tanh(theta[0] * x + theta[1]) ** 2) / x.shape[0] + jnp.var(x) * theta[0]

  rows = [np.linspace(-1, 1, n).astype(np.float32) for n in (3, 7, 5)]
  batch = pj.Ragged.from_list(rows)
  theta = np.array([0.7, -0.1], np.float32)
  loss = lambda th: pj.vmap(loss_one, in_axes=(None, 0))(th, batch).sum()  # noqa: E731
  ref = jax.jit(jax.hessian(lambda th: sum(loss_one(th, r) for r in rows)))(theta)
  _close(jax.hessian(loss)(theta), ref, rtol=1e-4, atol=1e-4)   # eagerly
  _close(jax.jit(jax.jacfwd(jax.grad(loss)))(theta), ref, rtol=1e-4, atol=1e-4)
  # jvp of the whole batch (eagerly)
  _, t = jax.jvp(loss, (theta,), (np.array([1.0, 0.5], np.float32),))
  _, want_t = jax.jit(lambda th, t: jax.jvp(lambda th: sum(loss_one(th, r) for r in rows),
                                            (th,), (t,)))(theta, np.array([1.0, 0.5], np.float32))
  _close(t, want_t)


def test_hessian_through_ragged_data_itself():
  # The Hessian with respect to the padded data of every example, per example
  # (jax.vmap of jax.hessian of a masked function with batched sizes).
  f = FUNCTIONS["logsumexp"]
  m = pj.mask(f, ["n"])
  sizes = np.array([3, 8, 5], np.int32)
  data = np.stack([_padded(np.linspace(-1, 1, n).astype(np.float32), 8) if n < 8
                   else np.linspace(-1, 1, 8).astype(np.float32) for n in sizes])
  out = np.asarray(jax.jit(jax.vmap(jax.hessian(lambda xp, n: m([xp], {"n": n}))))(data, sizes))
  # each example's reference Hessian, in one program
  wants = jax.jit(lambda vs: [jax.hessian(f)(v) for v in vs],
                  compiler_options=reference_options())(
      [np.linspace(-1, 1, n).astype(np.float32) for n in sizes])
  for row, n, want in zip(out, sizes, wants, strict=True):
    _close(row[:n, :n], want, rtol=1e-3, atol=1e-4)
    assert np.all(row[n:] == 0) and np.all(row[:, n:] == 0)


def test_reverse_mode_stays_nan_safe():
  f = FUNCTIONS["attention"]
  m = pj.mask(f, ["n"])
  g = jax.grad(lambda xp: m([xp], {"n": N}))(_padded(X))
  _close(g[:N], jax.grad(f)(X))
  assert np.all(np.asarray(g[N:]) == 0)


def test_linear_transpose_of_a_linear_masked_function():
  f = lambda x: jnp.cumsum(x)[::-1] * 2.0  # noqa: E731
  m = pj.mask(f, ["n"], "n")
  g = lambda xp: m([xp], {"n": N})  # noqa: E731
  ct = _padded(T)
  (out,) = jax.linear_transpose(g, _padded(X))(ct)
  (want,) = jax.linear_transpose(f, X)(T)
  _close(np.asarray(out)[:N], want)
  assert np.all(np.asarray(out)[N:] == 0)
