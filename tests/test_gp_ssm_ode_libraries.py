"""tinygp, dynamax and diffrax called in a loop at sizes that change.

Code nobody here wrote, as a new user calls it under `pj.jit`:

* tinygp: `GaussianProcess(kernel, x, diag=...).log_probability(y)`, n = 40..400
  (tinygp adds the diagonal with `K.at[jnp.diag_indices(n)].add(diag)`);
* dynamax: `LinearGaussianSSM`'s filter and `marginal_log_prob`, T = 20..200
  (its `preprocess_args` runs `num_timesteps = len(emissions)`);
* diffrax: `diffeqsolve(..., saveat=SaveAt(ts=ts))`, len(ts) = 10..100.

Each result equals `jax.jit`'s on the unpadded input (rtol 1e-4), and tinygp
and dynamax compile at most half as many programs as sizes (jax.monitoring;
power-of-two buckets).
diffrax gets past `SaveAt`'s `len(ts) > 0` but its step saves the requested
times with `inner_while_loop(..., max_steps=len(ts), checkpoints=len(ts))`
(diffrax 0.7.2, _integrate.py:480), and Equinox's while loop refuses any
max_steps that is not exactly an int: `if type(max_steps) is not int: raise
ValueError` (equinox 0.13.8, internal/_loop/common.py:477). `type()` reads
the C type, which no hook reaches (isinstance is answered, `size_class.py`),
and only a real int passes, which would be one size. (With that line passed by
hand, the next refusals are Equinox's own primitives, `unvmap_any` and
`maybe_set`, which have no masking rules.) So it cannot trace at a dynamic
size: the test checks that this is announced with the reason, and that the
per-size fallback is exact. Each test is skipped where its library is not installed
(none is a dependency of polyjit or of its test extra).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def _run(fun, data, *, fallback="error"):
  # Powers of two: the programs do not depend on measured times (the default,
  # cost-aware policy buys buckets from them: 4-5 programs for these 8 sizes).
  jf = pj.jit(fun, fallback=fallback, buckets=pj.buckets.PowersOfTwo())
  with pj.diagnostics.count_compiles() as compiles:
    outs = [jf(*args) for args in data]
  for out, args in zip(outs, data, strict=True):
    want = jax.jit(fun)(*args)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                         rtol=1e-4, atol=1e-5), out, want)
  # The function's programs (a library's eager constant, a scalar program, is not one).
  return len([c for c in compiles if fun.__name__ in c.fun_name])


def test_tinygp_log_probability_over_sizes():
  tinygp = pytest.importorskip("tinygp")

  def log_prob(x, y):
    gp = tinygp.GaussianProcess(1.3 * tinygp.kernels.ExpSquared(0.5), x, diag=0.1)
    return gp.log_probability(y)

  sizes = (40, 70, 110, 160, 220, 280, 340, 400)
  data = []
  for n in sizes:
    x = np.sort(np.random.default_rng(n).uniform(0, 10, n)).astype(np.float32)
    data.append((x, np.sin(x).astype(np.float32)))
  assert _run(log_prob, data) <= len(sizes) // 2


def test_dynamax_lgssm_filter_and_marginal_log_prob_over_lengths():
  pytest.importorskip("dynamax")
  from dynamax.linear_gaussian_ssm import LinearGaussianSSM
  from dynamax.linear_gaussian_ssm.inference import lgssm_filter

  model = LinearGaussianSSM(2, 3)
  params, _ = model.initialize(jax.random.PRNGKey(0))

  def filtered(y):
    post = lgssm_filter(params, y)
    return post.marginal_loglik, post.filtered_means, model.marginal_log_prob(params, y)

  sizes = (20, 45, 70, 95, 120, 145, 170, 200)
  data = [(np.random.default_rng(t).standard_normal((t, 3)).astype(np.float32),)
          for t in sizes]
  assert _run(filtered, data) <= len(sizes) // 2


def test_diffrax_saveat_ts_is_announced_with_its_reason_and_exact():
  diffrax = pytest.importorskip("diffrax")

  def solve(ts, y0):
    term = diffrax.ODETerm(lambda t, y, a: -0.5 * y + jnp.sin(t))
    return diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=0.0, t1=10.0, dt0=0.05, y0=y0,
                               saveat=diffrax.SaveAt(ts=ts),
                               stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5)).ys

  data = [(np.sort(np.random.default_rng(n).uniform(0, 10, n)).astype(np.float32),
           np.float32(1.0)) for n in (10, 30)]
  strict = pj.jit(solve, fallback="error", buckets=pj.buckets.PowersOfTwo())
  with pytest.raises(pj.MaskingError, match="max_steps"):   # once the size changes
    for args in data:
      strict(*args)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.FallbackWarning)
    _run(solve, data, fallback="warn")
