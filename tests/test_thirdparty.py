"""Code nobody here wrote: library functions over a variable number of tokens.

Each row masks a function from jax.scipy, optax, Equinox or NumPyro as it is,
over a variable number of observations or tokens, and compares it with the
unpadded call (harness.check: NaN, inf and huge values in the padding), under
jit and under grad; gradients are taken with respect to the padded data and
to the unpadded parameters (distribution parameters, model weights).

A row whose package is missing is skipped (pytest.importorskip); the packages
are in the `test` extra of pyproject.toml.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import pytest
from jax import lax

from harness import Case, check, const, ints, make, normal, positive

MODES = ("jit", "grad")
SIZES = ({"n": 1}, {"n": 6})
D, V = 4, 5      # feature width, vocabulary size


def _maybe(name):
  try:
    return importlib.import_module(name)
  except ImportError:
    return None


optax = _maybe("optax")
eqx = _maybe("equinox")
numpyro_dist = _maybe("numpyro.distributions")


def row(package, name, fun, in_shapes, *pieces, **kw):
  """A table row: (package it needs, Case)."""
  return package, Case(name, fun, in_shapes, make(*pieces), sizes=SIZES, modes=MODES,
                       rtol=1e-4, atol=1e-4, compiled=True, **kw)


def spd(rng, sizes):
  """A well-conditioned symmetric positive definite (n, n) matrix."""
  a = rng.standard_normal((sizes["n"], sizes["n"])).astype(np.float32)
  return (a @ a.T / sizes["n"] + 2.0 * np.eye(sizes["n"], dtype=np.float32)).astype(np.float32)


def _stats(x, weights, loc, scale):
  stats = jsp.stats
  return (stats.norm.logpdf(x, loc, scale).sum(), stats.t.logpdf(x, 4.0, loc, scale).sum(),
          stats.gamma.logpdf(jnp.abs(x) + 0.1, 2.0, scale=scale).sum(),
          stats.logistic.logpdf(x, loc, scale).sum(), stats.norm.logcdf(x, loc, scale).sum(),
          jsp.special.logsumexp(x, b=weights))


def _mvn_logpdf(xs, mean, cov_factor):
  cov = cov_factor @ cov_factor.T + jnp.eye(D)
  return jsp.stats.multivariate_normal.logpdf(xs, mean, cov).sum()


def _linalg(a, b):
  sign, logdet = jnp.linalg.slogdet(a)
  return (jsp.linalg.cho_solve(jsp.linalg.cho_factor(a, lower=True), b), sign * logdet,
          jsp.linalg.solve_triangular(jnp.tril(a), b[:, 0], lower=True))


# --- optax -------------------------------------------------------------------

def _token_losses(logits, labels, targets):
  losses = optax.losses
  return (losses.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
          losses.softmax_cross_entropy(logits, optax.smooth_labels(jax.nn.one_hot(labels, V), 0.1)).sum(),
          losses.sigmoid_binary_cross_entropy(logits[:, 0], targets > 0).mean(),
          losses.huber_loss(logits[:, 1], targets, delta=0.5).sum(),
          losses.kl_divergence(jax.nn.log_softmax(logits), jax.nn.softmax(logits[::-1])).mean(),
          losses.cosine_similarity(logits[:, :2], logits[:, 2:4]).sum())


# --- Equinox -----------------------------------------------------------------

def _eqx_model(kind):
  key = jax.random.key(0)
  if kind == "attention":
    return eqx.nn.MultiheadAttention(num_heads=2, query_size=D, key=key)
  if kind == "layer_norm":
    return eqx.nn.LayerNorm(D)
  return eqx.nn.GRUCell(D, D, key=key)


def _eqx_params(kind):
  """The model's arrays, as an argument generator piece (NumPy leaves)."""
  def gen(rng, sizes):
    params, _ = eqx.partition(_eqx_model(kind), eqx.is_array)
    return jax.tree.map(np.asarray, params)
  return gen


def _eqx_apply(kind):
  def fun(x, params):
    _, static = eqx.partition(_eqx_model(kind), eqx.is_array)
    model = eqx.combine(params, static)
    if kind == "attention":
      return model(x, x, x)
    if kind == "layer_norm":
      return jax.vmap(model)(x)
    def step(h, xt):
      h = model(xt, h)
      return h, h
    return lax.scan(step, jnp.zeros(D), x)
  fun.__name__ = f"eqx_{kind}"
  return fun


# --- NumPyro -----------------------------------------------------------------

def _numpyro_log_probs(x, counts, loc, scale):
  dist = numpyro_dist
  logits = x[:, None] * jnp.arange(V) * scale
  return (dist.Normal(loc, scale).log_prob(x).sum(), dist.StudentT(3.0, loc, scale).log_prob(x).sum(),
          dist.Gamma(2.0, scale).log_prob(jnp.abs(x) + 0.1).sum(),
          dist.Poisson(scale * 3.0).log_prob(counts).sum(),
          dist.Bernoulli(logits=x * scale).log_prob(counts % 2).sum(),
          dist.Laplace(loc, scale).log_prob(x).mean(),
          dist.Categorical(logits=logits).log_prob(counts % V).sum())


def _numpyro_mvn(xs, loc, tril):
  scale_tril = jnp.tril(tril, -1) + 2.0 * jnp.eye(D)
  return numpyro_dist.MultivariateNormal(loc, scale_tril=scale_tril).log_prob(xs).sum()



ROWS = [
    row("jax", "scipy_stats_and_logsumexp", _stats, ["n", "n", None, None],
        normal("n"), positive("n"), const(np.float32(0.3)), const(np.float32(1.7))),
    row("jax", "scipy_multivariate_normal", _mvn_logpdf, ["(n, _)", None, None],
        normal("n", D), normal(D), normal(D, D)),
    row("jax", "scipy_linalg", _linalg, ["(n, n)", "(n, _)"], spd, normal("n", 2)),
    row("optax", "optax_token_losses", _token_losses, ["(n, _)", "n", "n"],
        normal("n", V), ints("n", low=0, high=V), normal("n")),
    row("equinox", "equinox_attention", _eqx_apply("attention"), ["(n, _)", None],
        normal("n", D), _eqx_params("attention")),
    row("equinox", "equinox_layer_norm", _eqx_apply("layer_norm"), ["(n, _)", None],
        normal("n", D), _eqx_params("layer_norm")),
    row("equinox", "equinox_gru_cell_scan", _eqx_apply("gru"), ["(n, _)", None],
        normal("n", D), _eqx_params("gru")),
    row("numpyro", "numpyro_log_probs", _numpyro_log_probs, ["n", "n", None, None],
        normal("n"), ints("n", low=0, high=6), const(np.float32(0.2)), const(np.float32(1.3))),
    row("numpyro", "numpyro_multivariate_normal", _numpyro_mvn, ["(n, _)", None, None],
        normal("n", D), normal(D), normal(D, D)),
]

ROWS_BY_NAME = {case.name: (package, case) for package, case in ROWS}
assert len(ROWS_BY_NAME) == len(ROWS), "case names must be unique"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ROWS_BY_NAME))
def test_thirdparty(name, mode):
  package, case = ROWS_BY_NAME[name]
  pytest.importorskip(package)
  check(case, mode)
