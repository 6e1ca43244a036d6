"""benchmarks/training.py keeps running, and its contenders compute the same training.

The benchmark (issue 32) trains four models written for one example under
`pj.vmap`, against the same models written by hand for padded batches. Its
`--smoke` mode (tiny sizes, 2 steps, the gradient timed once) runs here in a subprocess (the
script sets its own environment: no on-disk program cache) and its JSON is
read back: every contender's loss and gradients on the first batch agree
with the hand-masked ones and with a loop over the unpadded examples, and
the compile counter (jax.monitoring) counts one program per padded size for
the hand-written contenders. No timing is asserted (only that numbers came
out of the timing path).

Every model runs here with `masks` (the hand-masked baseline) and `polyjit`,
each checked against the loop over unpadded examples: what checks polyjit.
The other contenders (`pow2`, `longest`, `flax`) are the same hand-masked
step at other padded sizes, so they run on one model, the text classifier,
in tests/test_training_benchmark_sst2.py (with `--lengths sst2`, all five
contenders): running them on every model compiled the same hand-written
steps again at other sizes, most of the two smoke runs' time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "training.py"


def run_smoke(tmp_path: Path, *extra: str) -> dict:
  out = tmp_path / "training.json"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
  run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out), *extra],
                       env=env, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  result: dict = json.loads(out.read_text())
  return result


@pytest.mark.heavy
def test_smoke_run_every_model_agrees_with_masks_and_the_unpadded_loop(tmp_path):
  result = run_smoke(tmp_path, "--contenders", "masks", "polyjit")
  assert set(result["models"]) == {"text", "attention", "graph", "sets"}
  for model, r in result["models"].items():
    assert r["lengths"] == "uniform"
    agreement = r["agreement"]
    assert set(agreement) == {"masks", "polyjit", "reference"}, model
    for contender, row in agreement.items():
      assert row["loss_rel_diff"] < 1e-5, (model, contender, row)
      assert row["grad_rel_diff"] < 1e-4, (model, contender, row)
    masks = r["contenders"]["masks"]
    assert set(r["contenders"]) == {"masks", "polyjit"}, model
    for contender, row in r["contenders"].items():
      # training: the same losses; one compile per padded size for the hand-written steps
      assert abs(row["first_loss"] - masks["first_loss"]) <= 1e-5 * abs(masks["first_loss"])
      if contender != "polyjit":
        assert row["compiles"] == row["distinct_padded_sizes"], (model, contender, row)
      for key in ("grad_ms", "total_s"):
        assert row[key] > 0, (model, contender, key)  # the timing path ran (nothing asserted)
  assert any(line.startswith("| sets | polyjit |") for line in result["table"])
