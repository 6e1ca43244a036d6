"""`python -m polyjit bench`: the benchmark suite, JSON and PNG charts out.

Runs the scripts in the repository's `benchmarks/` folder, each in a process
of its own (clean compile caches, no interference), then draws a chart per
benchmark and writes `summary.md` with the ratios against every peer:

* seed workload, lengths uniform (with peers and every bucket policy),
  log-uniform and sentence-like;
* the JIT-tutorial cases (`jit_tutorial.py`);
* ragged training (`ragged_training.py`);
* a run-time-dominated MLP, the cost-aware policy against the fixed ones
  (`runtime_dominated.py`);
* overheads: trace+mask and masked against unmasked run time
  (`mask_overhead.py`), per-call overhead (inside the seed runs).

`--quick` runs small sizes (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import jax

from .demo import pyplot as _pyplot


def _benchmarks_dir() -> Path:
  here = Path(__file__).resolve().parent.parent / "benchmarks"
  if not here.is_dir():
    raise SystemExit("python -m polyjit bench runs the scripts in benchmarks/: run it "
                     "from a clone of the polyjit repository (pip install -e .).")
  return here


def _plan(quick: bool) -> list[tuple[str, str, list[str]]]:
  calls = "60" if quick else "300"
  return [
      ("seed_uniform", "seed_likelihood.py",
       ["--calls", calls, "--distribution", "uniform", "--peers", "--policies"]),
      ("seed_loguniform", "seed_likelihood.py",
       ["--calls", calls, "--distribution", "loguniform", "--peers"]),
      ("seed_sentences", "seed_likelihood.py", ["--calls", calls, "--distribution", "sentences"]),
      ("jit_tutorial", "jit_tutorial.py", []),
      ("ragged_training", "ragged_training.py", ["--quick"] if quick else []),
      ("mask_overhead", "mask_overhead.py", ["--quick"] if quick else []),
      ("runtime_dominated", "runtime_dominated.py",
       ["--width", "256", "--max-rows", "512", "--calls", "60"] if quick else []),
  ]


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m polyjit bench",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes")
  parser.add_argument("--out", default="bench-results", help="output folder")
  parser.add_argument("--only", nargs="*", help="run only these benchmarks")
  opts = parser.parse_args(argv)
  folder = _benchmarks_dir()
  out = Path(opts.out)
  out.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(folder.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
  failed = []
  for name, script, args in _plan(opts.quick):
    if opts.only and name not in opts.only:
      continue
    print(f"\n=== {name}: {script} {' '.join(args)}", flush=True)
    run = subprocess.run([sys.executable, str(folder / script), *args,
                          "--json", str(out / f"{name}.json")], env=env)
    if run.returncode != 0:
      failed.append(name)
  results = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
  charts = _charts(results, out)
  summary = _summary(results, opts.quick)
  (out / "summary.md").write_text(summary)
  print("\n" + summary)
  print(f"results: {out.resolve()} ({len(results)} JSON, {len(charts)} PNG)")
  if failed:
    print(f"failed: {failed}", file=sys.stderr)
  return 1 if failed else 0


# --- summary ---------------------------------------------------------------------

def _summary(results: dict[str, Any], quick: bool) -> str:
  lines = [f"polyjit benchmarks, {datetime.date.today()}, {platform.machine()} "
           f"({os.cpu_count()} cores), JAX {jax.__version__}, "
           f"{'quick' if quick else 'full'} run: `python -m polyjit bench{' --quick' if quick else ''}`", ""]
  for name in ("seed_uniform", "seed_loguniform", "seed_sentences"):
    r = results.get(name)
    if not r:
      continue
    m = r["meta"]
    best = min(r["rows"]["pj.jit explicit"]["total_s"], r["rows"]["pj.jit automatic"]["total_s"])
    lines += [f"**Seed workload, {m['calls']} calls, {m['distinct_lengths']} distinct lengths "
              f"({m['distribution']} in [{m['low']}, {m['high']}])**", "",
              "| contender | total s | compiles | vs best pj.jit |", "|---|---|---|---|"]
    for contender, row in r["rows"].items():
      compiles = "-" if row["compiles"] is None else row["compiles"]
      lines.append(f"| {contender} | {row['total_s']:.2f} | {compiles} | "
                   f"{row['total_s'] / best:.2f}x |")
    for contender, why in r.get("skipped", {}).items():
      lines.append(f"| {contender} | skipped: {why} | | |")
    ratios = r["ratios"]
    lines += ["", f"steady state pj.jit / jax.jit: {ratios['steady_vs_jax_jit']:.2f}x; "
              f"added per call: {ratios['added_us_per_call']:+.1f} us (powers of two: "
              f"{ratios.get('pow2_added_us_per_call', float('nan')):+.1f} us)", ""]
    if r.get("policies"):
      lines += ["| bucket policy | total s | compiles | mean padding |", "|---|---|---|---|"]
      for policy, row in r["policies"].items():
        lines.append(f"| {policy} | {row['total_s']:.2f} | {row['compiles']} | "
                     f"{row['padding_waste']:.0%} |")
      lines.append("")
  tut = results.get("jit_tutorial")
  if tut:
    lines += ["**JIT tutorial cases**", "",
              f"selu on 1e6 values: eager {tut['selu_s']['eager'] * 1e3:.2f} ms, jax.jit "
              f"{tut['selu_s']['jax.jit'] * 1e3:.2f} ms", ""]
    for case, row in tut["loop"].items():
      lines.append(f"- {case}: {row['seconds'] * 1e3:.1f} ms, {row['compiles_in_3_runs']} "
                   f"compiles in 3 runs" + ("; pj.watch: " + row["watch_advice"][0]
                                            if row["watch_advice"] else ""))
    lines.append("")
  over = results.get("mask_overhead")
  if over:
    lines += ["**Masking overheads**", "", "| workload | trace ratio | run ratio |", "|---|---|---|"]
    for row in over["rows"]:
      lines.append(f"| {row['workload']} | {row['trace_ratio']:.2f} | {row['run_ratio']:.2f} |")
    lines.append("")
  ragged = results.get("ragged_training")
  if ragged:
    m = ragged["meta"]
    lines += [f"**Ragged training, {m['steps']} steps of {m['batch']} sequences, lengths "
              f"{m['lengths']} ({m['distinct_maxima']} distinct batch maxima)**", "",
              "| model | approach | total s | cpu s | compiles | vs polyjit (cpu) | "
              "grad rel diff |", "|---|---|---|---|---|---|---|"]
    for model, r in ragged["models"].items():
      base = r["approaches"].get("polyjit", {}).get("cpu_s")
      for approach, row in r["approaches"].items():
        ratio = f"{row['cpu_s'] / base:.2f}x" if base else "-"
        lines.append(f"| {model} | {approach} | {row['total_s']:.2f} | {row['cpu_s']:.2f} | "
                     f"{row['compiles']} | {ratio} | {row['max_grad_rel_diff']:.1e} |")
    lines.append("")
  mlp = results.get("runtime_dominated")
  if mlp:
    m = mlp["meta"]
    lines += [f"**Run-time-dominated MLP, width {m['width']}, {m['calls']} calls, rows uniform "
              f"in [1, {m['max_rows']}]** (best fixed policy: {m['best_fixed']})", "",
              "| policy | total s | cpu s | compiles | vs best fixed (cpu) |", "|---|---|---|---|---|"]
    for policy, row in mlp["rows"].items():
      lines.append(f"| {policy} | {row['total_s']:.2f} | {row['cpu_s']:.2f} | "
                   f"{row['compiles']} | {row['vs_best_fixed_cpu']:.2f}x |")
    lines.append("")
  return "\n".join(lines)


# --- charts ----------------------------------------------------------------------

def _charts(results: dict[str, Any], out: Path) -> list[Path]:
  plt = _pyplot()
  if plt is None:
    print("charts skipped: pip install matplotlib", file=sys.stderr)
    return []
  paths = []
  for name, r in results.items():
    if name.startswith("seed_"):
      rows = r["rows"]
      fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
      names = list(rows)
      ax.barh(names, [rows[n]["total_s"] for n in names], color="tab:blue")
      ax.set_xscale("log")
      ax.set_xlabel("total seconds, compiles included (log scale)")
      ax.set_title(f"{r['meta']['calls']} calls, {r['meta']['distinct_lengths']} distinct "
                   f"lengths ({r['meta']['distribution']})")
      ax.invert_yaxis()
      paths.append(_save(fig, out / f"{name}.png", plt))
      if r.get("policies"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy, row in r["policies"].items():
          ax.scatter(row["compiles"], row["padding_waste"] * 100)
          ax.annotate(policy, (row["compiles"], row["padding_waste"] * 100), fontsize=8)
        ax.set_xlabel("programs compiled")
        ax.set_ylabel("mean padding (%)")
        ax.set_title("bucket policies: programs against padding")
        paths.append(_save(fig, out / f"{name}_policies.png", plt))
    elif name == "mask_overhead":
      rows = r["rows"]
      fig, ax = plt.subplots(figsize=(7, 3.5))
      labels = [row["workload"] for row in rows]
      ax.bar([i - 0.2 for i in range(len(rows))], [row["trace_ratio"] for row in rows],
             width=0.4, label="trace+mask / make_jaxpr")
      ax.bar([i + 0.2 for i in range(len(rows))], [row["run_ratio"] for row in rows],
             width=0.4, label="masked / unmasked run time")
      ax.set_xticks(range(len(rows)), labels)
      ax.axhline(1.0, color="gray", lw=0.8)
      ax.legend()
      ax.set_title("masking overheads (ratios)")
      paths.append(_save(fig, out / f"{name}.png", plt))
  return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
