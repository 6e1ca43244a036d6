"""The seed workload: a Gaussian log-likelihood over vectors whose length changes.

One call per array, lengths drawn from a distribution (uniform or log-uniform
over [100, 10000], or a realistic sentence-length distribution), in one run:

* `jax.jit`: compiles every distinct length;
* hand-written: pad to the next power of two on the host, mask by hand;
* `pj.jit` automatic (no specs) and explicit (`polymorphic_shapes=["n", ...]`),
  each with the default buckets (cost-aware, computed estimates) and with
  powers of two (the default before), and explicit with
  `CostAware(estimates="measured")`;
* peers, where installed: `jax.export` with a symbolic length
  (`Exported.call`), `torch.compile` (default and `dynamic=True`),
  `tf.function(reduce_retracing=True)`;
* steady state: the same calls again, everything compiled, against `jax.jit`
  on exact shapes it has already compiled;
* per-call overhead: a small input (100 values), `pj.jit` against `jax.jit`,
  each a fresh function that has seen only that input;
* `--policies`: `pj.jit` with every bucket policy (programs, padding, time).

Targets (DESIGN.md section 5, issue 12): total at least 80x less than
`jax.jit`, 2x less than `torch.compile(dynamic=True)` and 1.5x less than
`tf.function(reduce_retracing=True)`; at most 12 us added per call.

    python benchmarks/seed_likelihood.py [--calls 300] [--distribution uniform]
        [--peers] [--policies] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import os  # noqa: E402
# Cold runs: no programs from an earlier run on disk (horizons.py measures warm ones;
# POLYJIT_NO_CACHE=0 turns polyjit's default on-disk cache back on).
os.environ.setdefault("POLYJIT_NO_CACHE", "1")
import polyjit as pj

try:
  from benchmarks import peers as _peers
except ImportError:  # run as a script from benchmarks/
  import peers as _peers


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


@jax.jit
def loglik_handmasked(x, n, mu, log_sigma):
  """What people write by hand: a mask from the true length."""
  z = (x - mu) * jnp.exp(-log_sigma)
  valid = jnp.arange(x.shape[0]) < n
  terms = jnp.where(valid, -0.5 * z * z - log_sigma, 0.0)
  return jnp.sum(terms) - 0.5 * n * jnp.log(2 * jnp.pi)


def handwritten(x, mu, log_sigma):
  n = x.shape[0]
  size = 1 << max(n - 1, 1).bit_length()
  padded = np.zeros(size, np.float32)
  padded[:n] = x
  return loglik_handmasked(padded, np.int32(n), mu, log_sigma)


def lengths_for(distribution: str, calls: int, low: int, high: int, rng) -> np.ndarray:
  if distribution == "uniform":
    return rng.choice(np.arange(low, high + 1), calls, replace=False)
  if distribution == "loguniform":
    return _distinct_loguniform(calls, low, high, rng)
  if distribution == "sentences":  # tokens per sentence: lognormal, median 20
    return np.clip(rng.lognormal(np.log(20.0), 0.6, calls).astype(int), 1, 512)
  raise ValueError(f"unknown distribution {distribution!r}")


def _distinct_loguniform(calls, low, high, rng):
  """Distinct lengths, log-uniform in [low, high]."""
  out: set[int] = set()
  while len(out) < calls:
    out.update(np.exp(rng.uniform(np.log(low), np.log(high), calls)).astype(int).tolist())
  return rng.permutation(sorted(out))[:calls]


def run_all(fn, data, params):
  """Total seconds for one call per array, each call waited for."""
  out = []
  t0 = time.perf_counter()
  for x in data:
    out.append(float(jax.block_until_ready(fn(x, *params))))
  return time.perf_counter() - t0, out


def measure(fn, data, params, count_peer_compiles=None):
  with pj.diagnostics.count_compiles() as compiles:
    seconds, outs = run_all(fn, data, params)
  n_compiles = len(compiles) if count_peer_compiles is None else count_peer_compiles()
  return {"total_s": seconds, "compiles": n_compiles,
          "compile_s": sum(c.seconds for c in compiles) if count_peer_compiles is None else None,
          "outs": outs}


def interleaved_per_call_us(fns: dict, x, params, rounds=15, repeats=400) -> dict:
  """Best time per call of each function on `x`, in alternation so that load
  on the machine affects every contender alike."""
  for fn in fns.values():
    for _ in range(50):
      jax.block_until_ready(fn(x, *params))
  best = dict.fromkeys(fns, float("inf"))
  for _ in range(rounds):
    for name, fn in fns.items():
      t0 = time.perf_counter()
      for _ in range(repeats):
        out = fn(x, *params)
      jax.block_until_ready(out)
      best[name] = min(best[name], (time.perf_counter() - t0) / repeats)
  return {name: t * 1e6 for name, t in best.items()}


POW2 = pj.buckets.PowersOfTwo()
MEASURED = pj.buckets.CostAware(estimates="measured")
POLICIES = {
    "PowersOfTwo()": pj.buckets.PowersOfTwo(),
    "Geometric(1.5)": pj.buckets.Geometric(1.5),
    "Geometric(1.25)": pj.buckets.Geometric(1.25),
    "Multiples(512)": pj.buckets.Multiples(512),
    "Explicit([1k, 2.5k, 5k, 10k])": pj.buckets.Explicit([1000, 2500, 5000, 10_000]),
    "CostAware() (default)": pj.buckets.CostAware(),
    "CostAware(estimates='measured')": pj.buckets.CostAware(estimates="measured"),
}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=300)
  parser.add_argument("--low", type=int, default=100)
  parser.add_argument("--high", type=int, default=10_000)
  parser.add_argument("--distribution", default="uniform",
                      choices=["uniform", "loguniform", "sentences"])
  parser.add_argument("--peers", action="store_true", help="also run the installed peers")
  parser.add_argument("--policies", action="store_true", help="also run every bucket policy")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args(argv)

  rng = np.random.default_rng(opts.seed)
  lengths = lengths_for(opts.distribution, opts.calls, opts.low, opts.high, rng)
  data = [rng.standard_normal(n).astype(np.float32) for n in lengths]
  params = (np.float32(0.1), np.float32(0.2))
  reference = [float(loglik(x.astype(np.float64), 0.1, 0.2)) for x in data]

  contenders = {
      "jax.jit": jax.jit(loglik),
      "hand-written pow2 + masks": handwritten,
      "pj.jit automatic": pj.jit(loglik),
      "pj.jit explicit": pj.jit(loglik, polymorphic_shapes=["n", None, None]),
      "pj.jit automatic, pow2": pj.jit(loglik, buckets=POW2),
      "pj.jit explicit, pow2": pj.jit(loglik, polymorphic_shapes=["n", None, None],
                                      buckets=POW2),
      "pj.jit explicit, measured": pj.jit(loglik, polymorphic_shapes=["n", None, None],
                                          buckets=MEASURED),
  }
  rows, skipped = {}, {}
  for name, fn in contenders.items():
    rows[name] = measure(fn, data, params)
  if opts.peers:
    for name, make in _peers.PEERS.items():
      fn = make()
      if isinstance(fn, str):
        skipped[name] = fn
        continue
      counter = (_peers.torch_compiles if name.startswith("torch") else
                 (lambda fn=fn: _peers.tf_traces(fn)) if name.startswith("tf") else None)
      rows[name] = measure(fn, data, params, counter)
  for r in rows.values():
    outs = r.pop("outs")
    r["max_rel_err"] = max(abs(o - e) / max(abs(e), 1.0) for o, e in zip(outs, reference))

  policies = {}
  if opts.policies:
    for name, policy in POLICIES.items():
      f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=policy)
      r = measure(f, data, params)
      r.pop("outs")
      r["padding_waste"] = pj.stats(f).padding_waste
      policies[name] = r

  steady = {name: run_all(contenders[name], data, params)[0]
            for name in ("jax.jit", "pj.jit explicit", "hand-written pow2 + masks")}
  small = rng.standard_normal(100).astype(np.float32)
  # Fresh functions that see only this input (after the run above, a small
  # input would run in whatever larger bucket the sizes left compiled).
  per_call = {"jax.jit": jax.jit(loglik),
              "pj.jit explicit": pj.jit(loglik, polymorphic_shapes=["n", None, None]),
              "pj.jit automatic": pj.jit(loglik),
              "pj.jit explicit, pow2": pj.jit(loglik, polymorphic_shapes=["n", None, None],
                                              buckets=POW2)}
  per_call["pj.jit explicit"](small, *params)
  (bucket,), = pj.stats(per_call["pj.jit explicit"]).buckets
  # The masked program alone, called on arguments padded beforehand to the
  # same bucket: what a call costs without polyjit's host work.
  masked = jax.jit(pj.mask(loglik, ["n", None, None]))
  padded_small = (np.pad(small, (0, bucket[1] - small.size)), *params)
  size = {"n": np.int32(small.size)}
  per_call["masked program alone"] = lambda *_: masked(padded_small, size)
  overhead = interleaved_per_call_us(per_call, small, params)

  report(opts, lengths, rows, skipped, policies, steady, overhead)
  jit_total = rows["jax.jit"]["total_s"]
  hand_total = rows["hand-written pow2 + masks"]["total_s"]
  best_pj = min(rows["pj.jit explicit"]["total_s"], rows["pj.jit automatic"]["total_s"])
  auto = rows["pj.jit automatic"]["total_s"]
  ratios = {"pow2_auto_vs_jax_jit": jit_total / rows["pj.jit automatic, pow2"]["total_s"],
            "pow2_explicit_vs_jax_jit": jit_total / rows["pj.jit explicit, pow2"]["total_s"],
            "default_vs_pow2_auto": auto / rows["pj.jit automatic, pow2"]["total_s"],
            "default_vs_pow2_explicit": rows["pj.jit explicit"]["total_s"]
                                        / rows["pj.jit explicit, pow2"]["total_s"],
            "measured_explicit_vs_jax_jit": jit_total / rows["pj.jit explicit, measured"]["total_s"],
            "pow2_added_us_per_call": overhead["pj.jit explicit, pow2"] - overhead["jax.jit"],
            "speedup_vs_jax_jit": jit_total / rows["pj.jit explicit"]["total_s"],
            "speedup_auto_vs_jax_jit": jit_total / rows["pj.jit automatic"]["total_s"],
            "vs_handwritten": rows["pj.jit explicit"]["total_s"] / hand_total,
            "auto_vs_handwritten": rows["pj.jit automatic"]["total_s"] / hand_total,
            "steady_vs_jax_jit": steady["pj.jit explicit"] / steady["jax.jit"],
            "added_us_per_call": overhead["pj.jit explicit"] - overhead["jax.jit"],
            "call_path_us": overhead["pj.jit explicit"] - overhead["masked program alone"]}
  for name in rows:
    if name.startswith(("torch", "tf.", "jax.export")):
      ratios[f"speedup_vs_{name}"] = rows[name]["total_s"] / best_pj
      ratios[f"auto_speedup_vs_{name}"] = rows[name]["total_s"] / auto
  result = {
      "meta": {"jax": jax.__version__, "polyjit": pj.__version__,
               "machine": platform.machine(), "device": str(jax.devices()[0]),
               "calls": opts.calls, "distinct_lengths": int(len(set(lengths))),
               "distribution": opts.distribution, "low": opts.low, "high": opts.high},
      "rows": rows, "skipped": skipped, "policies": policies, "steady_s": steady,
      "per_call_us": overhead, "ratios": ratios,
  }
  if opts.json:
    with open(opts.json, "w") as fh:
      json.dump(result, fh, indent=1)
  return result


def report(opts, lengths, rows, skipped, policies, steady, overhead):
  jit_total = rows["jax.jit"]["total_s"]
  hand_total = rows["hand-written pow2 + masks"]["total_s"]
  print(f"{opts.calls} calls, {len(set(lengths))} distinct lengths in "
        f"[{min(lengths)}, {max(lengths)}] ({opts.distribution})")
  print(f"{'contender':<32}{'total s':>9}{'compiles':>10}{'compile s':>11}"
        f"{'vs jax.jit':>12}{'vs hand':>9}{'max rel err':>13}")
  for name, r in rows.items():
    compile_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.2f}"
    compiles = "-" if r["compiles"] is None else str(r["compiles"])
    print(f"{name:<32}{r['total_s']:>9.2f}{compiles:>10}{compile_s:>11}"
          f"{jit_total / r['total_s']:>11.1f}x{r['total_s'] / hand_total:>8.2f}x"
          f"{r['max_rel_err']:>13.1e}")
  for name, why in skipped.items():
    print(f"{name:<32} skipped: {why}")
  for name, r in policies.items():
    print(f"  pj.jit buckets={name:<30} {r['total_s']:>7.2f}s {r['compiles']:>4} compiles "
          f"{r['padding_waste']:>5.0%} padding")
  print(f"steady state (all compiled): jax.jit {steady['jax.jit']:.3f}s, pj.jit "
        f"{steady['pj.jit explicit']:.3f}s, hand-written {steady['hand-written pow2 + masks']:.3f}s"
        f" -> pj/jax {steady['pj.jit explicit'] / steady['jax.jit']:.2f}x")
  added = overhead["pj.jit explicit"] - overhead["jax.jit"]
  print(f"per call on 100 values: jax.jit {overhead['jax.jit']:.1f} us, pj.jit explicit "
        f"{overhead['pj.jit explicit']:.1f} us, automatic {overhead['pj.jit automatic']:.1f} us"
        f", explicit with powers of two {overhead['pj.jit explicit, pow2']:.1f} us"
        f" -> {added:+.1f} us added (explicit); the masked program alone "
        f"{overhead['masked program alone']:.1f} us, so the call path adds "
        f"{overhead['pj.jit explicit'] - overhead['masked program alone']:+.1f} us")


if __name__ == "__main__":
  main()
