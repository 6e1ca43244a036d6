"""Fitting an AR(1) model to many time series of different lengths with pj.jit.

Each series has its own length (sensor logs, patient records, trading days), and
the model's log-likelihood and its gradient are evaluated on every series at every
step. `jax.jit` compiles once per distinct length; `pj.jit` compiles once per
bucket (powers of two) and gives the same values, which the script checks against
`jax.jit` on the first series.

    python examples/timeseries_likelihood.py            # seconds
    python examples/timeseries_likelihood.py --big      # 400 series up to 20,000 points
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj


def ar1_loglik(params: jax.Array, x: jax.Array) -> jax.Array:
  """Exact Gaussian AR(1) log-likelihood of one series (stationary start)."""
  phi, log_sigma = jnp.tanh(params[0]), params[1]
  sigma2 = jnp.exp(2 * log_sigma)
  first = -0.5 * (jnp.log(2 * jnp.pi * sigma2 / (1 - phi**2)) + x[0] ** 2 * (1 - phi**2) / sigma2)
  resid = x[1:] - phi * x[:-1]
  n = x.shape[0] - 1                       # the logical length: stays exact under padding
  rest = -0.5 * (n * jnp.log(2 * jnp.pi * sigma2) + jnp.sum(resid**2) / sigma2)
  return first + rest


def simulate(rng: np.random.Generator, n: int, phi: float, sigma: float) -> np.ndarray:
  x = np.empty(n, np.float32)
  x[0] = rng.normal(0, sigma / np.sqrt(1 - phi**2))
  noise = rng.normal(0, sigma, n)
  for t in range(1, n):
    x[t] = phi * x[t - 1] + noise[t]
  return x


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--big", action="store_true", help="400 series up to 20,000 points")
  parser.add_argument("--steps", type=int, default=None, help="gradient steps")
  args = parser.parse_args(argv)
  n_series, max_len, steps = (400, 20_000, 30) if args.big else (24, 600, 8)
  steps = args.steps or steps

  rng = np.random.default_rng(0)
  series = [simulate(rng, int(n), phi=0.7, sigma=0.5)
            for n in rng.integers(50, max_len, n_series)]
  print(f"{n_series} series, lengths {min(map(len, series))}..{max(map(len, series))}, "
        f"{len({len(s) for s in series})} distinct")

  grad = pj.jit(jax.value_and_grad(lambda p, x: -ar1_loglik(p, x)))
  reference = jax.jit(jax.value_and_grad(lambda p, x: -ar1_loglik(p, x)))
  value, g = grad(jnp.zeros(2), series[0])
  want_value, want_g = reference(jnp.zeros(2), series[0])
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  np.testing.assert_allclose(g, want_g, rtol=1e-4, atol=1e-4)

  params = np.zeros(2, np.float32)
  start = time.perf_counter()
  points = sum(map(len, series))
  for step in range(steps):
    total, total_g = 0.0, np.zeros(2)
    for x in series:
      value, g = grad(params, x)
      total, total_g = total + float(value), total_g + np.asarray(g)
    params = params - 1.0 * total_g / points
    print(f"step {step}: negative log-likelihood per point {total / points:.4f}")
  seconds = time.perf_counter() - start
  phi, sigma = float(jnp.tanh(params[0])), float(jnp.exp(params[1]))
  print(f"fitted phi={phi:.3f} (true 0.7), sigma={sigma:.3f} (true 0.5)")
  print(f"pj.jit: {pj.stats(grad).compiles} compiles for {len({len(s) for s in series})} distinct "
        f"lengths in {seconds:.1f} s; jax.jit would compile once per length")


if __name__ == "__main__":
  main()
