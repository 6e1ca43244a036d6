"""Every horizon of the seed workload in one run: first calls, long runs, steady state, warm.

The seed log-likelihood over vectors whose length changes every call (uniform
or log-uniform in [100, 10000], or `loguniform-wide`: log-uniform in [50, 20000],
issue 35's long run). Each contender runs in fresh processes with
its own fresh cache directory: first *cold* (empty cache), then *warm* (a
second process on the cache the cold one left, as when a script is run
again). Contenders:

* `numpy`: no JIT;
* `jax.jit`: a compile per length (capped at `--jax-calls` calls);
* `jax.jit+cache`: the same with JAX's persistent compilation cache on
  (everything kept: `jax_persistent_cache_min_compile_time_secs=0`);
* `pj.jit`: the default (cost-aware buckets, polyjit's on-disk cache on by
  default, in the contender's own directory);
* `pj.jit+sync`: the same with `jax_cpu_enable_async_dispatch=False` (set
  before JAX's backend starts: XLA:CPU then runs a program in the calling
  thread instead of handing it to its thread pool, as torch does; the call
  blocks for the program's run time). Plain `pj.jit` runs its small
  programs in the calling thread anyway (on a CPU client of its own,
  `polyjit/_jit/inline.py`), so the two differ by moving results between
  the clients;
* `torch.compile(dynamic=True)`: its on-disk caches on, as by default, in the
  contender's own directory; Inductor's one-time start-up (about 9 s in a
  fresh process) runs untimed before the timing, as does JAX's backend start;
* `torch.compile+1t`: the same with `torch.set_num_threads(1)` (on a loaded
  machine its spinning OpenMP threads wait to be scheduled);
* `tf.function(reduce_retracing=True)`, where TensorFlow is installed.

Each process reports the cumulative time after 1, 10, 100, 300, 1000, ...
calls (blocking on each result, as a user reading a float does), and the
steady state: the first 50 distinct lengths of its run, everything compiled,
interleaved over rounds, median per call. For `pj.jit` (15 rounds) the same
rounds also time its *floor*: the compiled bucket program of each of those sizes called
directly with a freshly padded NumPy buffer and its size scalars (what a call
cannot avoid), so `steady / floor` (the median of the per-round ratios) is
polyjit's own cost per call. Ratios are
taken within one run of this script; on a shared machine the absolute times
are noisy.

    python benchmarks/horizons.py [--calls 20000] [--jax-calls 300]
        [--distribution uniform|loguniform|loguniform-wide] [--only pj.jit,torch]
        [--json out.json]
        [--plot out.png]
    python benchmarks/horizons.py --rounds 3 --only pj.jit,torch.compile,jax.jit   # cold only,
        # interleaved over rounds (a loaded machine): medians and ranges
    python benchmarks/horizons.py --from-json out.json --plot out.png   # plot an earlier run
    python benchmarks/horizons.py --workload rnn --calls 60   # ragged RNN training steps
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

CHECKPOINTS = (1, 10, 100, 300, 1000, 3000, 10000, 20000, 100000, 1000000)
STEADY_SIZES = 50
_PJ: list = []  # the pj.jit function of this process, for its statistics
CONTENDERS = ("numpy", "jax.jit", "jax.jit+cache", "jax.jit+sync", "pj.jit", "pj.jit+sync",
              "torch.compile", "torch.compile+1t", "tf.function")


#: distribution -> (kind, smallest, largest length)
DISTRIBUTIONS = {"uniform": ("uniform", 100, 10000), "loguniform": ("log", 100, 10000),
                 "loguniform-wide": ("log", 50, 20000)}


def lengths(calls: int, distribution: str, seed: int = 0):
  import numpy as np
  rng = np.random.default_rng(seed)
  kind, low, high = DISTRIBUTIONS[distribution]
  if kind == "log":
    return np.exp(rng.uniform(np.log(low), np.log(high), calls)).astype(int)
  return rng.integers(low, high + 1, calls)


def describe(distribution: str) -> str:
  kind, low, high = DISTRIBUTIONS[distribution]
  return f"{'log-uniform' if kind == 'log' else 'uniform'} in [{low}, {high}]"


def floor_call(f, x, mu, ls):
  """A call of `f`'s compiled program for `x`'s size, as `pj.jit` makes it
  (`Plan.run_plain`: a fresh padded buffer as pj.jit pads, the plan's size
  scalars), reading the result."""
  from polyjit._jit.args import call_signature
  plan = f._hot[call_signature((x, mu, ls))]
  leaves = (x, mu, ls)
  return lambda: float(plan.run_plain(leaves))


# --- one contender in this process ---------------------------------------------------

def make(contender: str, cache_dir: str):
  """(fn(x, mu, log_sigma) -> float, description); the framework's start-up
  (imports, backend, Inductor's workers) happens here, untimed."""
  if contender == "numpy":
    import numpy as np

    def np_loglik(x, mu, ls):
      z = (x - mu) * np.exp(-ls)
      return float(np.sum(-0.5 * z * z - ls) - 0.5 * x.shape[0] * np.log(2 * np.pi))
    return np_loglik
  if contender.startswith("jax.jit") or contender.startswith("pj.jit"):
    import jax
    import jax.numpy as jnp
    if contender.endswith("+sync"):  # XLA:CPU runs each program in the calling thread
      jax.config.update("jax_cpu_enable_async_dispatch", False)
    if contender == "jax.jit+cache":
      jax.config.update("jax_compilation_cache_dir", cache_dir)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
      jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.devices()
    float(jnp.ones(3).sum())  # the backend up, untimed (as Inductor's start-up)

    def loglik(x, mu, log_sigma):
      z = (x - mu) * jnp.exp(-log_sigma)
      return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)
    if contender.startswith("pj.jit"):
      import polyjit as pj
      f = pj.jit(loglik)
      _PJ.append(f)
    else:
      f = jax.jit(loglik)
    return lambda x, mu, ls: float(f(x, mu, ls))
  if contender.startswith("torch.compile"):
    import torch
    # +1t: one thread (its OpenMP threads spin-wait; on a loaded machine they
    # wait to be scheduled: 200-300 us a call here against 25 us with one)
    torch.set_num_threads(1 if contender.endswith("+1t") else max(1, os.cpu_count() or 1))
    torch.compile(lambda t: t * 2 + 1, dynamic=True)(torch.ones(3))  # Inductor up, untimed
    torch._dynamo.reset()

    def t_loglik(x, mu, log_sigma):
      z = (x - mu) * torch.exp(-log_sigma)
      return torch.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * math.log(2 * math.pi)
    compiled = torch.compile(t_loglik, dynamic=True)

    def call(x, mu, ls):
      with torch.no_grad():
        return float(compiled(torch.from_numpy(x), torch.tensor(mu), torch.tensor(ls)))
    return call
  if contender == "tf.function":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    @tf.function(reduce_retracing=True, jit_compile=False)
    def tf_loglik(x, mu, log_sigma):
      z = (x - mu) * tf.exp(-log_sigma)
      n = tf.cast(tf.shape(x)[0], tf.float32)
      return tf.reduce_sum(-0.5 * z * z - log_sigma) - 0.5 * n * math.log(2 * math.pi)
    return lambda x, mu, ls: float(tf_loglik(x, mu, ls))
  raise ValueError(contender)


