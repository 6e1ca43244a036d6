"""SST-2's sentence lengths, batched the way Flax's sst2 example batches them.

`training.py --lengths sst2` trains the text (and attention) model on batches
formed like those of Flax's `examples/sst2` (google/flax), so that its hand
buckets (`flax` contender) are the example's own:

  * lengths: `SST2_TRAIN_LENGTHS` is the histogram of the GLUE SST-2 train
    split (67,349 sentences and phrases), each sentence's whitespace tokens
    plus BOS and EOS, as the example's `input_pipeline.TextDataset` counts
    them (`WhitespaceTokenizer`, `add_bos_eos`). Counted from the public
    `SST-2/train.tsv` (github.com/awake020/pytorch_Bert_sst2, the GLUE file,
    67,350 lines with its header): 3 to 54 tokens, median 9, mean 11.4, 90%
    at most 23. One epoch is this multiset of lengths, shuffled; the token
    ids themselves are the model's random ones (`make_example(rng, n)`).
  * batches: `input_pipeline.get_bucketed_batches` with the example's config
    (`configs/default.py`: batch_size 64, bucket_size 8, max_input_length 60)
    and `train.py`'s call (drop_remainder=True, shuffle=True):
    `tf.data.experimental.bucket_by_sequence_length` with boundaries
    `np.arange(bucket_size, max_length + bucket_size, bucket_size) + 1`
    (9, 17, ..., 65), one window of `batch` examples per bucket filled in the
    shuffled order of the epoch, the incomplete windows dropped at the end of
    the epoch, then all batches of the epoch shuffled together (the shuffle
    buffer holds the whole epoch). With `pad_to_bucket_boundary=True` each
    batch is padded to its bucket's boundary minus 1 (8, 16, 24, ...):
    `flax_padded_size`. TF rejects a length past the last boundary there;
    this benchmark pads such a batch to its longest instead (the overflow
    bucket; SST-2's 54 tokens never reach it with the example's config).

Everything is drawn from one `numpy` generator seeded by the caller:
deterministic.
"""

from __future__ import annotations

import numpy as np

# length (tokens + BOS + EOS) -> sentences of that length in GLUE SST-2's train split
SST2_TRAIN_LENGTHS: dict[int, int] = {
    3: 4270, 4: 7241, 5: 7031, 6: 5511, 7: 4578, 8: 4019, 9: 3594, 10: 3092, 11: 2861,
    12: 2564, 13: 2230, 14: 2051, 15: 1830, 16: 1748, 17: 1560, 18: 1388, 19: 1265,
    20: 1182, 21: 1040, 22: 922, 23: 860, 24: 820, 25: 741, 26: 654, 27: 572, 28: 505,
    29: 460, 30: 416, 31: 335, 32: 297, 33: 281, 34: 253, 35: 226, 36: 166, 37: 152,
    38: 108, 39: 90, 40: 91, 41: 60, 42: 55, 43: 53, 44: 34, 45: 30, 46: 24, 47: 27,
    48: 17, 49: 9, 50: 11, 51: 9, 52: 7, 53: 6, 54: 3,
}


def bucket_boundaries(bucket_size: int, max_length: int) -> np.ndarray:
  """Flax's `get_bucket_boundaries`: exclusive upper bounds 9, 17, 25, ... for 8."""
  return np.arange(bucket_size, max_length + bucket_size, bucket_size) + 1


def bucket_of(length: int, boundaries: np.ndarray) -> int:
  """The bucket `bucket_by_sequence_length` puts a length in (len(boundaries): overflow)."""
  return int(np.searchsorted(boundaries, length, side="right"))


def flax_padded_size(longest: int, bucket_size: int, max_length: int) -> int:
  """A batch's padded length: its bucket's boundary minus 1, or its longest in
  the overflow bucket."""
  boundaries = bucket_boundaries(bucket_size, max_length)
  b = bucket_of(longest, boundaries)
  return int(boundaries[b]) - 1 if b < len(boundaries) else int(longest)


def flax_batches(steps: int, batch: int, bucket_size: int, max_length: int,
                 rng: np.random.Generator) -> list[list[int]]:
  """The sentence lengths of the first `steps` batches, epoch after epoch."""
  lengths = np.repeat(np.array(list(SST2_TRAIN_LENGTHS)),
                      np.array(list(SST2_TRAIN_LENGTHS.values())))
  boundaries = bucket_boundaries(bucket_size, max_length)
  out: list[list[int]] = []
  while len(out) < steps:
    windows: list[list[int]] = [[] for _ in range(len(boundaries) + 1)]
    epoch: list[list[int]] = []
    for n in rng.permutation(lengths):
      window = windows[bucket_of(int(n), boundaries)]
      window.append(int(n))
      if len(window) == batch:
        epoch.append(window.copy())
        window.clear()
    # drop_remainder=True: the incomplete windows are dropped
    if not epoch:
      raise ValueError(f"no bucket of SST-2's train split fills a batch of {batch}")
    out += [epoch[i] for i in rng.permutation(len(epoch))]
  return out[:steps]
