"""What masking costs: trace time, and run time at the same padded size.

For three workloads (the seed log-likelihood, softmax attention over tokens, a
scan RNN), in one run:

  (a) trace + mask: `jax.make_jaxpr` of `pj.mask(f)` on padded arguments (a
      fresh masked function, so the symbolic trace is included), against
      `jax.make_jaxpr(f)` on arrays of the same size. Target: at most 2x.
      The last two columns compare with `jax.make_jaxpr(f)` at a size JAX has
      not traced before (its jnp helpers retrace, as they do in every masked
      trace's fresh symbolic scope): what jax.jit pays per new size.
  (b) run time of the compiled `jit(mask(f))` against `jit(f)` at the same
      padded size. Target: at most 1.1x.

`--per-call`: the seed log-likelihood on 100 values, per call, interleaved:
`jax.jit` against `pj.jit` with one bucket of 128, 1024 or 16384 and against
the masked program alone at those sizes (`jax.jit(pj.mask(f))` on arguments
padded beforehand). Target: at most 12 us added per call.

    python benchmarks/mask_overhead.py [--quick] [--per-call] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import os  # noqa: E402
# Cold runs: no programs from an earlier run on disk (horizons.py measures warm ones;
# POLYJIT_NO_CACHE=0 turns polyjit's default on-disk cache back on).
os.environ.setdefault("POLYJIT_NO_CACHE", "1")
import polyjit as pj


def loglik(x, mu, log_sigma):
  sigma = jnp.exp(log_sigma)
  z = (x - mu) / sigma
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def attention(x, wq, wk, wv):
  q, k, v = x @ wq, x @ wk, x @ wv
  scores = q @ k.T / jnp.sqrt(q.shape[-1]).astype(x.dtype)
  return jnp.sum(jax.nn.softmax(scores, axis=-1) @ v)


def rnn(x, w, u):
  def step(h, xt):
    h = jnp.tanh(h @ w + xt @ u)
    return h, None
  h, _ = lax.scan(step, jnp.zeros(w.shape[0], x.dtype), x)
  return jnp.sum(h)


def workloads(quick: bool):
  rng = np.random.default_rng(0)
  n = 1024 if quick else 8192
  t, d = (128, 32) if quick else (512, 64)
  s, h = (128, 32) if quick else (512, 64)
  f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  return [
      ("seed loglik", loglik, ["n", None, None], [f32(n), np.float32(0.1), np.float32(0.2)]),
      ("attention", attention, ["(n, _)", None, None, None],
       [f32(t, d), f32(d, d) * 0.1, f32(d, d) * 0.1, f32(d, d) * 0.1]),
      ("scan rnn", rnn, ["(n, _)", None, None], [f32(s, h), f32(h, h) * 0.1, f32(h, h) * 0.1]),
  ]


def best_of(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def interleaved_run_times(fns, args_list, repeats: int, inner: int = 20) -> list[float]:
  """Best per-call time of each compiled function, measured in alternation so
  that load on the machine affects every contender alike."""
  for fn, args in zip(fns, args_list):
    jax.block_until_ready(fn(*args))
  best = [float("inf")] * len(fns)
  for _ in range(repeats):
    for i, (fn, args) in enumerate(zip(fns, args_list)):
      t0 = time.perf_counter()
      for _ in range(inner):
        out = fn(*args)
      jax.block_until_ready(out)
      best[i] = min(best[i], (time.perf_counter() - t0) / inner)
  return best


def measure(name, f, specs, args, repeats):
  size = args[0].shape[0]
  env = {"n": np.int32(size * 3 // 4)}
  # Fresh functions each time: make_jaxpr caches traces per function.
  trace_plain = best_of(lambda: jax.make_jaxpr(lambda *a: f(*a))(*args), repeats)
  trace_masked = best_of(
      lambda: jax.make_jaxpr(lambda a, e: pj.mask(f, specs)(a, e))(args, env), repeats)
  # JAX at a size it has not traced before (what jax.jit pays for each new size):
  # its jnp helpers' trace caches miss too, as a masked trace's do (a fresh
  # symbolic scope per trace, `_spec.fresh_scope`).
  sizes = iter(range(size + 1, size + 10 * repeats + 10))

  def new_shape():
    m = next(sizes)
    grown = [np.resize(args[0], (m, *args[0].shape[1:])), *args[1:]]
    t0 = time.perf_counter()
    jax.make_jaxpr(lambda *a: f(*a))(*grown)
    return time.perf_counter() - t0
  trace_new_shape = min(new_shape() for _ in range(repeats))
  masked_fn = pj.mask(f, specs)
  plain = jax.jit(f)
  masked = jax.jit(lambda a, e: masked_fn(a, e))
  run_plain, run_masked = interleaved_run_times(
      [plain, lambda *a: masked(a, env)], [args, args], repeats)
  return {
      "workload": name, "padded_size": size, "logical_size": int(env["n"]),
      "trace_plain_ms": trace_plain * 1e3, "trace_masked_ms": trace_masked * 1e3,
      "trace_ratio": trace_masked / trace_plain,
      "trace_plain_new_shape_ms": trace_new_shape * 1e3,
      "trace_ratio_new_shape": trace_masked / trace_new_shape,
      "run_plain_us": run_plain * 1e6, "run_masked_us": run_masked * 1e6,
      "run_ratio": run_masked / run_plain,
  }


def per_call_us(rounds: int) -> dict:
  """Per call on 100 values (see the module docstring), best of `rounds`."""
  try:
    from benchmarks.seed_likelihood import interleaved_per_call_us, loglik as seed
  except ImportError:  # run as a script from benchmarks/
    from seed_likelihood import interleaved_per_call_us, loglik as seed
  small = np.random.default_rng(0).standard_normal(100).astype(np.float32)
  params = (np.float32(0.1), np.float32(0.2))
  fns = {"jax.jit": jax.jit(seed)}
  masked = jax.jit(pj.mask(seed, ["n", None, None]))
  for size in (128, 1024, 16384):
    fns[f"pj.jit bucket {size}"] = pj.jit(seed, polymorphic_shapes=["n", None, None],
                                          buckets=pj.buckets.Explicit([size]))
    padded = (np.pad(small, (0, size - small.size)), *params)
    fns[f"masked program alone {size}"] = (
        lambda padded: lambda *_: masked(padded, {"n": np.int32(small.size)}))(padded)
  return interleaved_per_call_us(fns, small, params, rounds=rounds, repeats=300)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
  parser.add_argument("--per-call", action="store_true", help="also the per-call overhead")
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args(argv)
  repeats = 3 if opts.quick else 15
  rows = [measure(*w, repeats=repeats) for w in workloads(opts.quick)]
  print(f"{'workload':<14}{'size':>6}{'trace jax ms':>14}{'trace pj ms':>13}{'ratio':>7}"
        f"{'run jax us':>12}{'run pj us':>11}{'ratio':>7}{'jax new size ms':>17}{'ratio':>7}")
  for r in rows:
    print(f"{r['workload']:<14}{r['padded_size']:>6}{r['trace_plain_ms']:>14.2f}"
          f"{r['trace_masked_ms']:>13.2f}{r['trace_ratio']:>7.2f}{r['run_plain_us']:>12.1f}"
          f"{r['run_masked_us']:>11.1f}{r['run_ratio']:>7.2f}"
          f"{r['trace_plain_new_shape_ms']:>17.2f}{r['trace_ratio_new_shape']:>7.2f}")
  per_call = per_call_us(5 if opts.quick else 15) if opts.per_call else None
  if per_call:
    print("per call on 100 values (us): " + ", ".join(f"{k} {v:.1f}" for k, v in per_call.items()))
  if opts.json:
    meta = {"jax": jax.__version__, "machine": platform.machine(),
            "processor": platform.processor(), "device": str(jax.devices()[0])}
    with open(opts.json, "w") as fh:
      json.dump({"meta": meta, "rows": rows, "per_call_us": per_call}, fh, indent=1)
  return rows


if __name__ == "__main__":
  main()