def worker(contender: str, calls: int, distribution: str, cache_dir: str) -> dict:
  import numpy as np
  fn = make(contender, cache_dir)
  rng = np.random.default_rng(1)
  data = rng.standard_normal(DISTRIBUTIONS[distribution][2]).astype(np.float32)
  mu, ls = np.float32(0.1), np.float32(0.3)
  ns = lengths(calls, distribution)
  cumulative = {}
  results = []
  t0 = time.perf_counter()
  for i, n in enumerate(ns, 1):
    results.append(fn(data[:n], mu, ls))
    if i in CHECKPOINTS or i == calls:
      cumulative[i] = time.perf_counter() - t0
  steady_sizes = list(dict.fromkeys(int(n) for n in ns))[:STEADY_SIZES]
  rounds, floors = [], []
  for _ in range(15 if _PJ else 7):
    t = time.perf_counter()
    for n in steady_sizes:
      fn(data[:n], mu, ls)
    rounds.append((time.perf_counter() - t) / len(steady_sizes))
    # the programs the calls just ran (a bucket bought meanwhile replaces a plan)
    floor = [floor_call(_PJ[0], data[:n], mu, ls) for n in steady_sizes] if _PJ else []
    if floor:
      t = time.perf_counter()
      for call in floor:
        call()
      floors.append((time.perf_counter() - t) / len(floor))
  ref = [float(np.sum(-0.5 * ((data[:n].astype(np.float64) - 0.1) * np.exp(-0.3)) ** 2 - 0.3)
               - 0.5 * n * np.log(2 * np.pi)) for n in ns[:50]]
  err = max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(results[:50], ref, strict=True))
  out = {"cumulative": cumulative, "steady_us": float(np.median(rounds)) * 1e6,
         "max_rel_error": err, "distinct": len(set(int(n) for n in ns))}
  if _PJ:
    import polyjit as pj
    out["floor_us"] = float(np.median(floors)) * 1e6
    # per round (the two interleaved), so that a load spike moves both alike
    out["floor_ratio"] = float(np.median([r / f for r, f in zip(rounds, floors, strict=True)]))
    stats = pj.stats(_PJ[0])
    out["programs"] = stats.compiles + stats.cache_loads
    out["loaded"] = stats.cache_loads
    out["padding"] = stats.padding_waste
  return out


