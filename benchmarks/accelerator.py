"""pj.jit and pj.vmap on device-resident inputs against jax.jit, in one run: one command.

On a GPU or TPU a `jax.Array` lives in device memory, and `jax.jit` takes it and
returns one without touching the host. This benchmark gives every contender
its inputs already on the device (`jax.device_put`, untimed) and times, each
against `jax.jit` in the same process:

* **first calls** and **long run** of the seed workload (the Gaussian
  log-likelihood over a vector whose length is uniform in [100, 10000], a new
  length nearly every call; each call's result read as a float, as a user
  reading a log-likelihood does): cumulative seconds after `--first` calls
  (300) and `--calls` calls (20,000). `jax.jit` compiles once per distinct
  length, so it runs at most `--jax-calls` calls (300): past that its total is
  an estimate (its measured time per distinct length times the distinct
  lengths, plus its time per call at a compiled length for the repeats),
  marked `est.` in the table;
* a **ragged training step** (`training_models.py`'s Deep Sets model, one
  example written once, `pj.vmap` over a device-resident `pj.Ragged` inside
  the user's `jax.jit`, SGD) against the same model written by hand for
  padded batches (padding to the next power of two, masks, `jax.jit`): total
  seconds for `--steps` steps (compiles included) and the steady step;
* the **hot call**: the seed likelihood at four lengths that share one bucket,
  cycling, best of `--rounds` rounds of `--hot-calls` calls, interleaved with
  `jax.jit` calling its exact-shape programs of the same lengths (compiled
  before). Per call with the result read (`block_until_ready`) and dispatch
  only (the round blocked once at its end). Two `pj.jit` functions: one held
  in its bucket (`polyjit/_jit/hot_shapes.py`'s `RENT` infinite while its
  plans are made), one called until each shape has bought its own program.

Every section checks that polyjit's results equal `jax.jit`'s (relative
difference at most `--tolerance`) and counts compiles with `jax.monitoring`.
Only the public API is used (`pj.jit`, `pj.vmap`, `pj.Ragged`), and
`hot_shapes.RENT` to hold one function in its bucket. The on-disk
program cache is a fresh temporary directory (first calls are cold).

    python benchmarks/accelerator.py                       # the default device
    python benchmarks/accelerator.py --accelerator-path    # POLYJIT_INLINE_CPU=0 on a CPU
    python benchmarks/accelerator.py --smoke               # tiny sizes (the test)
    python benchmarks/accelerator.py --transfer-guard log_explicit  # JAX's guard around the calls

Writes JSON (`--json`, default benchmarks/results/accelerator[-smoke]-<platform>.json)
and prints a table of seconds and ratios (jax.jit / polyjit: above 1, polyjit
is faster). On a machine shared with other work, compare ratios within one
run; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CHECKPOINTS = (1, 10, 100, 300, 1000, 3000, 10000, 20000)
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--first", type=int, default=300, help="the first calls (seed workload)")
  p.add_argument("--calls", type=int, default=20000, help="the long run (seed workload)")
  p.add_argument("--jax-calls", type=int, default=300,
                 help="calls of jax.jit in the long run (a compile per new length)")
  p.add_argument("--steps", type=int, default=60, help="ragged training steps")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--max-set", type=int, default=256, help="sets of 1..N elements")
  p.add_argument("--width", type=int, default=64)
  p.add_argument("--hot-calls", type=int, default=2000)
  p.add_argument("--hot-warm-up", type=int, default=200_000,
                 help="calls at most until each hot shape has bought its own program")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--tolerance", type=float, default=1e-4)
  p.add_argument("--accelerator-path", action="store_true",
                 help="POLYJIT_INLINE_CPU=0: on a CPU, polyjit's programs run as on an "
                      "accelerator (no inline CPU client)")
  p.add_argument("--transfer-guard", default=None,
                 help="run every timed call under jax.transfer_guard(LEVEL) "
                      "(allow, log, disallow, log_explicit, disallow_explicit)")
  p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; the test)")
  p.add_argument("--json")
  opts = p.parse_args(argv)
  if opts.smoke:
    opts.first, opts.calls, opts.jax_calls = 12, 40, 12
    opts.steps, opts.batch, opts.max_set, opts.width = 3, 4, 12, 8
    opts.hot_calls, opts.rounds, opts.hot_warm_up = 20, 2, 40
  opts.first = min(opts.first, opts.calls)
  return opts


# The environment is set before polyjit (and JAX's backend) starts.
OPTS = parse() if __name__ == "__main__" else None
if OPTS is not None:
  if OPTS.accelerator_path:
    os.environ["POLYJIT_INLINE_CPU"] = "0"
  # cold: polyjit's on-disk cache on (its default), in an empty directory
  _CACHE = tempfile.TemporaryDirectory(prefix="polyjit-accelerator-")
  os.environ["POLYJIT_CACHE_DIR"] = _CACHE.name
  os.environ.pop("POLYJIT_NO_CACHE", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import polyjit as pj  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import training_models as tm  # noqa: E402

# --- compile counting (jax.monitoring) --------------------------------------------

_logs: list[list[float]] = []
_lock = threading.Lock()


def _on_duration(event: str, duration_secs: float, **_kwargs) -> None:
  if event == BACKEND_COMPILE:
    with _lock:
      for log in _logs:
        log.append(float(duration_secs))


jax.monitoring.register_event_duration_secs_listener(_on_duration)


@contextlib.contextmanager
def compiles():
  log: list[float] = []
  with _lock:
    _logs.append(log)
  try:
    yield log
  finally:
    with _lock:
      _logs.remove(log)


def guarded(opts):
  return jax.transfer_guard(opts.transfer_guard) if opts.transfer_guard else contextlib.nullcontext()


def rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1.0))) if a.size else 0.0


# --- the seed workload --------------------------------------------------------------

def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def seed_inputs(calls: int, seed: int = 0):
  """The lengths of the run and each distinct length's vector on the device."""
  rng = np.random.default_rng(seed)
  ns = [int(n) for n in rng.integers(100, 10001, calls)]
  data = np.random.default_rng(1).standard_normal(10000).astype(np.float32)
  on_device = {n: jax.device_put(data[:n]) for n in dict.fromkeys(ns)}
  mu, ls = jax.device_put(np.float32(0.1)), jax.device_put(np.float32(0.3))
  jax.block_until_ready((list(on_device.values()), mu, ls))
  return ns, on_device, mu, ls


