"""The tight bucket of a never-seen size, remembered as intervals (`IntervalMemo`).

Every never-seen size asks its dimension's grid for its tight bucket; for
monotone policies `pj.jit` answers from the intervals [smallest size seen,
bucket] it has computed. The answer must be the policy's own for every size,
in any order: with a maximum (an overflow above it is exact or refused), with
grid points that are not their own bucket (`steps=3`), and for explicit lists.
"""

from __future__ import annotations

import random

import pytest

from polyjit._buckets.fixed import Exact, Explicit, Multiples, PowersOfTwo
from polyjit._jit.bucket_choice import MONOTONE, IntervalMemo

POLICIES = [PowersOfTwo(), PowersOfTwo(steps=4), PowersOfTwo(minimum=100, steps=3),
            PowersOfTwo(maximum=1000), PowersOfTwo(maximum=3000, steps=4, overflow="raise"),
            Multiples(k=7), Explicit(buckets=(10, 50, 300)),
            Explicit(buckets=(10, 50, 300), overflow="raise"), Exact()]


def answer(bucket, n):
  try:
    return bucket(n)
  except Exception as e:  # the same refusal, from the memo as from the policy
    return type(e)


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_the_memo_gives_the_policys_bucket_for_every_size(policy):
  assert type(policy) in MONOTONE
  memo = IntervalMemo(policy.bucket, policy.maximum)
  rng = random.Random(0)
  sizes = [rng.randint(0, 5000) for _ in range(5000)] + list(range(0, 5001))
  for n in sizes:
    assert answer(memo, n) == answer(policy.bucket, n), n


def test_the_memo_starts_over_past_its_limit(monkeypatch):
  monkeypatch.setattr(IntervalMemo, "LIMIT", 8)
  memo = IntervalMemo(Exact().bucket, None)
  for n in range(1, 100):
    assert memo(n) == n
    assert len(memo.tops) <= 8
