"""benchmarks/training.py --lengths sst2: Flax's sst2 batching, and every contender.

The batches (`benchmarks/sst2_batches.py`) follow Flax's sst2 input pipeline:
each batch comes from one length bucket of the example's boundaries
(9, 17, ..., 65 for bucket size 8 and maximum length 60), its lengths are
SST-2's, and the same seed gives the same batches. The `--smoke` run with
`--lengths sst2` trains the text classifier (the model of Flax's sst2
example) with every contender, `flax`, `pow2` and `longest` among them: all
agree with the hand-masked loss and gradients and with the loop over the
unpadded examples, and the hand-written contenders compile once per padded
size (counted by jax.monitoring in the script). No timing is asserted.

The hand-padded contenders are one hand-masked step at different padded
sizes, so one model runs them; every model runs with `masks` and `polyjit`
in tests/test_training_benchmark.py (uniform lengths there, for the
attention model too).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import sst2_batches as sb
from test_training_benchmark import run_smoke


def test_flax_boundaries_and_padded_sizes():
  assert list(sb.bucket_boundaries(8, 60)) == [9, 17, 25, 33, 41, 49, 57, 65]
  # boundary - 1 of the bucket; past the last boundary, the longest itself
  got = [sb.flax_padded_size(n, 8, 60) for n in (1, 8, 9, 16, 17, 63, 64, 65, 90)]
  assert got == [8, 8, 16, 16, 24, 64, 64, 65, 90]


def test_batches_come_from_one_bucket_with_sst2_lengths():
  a = sb.flax_batches(300, 16, 8, 60, np.random.default_rng(3))
  b = sb.flax_batches(300, 16, 8, 60, np.random.default_rng(3))
  assert a == b  # deterministic by seed
  assert len(a) == 300 and all(len(x) == 16 for x in a)
  for x in a:
    assert len({sb.flax_padded_size(n, 8, 60) for n in x}) == 1, x
    assert set(x) <= set(sb.SST2_TRAIN_LENGTHS)
  # the buckets' batches are interleaved: more than one padded size in the first few
  assert len({sb.flax_padded_size(x[0], 8, 60) for x in a[:20]}) > 1
  assert sum(sb.SST2_TRAIN_LENGTHS.values()) == 67349


def test_batches_continue_past_one_epoch():
  # batch 4096: only the shortest buckets fill a batch, a few batches per epoch
  x = sb.flax_batches(30, 4096, 8, 60, np.random.default_rng(0))  # 13 an epoch
  assert len(x) == 30 and all(len(b) == 4096 for b in x)


@pytest.mark.heavy
def test_smoke_run_sst2_lengths_every_contender(tmp_path):
  result = run_smoke(tmp_path, "--models", "text", "--lengths", "sst2", "--contenders",
                     "masks", "pow2", "flax", "longest", "polyjit")
  assert set(result["models"]) == {"text"}
  for model, r in result["models"].items():
    assert r["lengths"] == "sst2"
    assert set(r["agreement"]) == {"masks", "pow2", "flax", "longest", "polyjit",
                                   "reference"}, model
    for contender, row in r["agreement"].items():
      assert row["loss_rel_diff"] < 1e-5, (model, contender, row)
      assert row["grad_rel_diff"] < 1e-4, (model, contender, row)
    rows = r["contenders"]
    masks = rows["masks"]
    for contender, row in rows.items():
      assert abs(row["first_loss"] - masks["first_loss"]) <= 1e-5 * abs(masks["first_loss"])
      if contender != "polyjit":
        assert row["compiles"] == row["distinct_padded_sizes"], (model, contender, row)
      assert row["compiling_steps"] + row["run_steps"] == row["steps"]
      for key in ("grad_ms", "total_s"):
        assert row[key] > 0, (model, contender, key)  # the timing path ran (nothing asserted)
    assert rows["flax"]["padded_sizes"][0] % 8 == 0
    assert set(r["polyjit_versus"]) == {"flax", "pow2"}
  assert any(line.startswith("| text | longest |") for line in result["table"])
