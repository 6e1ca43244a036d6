"""benchmarks/accelerator.py keeps running, and polyjit computes what jax.jit computes there.

The benchmark (issue 40) times pj.jit and pj.vmap on device-resident inputs
against jax.jit. Its `--smoke` mode (a few calls and steps) runs here on the
accelerator path (`--accelerator-path`: no inline CPU client, as on a GPU) in
a subprocess (the script sets its own environment: a fresh on-disk program
cache), and its JSON is read back: polyjit's results equal jax.jit's in every
section; the compile counter (jax.monitoring) counts one jax.jit program per
distinct length, fewer for polyjit, and none while the hot calls are timed.
No timing is asserted (only that numbers came out of the timing path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "accelerator.py"


def test_smoke_run_agrees_with_jax_jit(tmp_path):
  out = tmp_path / "accelerator.json"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
  run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--accelerator-path",
                        "--json", str(out)], env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  r = json.loads(out.read_text())
  assert r["meta"]["agree"] and r["meta"]["inline_cpu"] is False
  for section in ("seed", "training", "hot"):
    assert r[section]["max_rel_error"] < 1e-4, section
  seed = r["seed"]
  # one jax.jit program per distinct length it saw; polyjit's buckets: fewer
  assert seed["jax.jit"]["compiles"] == seed["jax_distinct"] >= 10
  assert 1 <= seed["polyjit"]["compiles"] < seed["jax.jit"]["compiles"]
  assert seed["jax.jit"][f"at_{seed['calls']}"]["estimated"]  # capped: an estimate
  assert not seed["polyjit"][f"at_{seed['calls']}"]["estimated"]
  tr = r["training"]
  assert tr["jax.jit"]["compiles"] == tr["jax.jit"]["distinct_padded"]
  assert len(tr["polyjit"]["losses"]) == tr["steps"]
  assert r["hot"]["compiles_while_timed"] == 0
  for name in ("jax.jit", "polyjit"):
    assert tr[name]["total_s"] > 0 and r["hot"][name]["blocked_us"] > 0
  assert r["hot"]["polyjit, hot shapes bought"]["blocked_us"] > 0
  assert len(r["table"]) == 10 and r["table"][2].startswith("| seed workload, first")