def timed_run(f, ns, on_device, mu, ls, opts) -> dict:
  """Cumulative seconds at the checkpoints (each result read as a float)."""
  cumulative, results = {}, []
  with compiles() as log, guarded(opts):
    t0 = time.perf_counter()
    for i, n in enumerate(ns, 1):
      results.append(float(f(on_device[n], mu, ls)))
      if i in CHECKPOINTS or i == len(ns) or i == opts.first:
        cumulative[i] = time.perf_counter() - t0
  return {"cumulative": cumulative, "compiles": len(log), "compile_s": sum(log),
          "results": results}


def seed_section(opts) -> dict:
  ns, on_device, mu, ls = seed_inputs(opts.calls)
  jax_ns = ns[:opts.jax_calls]
  jf = jax.jit(loglik)
  jx = timed_run(jf, jax_ns, on_device, mu, ls, opts)
  pf = pj.jit(loglik)
  px = timed_run(pf, ns, on_device, mu, ls, opts)
  err = rel(px["results"][:len(jax_ns)], jx["results"])
  out = {"first": opts.first, "calls": len(ns), "distinct": len(set(ns)),
         "jax_calls": len(jax_ns), "jax_distinct": len(set(jax_ns)), "max_rel_error": err}
  for name, r in (("jax.jit", jx), ("polyjit", px)):
    out[name] = {k: v for k, v in r.items() if k != "results"}
  # jax.jit's long run where it was capped: its measured time per distinct length
  # (trace, lower, compile, run) for every distinct length, plus its time per call
  # at a length it has compiled (measured here) for the repeats
  seen = len(set(jax_ns))
  done = jx["cumulative"][len(jax_ns)]
  again = jax_ns[:200]
  with guarded(opts):
    t = time.perf_counter()
    for n in again:
      float(jf(on_device[n], mu, ls))
    repeat = (time.perf_counter() - t) / len(again)
  out["jax.jit"]["repeat_call_us"] = repeat * 1e6
  for horizon in (opts.first, len(ns)):
    if horizon <= len(jax_ns):
      out["jax.jit"][f"at_{horizon}"] = {"seconds": jx["cumulative"][horizon], "estimated": False}
    else:
      distinct = len(set(ns[:horizon]))
      est = done / seen * distinct + (horizon - distinct) * repeat
      out["jax.jit"][f"at_{horizon}"] = {"seconds": est, "estimated": True}
    out["polyjit"][f"at_{horizon}"] = {"seconds": px["cumulative"][horizon], "estimated": False}
  return out


# --- the ragged training step -------------------------------------------------------

