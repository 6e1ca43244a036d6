"""Programs per sizes for code nobody here wrote: tinygp, dynamax, diffrax.

    python benchmarks/library_programs.py

Each function is called at 8 sizes under `pj.jit` (power-of-two buckets, and
the default cost-aware policy) and under `jax.jit` (the peer: one program per
size). Printed per library and policy: polyjit's programs (counted with
`pj.diagnostics.count_compiles`, the function's own programs only), jax.jit's,
their ratio, polyjit's calls that fell back to an exact program, and the
largest relative difference from jax.jit's result (each checked at rtol 1e-4).
A library that is not installed is skipped.

  tinygp   GaussianProcess(1.3 * ExpSquared(0.5), x, diag=0.1).log_probability(y),
           n = 40..400
  dynamax  LinearGaussianSSM(2, 3): lgssm_filter and marginal_log_prob, T = 20..200
  diffrax  diffeqsolve(Tsit5, PIDController, saveat=SaveAt(ts=ts)), len(ts) = 10..100
"""

from __future__ import annotations

import importlib.util
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj


def _tinygp() -> tuple:
  import tinygp

  def log_prob(x, y):
    gp = tinygp.GaussianProcess(1.3 * tinygp.kernels.ExpSquared(0.5), x, diag=0.1)
    return gp.log_probability(y)

  data = []
  for n in (40, 70, 110, 160, 220, 280, 340, 400):
    x = np.sort(np.random.default_rng(n).uniform(0, 10, n)).astype(np.float32)
    data.append((x, np.sin(x).astype(np.float32)))
  return log_prob, data


def _dynamax() -> tuple:
  from dynamax.linear_gaussian_ssm import LinearGaussianSSM
  from dynamax.linear_gaussian_ssm.inference import lgssm_filter

  model = LinearGaussianSSM(2, 3)
  params, _ = model.initialize(jax.random.PRNGKey(0))

  def filtered(y):
    post = lgssm_filter(params, y)
    return post.marginal_loglik, post.filtered_means, model.marginal_log_prob(params, y)

  data = [(np.random.default_rng(t).standard_normal((t, 3)).astype(np.float32),)
          for t in (20, 45, 70, 95, 120, 145, 170, 200)]
  return filtered, data


def _diffrax() -> tuple:
  import diffrax

  def solve(ts, y0):
    term = diffrax.ODETerm(lambda t, y, a: -0.5 * y + jnp.sin(t))
    return diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=0.0, t1=10.0, dt0=0.05, y0=y0,
                               saveat=diffrax.SaveAt(ts=ts),
                               stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5)).ys

  data = [(np.sort(np.random.default_rng(n).uniform(0, 10, n)).astype(np.float32),
           np.float32(1.0)) for n in (10, 23, 37, 50, 64, 77, 90, 100)]
  return solve, data


def _programs(fun, data, jit) -> tuple[int, list]:
  with pj.diagnostics.count_compiles() as compiles:
    outs = [jit(*args) for args in data]
  return len([c for c in compiles if fun.__name__ in c.fun_name]), outs


def main() -> None:
  for name, make in (("tinygp", _tinygp), ("dynamax", _dynamax), ("diffrax", _diffrax)):
    if importlib.util.find_spec(name) is None:
      print(f"{name}: not installed, skipped")
      continue
    fun, data = make()
    peer, wants = _programs(fun, data, jax.jit(fun))
    for policy, buckets in (("powers of two", pj.buckets.PowersOfTwo()), ("default", None)):
      f = pj.jit(fun, **({} if buckets is None else {"buckets": buckets}))
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", pj.FallbackWarning)
        programs, outs = _programs(fun, data, f)
      worst = 0.0
      for out, want in zip(outs, wants, strict=True):
        for o, w in zip(jax.tree.leaves(out), jax.tree.leaves(want), strict=True):
          o, w = np.asarray(o), np.asarray(w)
          np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-5)
          worst = max(worst, float(np.max(np.abs(o - w) / (np.abs(w) + 1e-5))))
      print(f"{name:8s} {policy:13s} sizes {len(data)}  pj.jit programs {programs:2d}  "
            f"jax.jit {peer:2d}  ratio {programs / peer:.2f}  "
            f"fallback calls {pj.stats(f).fallback_calls}  max rel diff {worst:.1e}")


if __name__ == "__main__":
  main()