def worker_rnn(contender: str, steps: int, cache_dir: str) -> dict:
  """Ragged RNN training (`ragged_training.py`'s scan RNN, batches of 32 sequences,
  lengths log-uniform in 10..512): `jax.jit` pads each batch to its own longest
  (with or without its persistent cache), `pj.jit` is `pj.vmap` over `pj.Ragged`,
  whose programs the user's `jax.jit` compiles: kept warm as a user keeps them,
  with JAX's persistent cache configured (polyjit changes no JAX setting)."""
  import jax
  import numpy as np
  if contender in ("jax.jit+cache", "pj.jit"):
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  float(jax.numpy.ones(3).sum())  # the backend up, untimed
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  os.environ["POLYJIT_NO_CACHE"] = "0"  # (ragged_training.py turns it off by default)
  import ragged_training as rt
  batches = rt.make_batches(steps, 32, 10, 512, 8, "loguniform")
  params = params0 = rt.init_params(8, 16)
  approach = rt.make("polyjit" if contender.startswith("pj.jit") else "jax_jit",
                     rt.MODELS["rnn"])
  cumulative = {}
  t0 = time.perf_counter()
  for i, (xs, ys) in enumerate(batches, 1):
    params, loss, _ = approach(params, xs, ys)
    if i in CHECKPOINTS or i == steps:
      jax.block_until_ready(params)
      cumulative[i] = time.perf_counter() - t0
  rounds = []
  for _ in range(3):
    t = time.perf_counter()
    for xs, ys in batches[:20]:
      jax.block_until_ready(approach(params0, xs, ys)[0])
    rounds.append((time.perf_counter() - t) / min(20, steps))
  return {"cumulative": cumulative, "steady_us": float(np.median(rounds)) * 1e6,
          "final_loss": float(loss)}


# --- the driver ---------------------------------------------------------------------

def run_process(contender: str, calls: int, distribution: str, cache_dir: str,
                workload: str = "seed") -> dict:
  env = dict(os.environ)
  env.pop("POLYJIT_NO_CACHE", None)
  env["POLYJIT_CACHE_DIR"] = cache_dir
  env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
  env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", contender,
                         "--calls", str(calls), "--distribution", distribution,
                         "--cache-dir", cache_dir, "--workload", workload],
                        env=env, capture_output=True, text=True)
  if proc.returncode != 0:
    return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def available(contender: str) -> str | None:
  module = {"torch.compile": "torch", "torch.compile+1t": "torch",
            "tf.function": "tensorflow"}.get(contender)
  if module is None:
    return None
  import importlib.util
  return None if importlib.util.find_spec(module) else f"{module} is not installed"


def at(report: dict, calls: int) -> float | None:
  c = {int(k): v for k, v in report.get("cumulative", {}).items()}
  return c.get(calls)


