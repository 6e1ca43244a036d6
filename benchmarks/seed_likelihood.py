"""The seed workload: a Gaussian log-likelihood over vectors whose length changes.

Calls with distinct lengths drawn uniformly from [100, 10000], in one run:

* `jax.jit`: compiles every distinct length;
* hand-written: pad to the next power of two on the host, mask by hand;
* `pj.jit` automatic (no specs) and explicit (`polymorphic_shapes=["n", ...]`);
* steady state: the same calls again, everything compiled, against `jax.jit`
  on exact shapes it has already compiled;
* per-call overhead: a small input (100 values), `pj.jit` against `jax.jit`.

Targets (DESIGN.md section 5): total at least 30x less than `jax.jit`, within
1.15x of hand-written, steady state within 1.25x of `jax.jit`, at most 30 us
added per call.

    python benchmarks/seed_likelihood.py [--calls 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj


def loglik(x, mu, log_sigma):
  sigma = jnp.exp(log_sigma)
  z = (x - mu) / sigma
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


@jax.jit
def loglik_handmasked(x, n, mu, log_sigma):
  """What people write by hand: a mask from the true length."""
  sigma = jnp.exp(log_sigma)
  z = (x - mu) / sigma
  valid = jnp.arange(x.shape[0]) < n
  terms = jnp.where(valid, -0.5 * z * z - log_sigma, 0.0)
  return jnp.sum(terms) - 0.5 * n * jnp.log(2 * jnp.pi)


def handwritten(x, mu, log_sigma):
  n = x.shape[0]
  size = 1 << max(n - 1, 1).bit_length()
  padded = np.zeros(size, np.float32)
  padded[:n] = x
  return loglik_handmasked(padded, np.int32(n), mu, log_sigma)


def run_all(fn, data, params):
  """Total seconds for one call per array, each call waited for."""
  out = []
  t0 = time.perf_counter()
  for x in data:
    out.append(jax.block_until_ready(fn(x, *params)))
  return time.perf_counter() - t0, out


def compiles_of(fn, data, params):
  with pj.diagnostics.count_compiles() as compiles:
    seconds, outs = run_all(fn, data, params)
  return seconds, outs, len(compiles), sum(c.seconds for c in compiles)


def per_call_us(fn, x, params, repeats=2000):
  for _ in range(50):
    jax.block_until_ready(fn(x, *params))
  best = float("inf")
  for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(repeats):
      out = fn(x, *params)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - t0) / repeats)
  return best * 1e6


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=300)
  parser.add_argument("--low", type=int, default=100)
  parser.add_argument("--high", type=int, default=10_000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args(argv)

  rng = np.random.default_rng(opts.seed)
  lengths = rng.choice(np.arange(opts.low, opts.high + 1), opts.calls, replace=False)
  data = [rng.standard_normal(n).astype(np.float32) for n in lengths]
  params = (np.float32(0.1), np.float32(0.2))
  reference = [float(loglik(x.astype(np.float64), 0.1, 0.2)) for x in data[:20]]

  contenders = {
      "jax.jit": jax.jit(loglik),
      "hand-written pow2 + masks": handwritten,
      "pj.jit automatic": pj.jit(loglik),
      "pj.jit explicit": pj.jit(loglik, polymorphic_shapes=["n", None, None]),
  }
  rows = {}
  for name, fn in contenders.items():
    seconds, outs, n_compiles, compile_s = compiles_of(fn, data, params)
    err = max(abs(float(o) - r) / abs(r) for o, r in zip(outs, reference))
    rows[name] = {"total_s": seconds, "compiles": n_compiles, "compile_s": compile_s,
                  "max_rel_err": err}

  steady = {name: run_all(contenders[name], data, params)[0]
            for name in ("jax.jit", "pj.jit explicit", "hand-written pow2 + masks")}
  small = rng.standard_normal(100).astype(np.float32)
  overhead = {name: per_call_us(contenders[name], small, params)
              for name in ("jax.jit", "pj.jit explicit", "pj.jit automatic")}

  jit_total = rows["jax.jit"]["total_s"]
  hand_total = rows["hand-written pow2 + masks"]["total_s"]
  print(f"{opts.calls} calls, {len(set(lengths))} distinct lengths in [{opts.low}, {opts.high}]")
  print(f"{'contender':<28}{'total s':>9}{'compiles':>10}{'compile s':>11}"
        f"{'vs jax.jit':>12}{'vs hand':>9}{'max rel err':>13}")
  for name, r in rows.items():
    print(f"{name:<28}{r['total_s']:>9.2f}{r['compiles']:>10}{r['compile_s']:>11.2f}"
          f"{jit_total / r['total_s']:>11.1f}x{r['total_s'] / hand_total:>8.2f}x"
          f"{r['max_rel_err']:>13.1e}")
  ratio_steady = steady["pj.jit explicit"] / steady["jax.jit"]
  print(f"steady state (all compiled): jax.jit {steady['jax.jit']:.3f}s, pj.jit "
        f"{steady['pj.jit explicit']:.3f}s, hand-written {steady['hand-written pow2 + masks']:.3f}s"
        f" -> pj/jax {ratio_steady:.2f}x")
  added = overhead["pj.jit explicit"] - overhead["jax.jit"]
  print(f"per call on 100 values: jax.jit {overhead['jax.jit']:.1f} us, pj.jit explicit "
        f"{overhead['pj.jit explicit']:.1f} us, automatic {overhead['pj.jit automatic']:.1f} us"
        f" -> {added:+.1f} us added")

  result = {
      "meta": {"jax": jax.__version__, "polyjit": pj.__version__,
               "machine": platform.machine(), "device": str(jax.devices()[0]),
               "calls": opts.calls, "low": opts.low, "high": opts.high},
      "rows": rows, "steady_s": steady, "per_call_us": overhead,
      "ratios": {"speedup_vs_jax_jit": jit_total / rows["pj.jit explicit"]["total_s"],
                 "speedup_auto_vs_jax_jit": jit_total / rows["pj.jit automatic"]["total_s"],
                 "vs_handwritten": rows["pj.jit explicit"]["total_s"] / hand_total,
                 "auto_vs_handwritten": rows["pj.jit automatic"]["total_s"] / hand_total,
                 "steady_vs_jax_jit": ratio_steady, "added_us_per_call": added},
  }
  if opts.json:
    with open(opts.json, "w") as fh:
      json.dump(result, fh, indent=1)
  return result


if __name__ == "__main__":
  main()