def next_pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def training_section(opts) -> dict:
  model = tm.sets_model(16, opts.width, 1, opts.max_set)
  params0 = model.init(jax.random.key(0))
  rng = np.random.default_rng(2)
  batches = []
  for _ in range(opts.steps):
    examples, labels = zip(*(model.make_example(rng) for _ in range(opts.batch)), strict=True)
    batches.append(([e[0] for e in examples], np.array(labels, np.float32)))
  lr = 0.01

  def sgd(loss):
    def step(params, *batch):
      value, grads = jax.value_and_grad(loss)(params, *batch)
      return jax.tree.map(lambda p, g: p - lr * g, params, grads), value
    return jax.jit(step)

  per_example = pj.vmap(model.one, in_axes=(None, 0, 0))
  pj_step = sgd(lambda params, xs, ys: per_example(params, xs, ys).mean())
  hand_step = sgd(lambda params, x, mask, ys: model.padded(params, (x,), (mask,), ys))

  def hand_batch(xs, ys):
    size = next_pow2(max(len(x) for x in xs))
    out = np.zeros((len(xs), size, xs[0].shape[1]), np.float32)
    for i, x in enumerate(xs):
      out[i, :len(x)] = x
    mask = np.arange(size)[None, :] < np.array([len(x) for x in xs])[:, None]
    return jax.device_put((out, mask, ys))

  # device-resident batches, built before the timing (untimed)
  pj_batches = [jax.device_put((pj.Ragged.from_list(xs), ys)) for xs, ys in batches]
  hand_batches = [hand_batch(xs, ys) for xs, ys in batches]
  jax.block_until_ready((pj_batches, hand_batches))
  out: dict = {"model": "sets", "steps": opts.steps, "batch": opts.batch,
               "max_set": opts.max_set}
  for name, step, data in (("jax.jit", hand_step, hand_batches),
                           ("polyjit", pj_step, pj_batches)):
    params, losses = params0, []
    with compiles() as log, guarded(opts):
      t0 = time.perf_counter()
      for batch in data:
        params, loss = step(params, *batch)
        losses.append(loss)
      jax.block_until_ready(params)
      total = time.perf_counter() - t0
      rounds = []
      for _ in range(3):  # the steady step: every program compiled
        t = time.perf_counter()
        for batch in data[:20]:
          jax.block_until_ready(step(params0, *batch))
        rounds.append((time.perf_counter() - t) / len(data[:20]))
    out[name] = {"total_s": total, "step_us": float(np.median(rounds)) * 1e6,
                 "compiles": len(log), "losses": [float(v) for v in losses],
                 "distinct_padded": len({b[0].shape for b in data}) if name == "jax.jit" else None}
  out["max_rel_error"] = rel(out["polyjit"]["losses"], out["jax.jit"]["losses"])
  return out


# --- the hot call ------------------------------------------------------------------