def steady(report: dict) -> float:
  return float(report.get("steady_us", float("nan")))


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--calls", type=int, default=20000)
  p.add_argument("--jax-calls", type=int, default=300, help="calls for jax.jit (a compile each)")
  p.add_argument("--distribution", default="uniform", choices=sorted(DISTRIBUTIONS))
  p.add_argument("--only", default=",".join(CONTENDERS))
  p.add_argument("--json")
  p.add_argument("--plot")
  p.add_argument("--workload", default="seed", choices=["seed", "rnn"],
                 help="rnn: ragged RNN training steps (--calls is the number of steps; "
                 "contenders jax.jit, jax.jit+cache, pj.jit)")
  p.add_argument("--from-json", help="no runs: the table (and --plot) from an earlier --json")
  p.add_argument("--rounds", type=int, default=1,
                 help="> 1: cold runs only, the contenders interleaved over this many "
                 "rounds (a loaded machine), medians and ranges")
  p.add_argument("--worker")
  p.add_argument("--cache-dir")
  a = p.parse_args()
  if a.worker:
    if a.workload == "rnn":
      print(json.dumps(worker_rnn(a.worker, a.calls, a.cache_dir)))
    else:
      print(json.dumps(worker(a.worker, a.calls, a.distribution, a.cache_dir)))
    return
  if a.workload == "rnn":
    a.only = ",".join(c for c in a.only.split(",") if c in ("jax.jit", "jax.jit+cache", "pj.jit"))
    a.jax_calls = a.calls
  import platform
  print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        + (f"{a.calls} calls, lengths {describe(a.distribution)}" if a.workload == "seed"
           else f"ragged RNN training, {a.calls} steps"))
  if a.rounds > 1 and a.workload == "seed" and not a.from_json:
    return interleaved(a)
  table = {}
  if a.from_json:
    with open(a.from_json) as f:
      table = json.load(f)["table"]
  for contender in [c for c in CONTENDERS if c in a.only.split(",") and not a.from_json]:
    why = available(contender)
    if why:
      print(f"{contender}: skipped ({why})")
      continue
    calls = a.jax_calls if contender.startswith("jax.jit") else a.calls
    with tempfile.TemporaryDirectory(prefix="horizons-") as cache:
      cold = run_process(contender, calls, a.distribution, cache, a.workload)
      warm = run_process(contender, calls, a.distribution, cache, a.workload)
    table[contender] = {"calls": calls, "cold": cold, "warm": warm}
    print(f"{contender}: cold {json.dumps(cold)}\n{' ' * len(contender)}  warm {json.dumps(warm)}",
          flush=True)
  print()
  hdr = ("contender", "first 300 cold", f"{a.calls} calls cold", "steady us/call",
         "300 warm", f"{a.calls} warm")
  print("| " + " | ".join(hdr) + " |")
  print("|" + "---|" * len(hdr))

  def fmt(v):
    return "-" if v is None else f"{v:.3g} s"
  for name, r in table.items():
    print(f"| {name} | {fmt(at(r['cold'], 300))} | {fmt(at(r['cold'], a.calls))} | "
          f"{steady(r['cold']):.1f} | {fmt(at(r['warm'], 300))} | "
          f"{fmt(at(r['warm'], a.calls))} |")
  ratios = {}
  for mine in ("pj.jit", "pj.jit+sync"):  # polyjit's own cost per call: against its floor
    r = table.get(mine)
    if r and r["cold"].get("floor_us"):
      ratios[f"{mine} steady / its compiled program called directly (the floor, "
             f"{r['cold']['floor_us']:.1f} us), median of per-round ratios"] = r["cold"].get(
                 "floor_ratio", steady(r["cold"]) / r["cold"]["floor_us"])
  for mine, theirs in (("pj.jit", "jax.jit"), ("pj.jit+sync", "jax.jit+sync")):
    pj, torch_, jx = table.get(mine), table.get("torch.compile"), table.get(theirs)
    if pj and torch_:
      for label, side, n in (("first 300, cold", "cold", 300),
                             (f"{a.calls}, cold", "cold", a.calls),
                             ("first 300, warm", "warm", 300),
                             (f"{a.calls}, warm", "warm", a.calls)):
        x, y = at(pj[side], n), at(torch_[side], n)
        if x and y:
          ratios[f"{mine} / torch.compile, {label}"] = x / y
      ratios[f"{mine} / torch.compile, steady"] = steady(pj["cold"]) / steady(torch_["cold"])
    if pj and jx:
      x, y = at(pj["cold"], 300), at(jx["cold"], 300)
      if x and y:
        ratios[f"{theirs} / {mine}, first 300 cold"] = y / x
      ratios[f"{mine} / {theirs} steady (every size precompiled)"] = (
          steady(pj["cold"]) / steady(jx["cold"]))
  pj, tf_ = table.get("pj.jit"), table.get("tf.function")
  if pj and tf_:
    for side in ("cold", "warm"):
      for n in sorted({300, a.calls}):
        x, y = at(pj[side], n), at(tf_[side], n)
        if x and y:
          ratios[f"pj.jit / tf.function, {n}, {side}"] = x / y
    ratios["pj.jit / tf.function, steady"] = steady(pj["cold"]) / steady(tf_["cold"])
  pj, jc, jx = table.get("pj.jit"), table.get("jax.jit+cache"), table.get("jax.jit")
  for n in sorted({300, a.calls}):
    if pj and jc:
      x, y = at(pj["warm"], n), at(jc["warm"], n)
      if x and y:
        ratios[f"jax.jit+cache warm / pj.jit warm, {n} calls"] = y / x
    if pj and jx and n == a.calls == jx["calls"]:
      x, y = at(pj["cold"], n), at(jx["cold"], n)
      if x and y:
        ratios[f"jax.jit / pj.jit cold, {n} calls"] = y / x
  for k, v in ratios.items():
    print(f"{k}: {v:.2f}")
  if a.json:
    with open(a.json, "w") as f:
      json.dump({"table": table, "ratios": ratios, "argv": sys.argv}, f, indent=1)
  if a.plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, r) in enumerate(table.items()):  # one colour per contender
      for side, style in (("cold", "-"), ("warm", "--")):
        c = sorted((int(k), v) for k, v in r[side].get("cumulative", {}).items())
        if c:
          ax.plot(*zip(*c, strict=True), style, color=f"C{i % 10}", marker="o", ms=3,
                  label=f"{name} ({side})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("calls")
    ax.set_ylabel("cumulative seconds")
    ax.set_title(f"seed likelihood, lengths {describe(a.distribution)}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.plot, dpi=120)


def interleaved(a: argparse.Namespace) -> None:
  """Cold runs only, each contender once per round in turn (so a load spike
  hits them alike), then per contender the median and range over the rounds,
  and pj.jit / torch.compile per round."""
  import statistics
  names = [c for c in CONTENDERS if c in a.only.split(",") and not available(c)]
  runs: dict[str, list[dict]] = {c: [] for c in names}
  for r in range(a.rounds):
    for contender in names:
      calls = a.jax_calls if contender.startswith("jax.jit") else a.calls
      with tempfile.TemporaryDirectory(prefix="horizons-") as cache:
        rep = run_process(contender, calls, a.distribution, cache)
      rep["calls"] = calls
      runs[contender].append(rep)
      print(f"round {r} {contender}: {json.dumps(rep)}", flush=True)

  def summary(values: list[float], unit: str) -> str:
    if not values:
      return "-"
    return (f"{statistics.median(values):.3g}{unit} "
            f"({min(values):.3g}-{max(values):.3g})")
  print()
  for name, reps in runs.items():
    calls = reps[0]["calls"]
    parts = [f"first 300 {summary([v for r in reps if (v := at(r, 300))], ' s')}",
             f"{calls} calls {summary([v for r in reps if (v := at(r, calls))], ' s')}",
             f"steady {summary([steady(r) for r in reps if 'steady_us' in r], ' us')}"]
    if any("floor_ratio" in r for r in reps):
      parts.append(f"steady/floor {summary([r['floor_ratio'] for r in reps if 'floor_ratio' in r], 'x')}")
      parts.append(f"programs {[r.get('programs') for r in reps]}, padding "
                   f"{[round(r.get('padding', 0), 3) for r in reps]}")
    print(f"{name}: " + "; ".join(parts))
  for theirs in ("torch.compile", "torch.compile+1t"):
    pj, torch_ = runs.get("pj.jit", []), runs.get(theirs, [])
    ratios = [x / y for p, t in zip(pj, torch_, strict=False)
              if (x := at(p, a.calls)) and (y := at(t, a.calls))]
    if ratios:
      print(f"pj.jit / {theirs}, {a.calls} calls cold, per round: "
            + ", ".join(f"{v:.2f}" for v in ratios))


if __name__ == "__main__":
  main()
