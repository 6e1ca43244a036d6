"""The cost model (`polyjit/_buckets/cost_model.py`) against measured call times.

For each benchmark function and each padded size P, a `pj.jit` with the one
bucket P runs never-seen sizes in (P/2, P] (so each call pays what a call in a
bucket pays: host padding, transfer, dispatch, the program) and the median
time per call (blocking on the result, as a user reading a float does) is set
against the model's `run_seconds` for that bucket. What the cost-aware policy
uses is the difference between two buckets (the waste of running in the larger
one), so the slope between sizes is reported too, measured and modelled.

    python benchmarks/cost_model_check.py [--sizes 1024,4096,16384,65536] [--calls 200]

Timings on a shared machine are noisy: the script interleaves sizes over
several rounds and keeps medians.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj
from polyjit._buckets.cost_model import CostModel


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def mlp(x, w1, w2):
  return jnp.sum(jnp.tanh(x @ w1) @ w2)


def rnn(xs, w):
  def step(h, x):
    h = jnp.tanh(h @ w + x)
    return h, h
  h, _ = jax.lax.scan(step, jnp.zeros(w.shape[0], xs.dtype), xs)
  return jnp.sum(h)


def cases(rng):
  f32 = np.float32
  yield ("seed loglik", loglik, ["n", None, None],
         lambda n: (rng.standard_normal(n).astype(f32), f32(0.1), f32(0.3)), 1)
  w1, w2 = rng.standard_normal((32, 64)).astype(f32), rng.standard_normal((64, 8)).astype(f32)
  yield ("mlp (n,32)@(32,64)@(64,8)", mlp, ["(n, _)", None, None],
         lambda n: (rng.standard_normal((n, 32)).astype(f32), w1, w2), 8)
  w = (rng.standard_normal((16, 16)) / 4).astype(f32)
  yield ("scan rnn width 16", rnn, ["(n, _)", None],
         lambda n: (rng.standard_normal((n, 16)).astype(f32), w), 64)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--sizes", default="1024,4096,16384,65536")
  parser.add_argument("--calls", type=int, default=200, help="calls per size and round")
  parser.add_argument("--rounds", type=int, default=3)
  a = parser.parse_args()
  rng = np.random.default_rng(0)
  print(f"jax {jax.__version__}, {jax.default_backend()}, calls {a.calls} x {a.rounds} rounds")
  for name, fun, specs, make, shrink in cases(rng):
    sizes = [max(int(s) // shrink, 2) for s in a.sizes.split(",")]
    fs = {p: pj.jit(fun, polymorphic_shapes=specs, buckets=[p]) for p in sizes}
    args = {p: [make(n) for n in np.linspace(p // 2 + 1, p, a.calls).astype(int)] for p in sizes}
    for p in sizes:  # compile, and the bucket's template
      float(fs[p](*args[p][0])), float(fs[p](*args[p][1]))
    times: dict[int, list[float]] = {p: [] for p in sizes}
    for _ in range(a.rounds):
      for p in sizes:
        t0 = time.perf_counter()
        for call in args[p]:
          float(fs[p](*call))
        times[p].append((time.perf_counter() - t0) / len(args[p]))
    struct = next(iter(fs[sizes[0]]._structures.values()))
    jaxpr = next(iter(struct.templates.values())).variant.traced.jaxpr
    model = CostModel(jaxpr, jax.default_backend())
    print(f"\n{name}: padded size, measured us/call, model us/call, model/measured")
    measured = {p: float(np.median(times[p])) for p in sizes}
    for p in sizes:
      est = model.run_seconds({"n": p})
      print(f"  {p:>7} {measured[p] * 1e6:9.1f} {est * 1e6:9.1f} {est / measured[p]:6.2f}")
    lo, hi = sizes[0], sizes[-1]
    m_slope = (measured[hi] - measured[lo]) / (hi - lo)
    e_slope = (model.run_seconds({"n": hi}) - model.run_seconds({"n": lo})) / (hi - lo)
    walls = [e.wall_seconds for f in fs.values() for e in f.stats.compile_events]
    print(f"  compile: measured {np.median(walls):.3f} s (median of {len(walls)}), model "
          f"{model.compile_seconds():.3f} s ({model.equations} equations, {model.loops} "
          f"loops), model/measured {model.compile_seconds() / np.median(walls):.2f}")
    print(f"  slope (waste per padded row) measured {m_slope * 1e9:.2f} ns, model "
          f"{e_slope * 1e9:.2f} ns, model/measured {e_slope / m_slope:.2f}")


if __name__ == "__main__":
  main()