def hot_section(opts) -> dict:
  data = np.random.default_rng(3).standard_normal(1024).astype(np.float32)
  sizes = (600, 700, 800, 900)  # one bucket
  xs = [jax.device_put(data[:n]) for n in sizes]
  mu, ls = jax.device_put(np.float32(0.1)), jax.device_put(np.float32(0.3))
  from polyjit._jit import hot_shapes
  rent, hot_shapes.RENT = hot_shapes.RENT, float("inf")  # (pf's plans never buy)
  jf, pf = jax.jit(loglik), pj.jit(loglik)
  for _ in range(3):  # warm: every program compiled, every plan made
    for x in xs:
      jax.block_until_ready((jf(x, mu, ls), pf(x, mu, ls)))
  hot_shapes.RENT = rent
  # the same function where each shape's calls have paid for its own program
  # (`polyjit/_jit/hot_shapes.py`: thousands of calls)
  bf = pj.jit(loglik)
  for i in range(opts.hot_warm_up // len(xs)):
    for x in xs:
      jax.block_until_ready(bf(x, mu, ls))
    if sum(p.exact_call is not None for p in bf._hot.values()) >= len(xs):
      break
  bought = sum(p.exact_call is not None for p in bf._hot.values())
  err = max(rel([float(f(x, mu, ls)) for x in xs], [float(jf(x, mu, ls)) for x in xs])
            for f in (pf, bf))
  calls = [xs[i % len(xs)] for i in range(opts.hot_calls)]

  def blocked(f):
    t = time.perf_counter()
    for x in calls:
      f(x, mu, ls).block_until_ready()
    return (time.perf_counter() - t) / len(calls)

  def dispatched(f):
    t = time.perf_counter()
    out = [f(x, mu, ls) for x in calls]
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / len(calls)

  names = ("jax.jit", "polyjit", "polyjit, hot shapes bought")
  times: dict = {(n, m): [] for n in names for m in ("blocked", "dispatch")}
  with compiles() as log, guarded(opts):
    for _ in range(opts.rounds):  # interleaved: a load spike moves both alike
      for name, f in zip(names, (jf, pf, bf), strict=True):
        times[(name, "blocked")].append(blocked(f))
        times[(name, "dispatch")].append(dispatched(f))
  out: dict = {"sizes": list(sizes), "calls": opts.hot_calls, "rounds": opts.rounds,
               "max_rel_error": err, "compiles_while_timed": len(log),
               "shapes_bought": bought}
  for name in names:
    out[name] = {f"{m}_us": min(times[(name, m)]) * 1e6 for m in ("blocked", "dispatch")}
  return out


# --- the table ---------------------------------------------------------------------

def table(results: dict) -> list[str]:
  rows = ["| what | jax.jit | polyjit | jax.jit / polyjit |", "|---|---|---|---|"]
  seed = results["seed"]
  for horizon in (seed["first"], seed["calls"]):
    j, p = seed["jax.jit"][f"at_{horizon}"], seed["polyjit"][f"at_{horizon}"]
    mark = " est." if j["estimated"] else ""
    rows.append(f"| seed workload, first {horizon} calls (s) | {j['seconds']:.3f}{mark} | "
                f"{p['seconds']:.3f} | {j['seconds'] / p['seconds']:.1f}x{mark} |")
  tr = results["training"]
  j, p = tr["jax.jit"], tr["polyjit"]
  rows.append(f"| ragged training, {tr['steps']} steps (s) | {j['total_s']:.3f} | "
              f"{p['total_s']:.3f} | {j['total_s'] / p['total_s']:.1f}x |")
  rows.append(f"| ragged training, steady step (us) | {j['step_us']:.0f} | {p['step_us']:.0f} | "
              f"{j['step_us'] / p['step_us']:.2f}x |")
  hot = results["hot"]
  for name, label in (("polyjit", "in its bucket"),
                      ("polyjit, hot shapes bought", "hot shapes bought")):
    for m in ("blocked", "dispatch"):
      j, p = hot["jax.jit"][f"{m}_us"], hot[name][f"{m}_us"]
      rows.append(f"| hot call, {label}, {'result read' if m == 'blocked' else 'dispatch only'} "
                  f"(us) | {j:.1f} | {p:.1f} | {j / p:.2f}x |")
  return rows


def main(opts: argparse.Namespace) -> dict:
  load0 = os.getloadavg()[0]
  t0 = time.perf_counter()
  device = jax.devices()[0]
  float(jnp.ones(3).sum())  # the backend up, untimed
  results = {"seed": seed_section(opts), "training": training_section(opts),
             "hot": hot_section(opts)}
  load = (load0, os.getloadavg()[0])
  errors = {k: results[k]["max_rel_error"] for k in ("seed", "training", "hot")}
  rows = table(results)
  meta = {"jax": jax.__version__, "polyjit": pj.__version__, "polyjit_path": pj.__file__,
          "platform": device.platform, "device": str(getattr(device, "device_kind", device)),
          "machine": platform.machine(), "cores": os.cpu_count(), "load_average": load,
          "inline_cpu": os.environ.get("POLYJIT_INLINE_CPU", "1") != "0",
          "transfer_guard": opts.transfer_guard, "argv": sys.argv[1:],
          "seconds": time.perf_counter() - t0, "max_rel_errors": errors,
          "agree": all(e <= opts.tolerance for e in errors.values())}
  print(f"{meta['platform']} ({meta['device']}), {meta['cores']} cores, JAX {jax.__version__}, "
        f"inline CPU client {'on' if meta['inline_cpu'] else 'off'}; load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end; {meta['seconds']:.0f} s in all")
  print("\n".join(rows))
  print(f"largest relative differences from jax.jit: {errors}")
  out = Path(opts.json) if opts.json else (
      RESULTS / f"accelerator{'-smoke' if opts.smoke else ''}-{device.platform}.json")
  out.parent.mkdir(parents=True, exist_ok=True)
  report = {"meta": meta, "table": rows, **results}
  out.write_text(json.dumps(report, indent=1))
  print(f"results: {out}")
  if not meta["agree"]:
    raise SystemExit(f"polyjit's results differ from jax.jit's: {errors}")
  return report


if __name__ == "__main__":
  main(OPTS)
