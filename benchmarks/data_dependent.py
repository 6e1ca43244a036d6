"""Data-dependent sizes: boolean selections inside compiled code.

Two workloads whose intermediate sizes depend on the data, in one run:

* **point cloud**: each call gets a cloud of N points (N changes every call),
  keeps those inside a ball and above a plane (`p[keep]`: a count that
  changes every call), and returns the count, mean, covariance and largest
  radius of the kept points;
* **nucleus (top-p) sampling**: softmax over V logits at a temperature that
  changes every call, keep the smallest prefix of the sorted probabilities
  whose mass reaches p (`sp[cum - sp < p]`: a data-dependent prefix),
  renormalize it and draw a token with a given uniform number.

Contenders, on the same inputs:

* `pj.jit` of the natural code (`x[m]`, automatic mode, no arguments), and the same
  with `buckets=pj.buckets.PowersOfTwo()` (the default before the cost-aware one);
* `jax.jit` of what users write today: host padding to a power of two, and
  the selection rewritten with masks (`where`, fill values, counts);
* `torch.compile(dynamic=True)` of the natural code (boolean indexing);
* eager NumPy of the natural code.

(`jax.jit` of the natural code raises NonConcreteBooleanIndexError.)
Results are checked against NumPy; totals include compiles; steady state is
the same calls again with everything compiled (the best of `--repeats`
passes, contenders interleaved). Target: at most one program
per input bucket, steady state within 1.2x of the hand-written `jax.jit`.

    python benchmarks/data_dependent.py [--calls 100] [--repeats 3] [--no-torch]
        [--json out.json]
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

try:  # run as `python benchmarks/data_dependent.py` or imported from the repository root
  from benchmarks import peers as _peers
except ImportError:
  import peers as _peers

try:
  import torch
except ImportError:  # the torch contender is skipped and named
  torch = None


# --- point cloud -------------------------------------------------------------

def cloud_stats(xp, p):
  """The natural code, for any array module with boolean indexing."""
  r2 = (p * p).sum(1)
  q = p[(r2 < 1.0) & (p[:, 2] > -0.25)]
  k = q.shape[0]
  mean = q.sum(0) / k
  c = q - mean
  cov = (c.T @ c) / (k - 1)
  return k, mean, cov, xp.sqrt(((q * q).sum(1)).max())


def cloud_jax(p):
  k, mean, cov, rmax = cloud_stats(jnp, p)
  return jnp.asarray(k), mean, cov, rmax


@jax.jit
def _cloud_hand(p, n):
  valid = jnp.arange(p.shape[0]) < n
  r2 = jnp.sum(p * p, 1)
  keep = valid & (r2 < 1.0) & (p[:, 2] > -0.25)
  k = jnp.sum(keep)
  mean = jnp.sum(jnp.where(keep[:, None], p, 0.0), 0) / k
  c = jnp.where(keep[:, None], p - mean, 0.0)
  cov = (c.T @ c) / (k - 1)
  return k, mean, cov, jnp.sqrt(jnp.max(jnp.where(keep, r2, -jnp.inf)))


def cloud_hand(p):
  n = p.shape[0]
  size = 1 << (n - 1).bit_length()
  padded = np.zeros((size, 3), p.dtype)
  padded[:n] = p
  return _cloud_hand(padded, n)


def cloud_inputs(calls, rng, lo, hi):
  return [(rng.normal(size=(int(n), 3)) * 0.8).astype(np.float32)
          for n in rng.integers(lo, hi, calls)]


# --- nucleus sampling --------------------------------------------------------

TOP_P = 0.9


def nucleus(xp, logits, u):
  """The natural code: sort, keep the top-p prefix, draw from it."""
  z = logits - logits.max()
  e = xp.exp(z)
  probs = e / e.sum()
  order = xp.argsort(-probs, stable=True) if xp is jnp else np.argsort(-probs, kind="stable")
  sp = probs[order]
  cum = xp.cumsum(sp)
  kept = sp[cum - sp < TOP_P]
  c = xp.cumsum(kept) / kept.sum()
  i = xp.minimum(xp.searchsorted(c, u), kept.shape[0] - 1)
  return order[i], kept.shape[0]


def nucleus_jax(logits, u):
  token, k = nucleus(jnp, logits, u)
  return token, jnp.asarray(k)


@jax.jit
def nucleus_hand(logits, u):
  z = logits - logits.max()
  e = jnp.exp(z)
  probs = e / e.sum()
  order = jnp.argsort(-probs, stable=True)
  sp = probs[order]
  cum = jnp.cumsum(sp)
  keep = cum - sp < TOP_P
  kp = jnp.where(keep, sp, 0.0)
  k = jnp.sum(keep)
  c = jnp.cumsum(kp) / kp.sum()
  c = jnp.where(keep, c, jnp.inf)   # the fill: past the prefix, never chosen
  i = jnp.minimum(jnp.searchsorted(c, u), k - 1)
  return order[i], k


def nucleus_inputs(calls, rng, vocab):
  base = rng.normal(size=vocab).astype(np.float32) * 3
  out = []
  for t in rng.uniform(0.3, 2.0, calls):
    out.append(((base / t + rng.normal(size=vocab) * 0.1).astype(np.float32),
                np.float32(rng.uniform())))
  return out


# --- torch -------------------------------------------------------------------

def torch_contenders():
  """torch.compile(dynamic=True) of the natural code, or why it is skipped."""
  if torch is None:
    return "torch is not installed"
  torch._dynamo.config.capture_scalar_outputs = True
  torch._dynamo.config.capture_dynamic_output_shape_ops = True
  _peers.fresh_inductor(torch)  # no caches; Inductor's start-up outside the timing

  def cloud(p):
    r2 = (p * p).sum(1)
    q = p[(r2 < 1.0) & (p[:, 2] > -0.25)]
    k = q.shape[0]
    mean = q.sum(0) / k
    c = q - mean
    return k, mean, (c.T @ c) / (k - 1), torch.sqrt((q * q).sum(1).max())

  def top_p(logits, u):
    probs = torch.softmax(logits, 0)
    sp, order = torch.sort(probs, descending=True, stable=True)
    cum = torch.cumsum(sp, 0)
    kept = sp[cum - sp < TOP_P]
    c = torch.cumsum(kept, 0) / kept.sum()
    i = torch.clamp(torch.searchsorted(c, u), max=kept.shape[0] - 1)
    return order[i], kept.shape[0]

  cloud_c = torch.compile(cloud, dynamic=True)
  top_p_c = torch.compile(top_p, dynamic=True)

  def run_cloud(p):
    with torch.no_grad():
      k, mean, cov, r = cloud_c(torch.from_numpy(p))
      return int(k), mean.numpy(), cov.numpy(), float(r)

  def run_top_p(logits, u):
    with torch.no_grad():
      token, k = top_p_c(torch.from_numpy(logits), torch.tensor([u]))
      return int(token.reshape(())), int(k)

  return run_cloud, run_top_p


# --- the run -----------------------------------------------------------------

def _block(out):
  return jax.block_until_ready(out) if not isinstance(out, (int, float)) else out


def _time(fn, inputs):
  outs = []
  t0 = time.perf_counter()
  for args in inputs:
    outs.append(_block(fn(*args)))
  return time.perf_counter() - t0, outs


def _compiles(fn, inputs):
  with pj.diagnostics.count_compiles() as log:
    total, outs = _time(fn, inputs)
  return total, outs, len(log)


def _check_cloud(outs, refs):
  for (k, mean, cov, r), (rk, rmean, rcov, rr) in zip(outs, refs):
    assert int(k) == rk
    np.testing.assert_allclose(np.asarray(mean), rmean, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(cov), rcov, rtol=2e-3, atol=2e-5)
    np.testing.assert_allclose(float(r), rr, rtol=1e-5)


def _check_top_p(outs, refs):
  """Tokens and prefix lengths equal NumPy's (float32 sums may move a tie at
  the boundary by one position; the count of such calls is reported)."""
  differ = sum(int(t) != rt or int(k) != rk for (t, k), (rt, rk) in zip(outs, refs))
  return differ


def run(opts) -> dict:
  rng = np.random.default_rng(0)
  torch_run = torch_contenders() if opts.torch else "skipped (--no-torch)"
  results: dict = {"machine": platform.machine(), "jax": jax.__version__,
                   "calls": opts.calls, "workloads": {}}

  clouds = [(p,) for p in cloud_inputs(opts.calls, rng, opts.min_points, opts.max_points)]
  refs = [cloud_stats(np, p.astype(np.float64)) for (p,) in clouds]
  contenders = {"pj.jit (natural code)": pj.jit(cloud_jax),
                "pj.jit, powers of two": pj.jit(cloud_jax, buckets=pj.buckets.PowersOfTwo()),
                "jax.jit hand-written (pad + masks)": cloud_hand,
                "numpy eager": lambda p: cloud_stats(np, p)}
  if isinstance(torch_run, tuple):
    contenders["torch.compile(dynamic=True)"] = torch_run[0]
  results["workloads"]["point cloud"] = _measure(contenders, clouds, refs, _check_cloud,
                                                       opts.repeats)

  logits = nucleus_inputs(opts.calls, rng, opts.vocab)
  refs = [tuple(int(v) for v in nucleus(np, l.astype(np.float64), float(u)))
          for l, u in logits]
  contenders = {"pj.jit (natural code)": pj.jit(nucleus_jax),
                "pj.jit, powers of two": pj.jit(nucleus_jax, buckets=pj.buckets.PowersOfTwo()),
                "jax.jit hand-written (pad + masks)": nucleus_hand,
                "numpy eager": lambda l, u: nucleus(np, l, u)}
  if isinstance(torch_run, tuple):
    contenders["torch.compile(dynamic=True)"] = torch_run[1]
  results["workloads"]["nucleus sampling"] = _measure(contenders, logits, refs, _check_top_p,
                                                            opts.repeats)
  if isinstance(torch_run, str):
    results["torch"] = torch_run
  return results


def _measure(contenders, inputs, refs, check, repeats: int) -> dict:
  """Totals (first pass, compiles included), then steady state: the best of
  `repeats` passes over the same inputs, the contenders interleaved so that
  load on a shared machine hits them alike."""
  rows = {}
  for name, fn in contenders.items():
    total, outs, compiles = _compiles(fn, inputs)
    differ = check(outs, refs)
    rows[name] = {"total_s": round(total, 3),
                  "jax_compiles": compiles if "jax" in name or "pj" in name else None}
    if differ is not None:
      rows[name]["calls_differing_from_numpy_float64"] = differ
  best = {name: float("inf") for name in contenders}
  for _ in range(repeats):
    for name, fn in contenders.items():
      best[name] = min(best[name], _time(fn, inputs)[0])
  for name, row in rows.items():
    row["steady_ms_per_call"] = round(1e3 * best[name] / len(inputs), 3)
  hand = rows["jax.jit hand-written (pad + masks)"]["steady_ms_per_call"]
  for row in rows.values():
    row["steady_vs_hand_written"] = round(row["steady_ms_per_call"] / hand, 2)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=100)
  parser.add_argument("--min-points", type=int, default=2000)
  parser.add_argument("--max-points", type=int, default=60000)
  parser.add_argument("--vocab", type=int, default=32000)
  parser.add_argument("--repeats", type=int, default=3, help="steady-state passes")
  parser.add_argument("--no-torch", dest="torch", action="store_false")
  parser.add_argument("--json", help="write the results here")
  opts = parser.parse_args()
  results = run(opts)
  for workload, rows in results["workloads"].items():
    print(f"\n{workload} ({opts.calls} calls)")
    print(f"{'contender':40s} {'total s':>8s} {'steady ms':>10s} {'vs hand':>8s} compiles")
    for name, row in rows.items():
      print(f"{name:40s} {row['total_s']:8.3f} {row['steady_ms_per_call']:10.3f} "
            f"{row['steady_vs_hand_written']:7.2f}x {row['jax_compiles']}"
            + (f"  (calls differing from NumPy float64: "
               f"{row['calls_differing_from_numpy_float64']})"
               if "calls_differing_from_numpy_float64" in row else ""))
  if "torch" in results:
    print("torch:", results["torch"])
  if opts.json:
    with open(opts.json, "w") as fh:
      json.dump(results, fh, indent=1)


if __name__ == "__main__":
  main()
