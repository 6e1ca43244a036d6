"""pj.jit's call path: a repeated call builds nothing, and the record of calls stays bounded.

A repeated signature must go straight from its key to its plan: no flattening,
no structure lookup, no plan, no padded-shape computation. A never-seen size in
a compiled bucket resizes that bucket's plan and nothing more. Whatever the
number of distinct sizes, what `pj.stats` keeps per call is O(1): the sizes a
dimension took are a bounded sketch past `SizeRecord.LIMIT` (issue 31: 33
bytes per never-seen size, forever). The builders are counted by wrapping them
(monkeypatch), never by timing.
"""

from __future__ import annotations

import collections
import heapq
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jit import bucket_choice, compile as jit_compile, planner, plans
from polyjit._jit.stats import SizeRecord, Stats


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


MU, LS = np.float32(0.1), np.float32(0.3)
DATA = np.random.default_rng(0).standard_normal(5000).astype(np.float32)


@pytest.fixture
def builders(monkeypatch):
  """Counts the calls of everything that builds or looks up a plan or a
  padded shape off the hot path."""
  counts: collections.Counter[str] = collections.Counter()

  def counting(owner, name):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
      counts[name] += 1
      return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapper)

  counting(plans.Plan, "__init__")
  counting(plans.Plan, "resized")
  counting(plans.Template, "plan_at")
  counting(planner.Planner, "prepare")
  counting(planner.Planner, "plan_for")
  counting(planner.Planner, "fast_plan")
  counting(Stats, "record_sizes")
  for module in (plans, bucket_choice, jit_compile):  # every namespace that calls it
    counting(module, "padded_shapes")
  return counts


@pytest.mark.parametrize("make", [
    lambda: pj.jit(loglik),
    lambda: pj.jit(loglik, polymorphic_shapes=["n", None, None]),
    lambda: pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[512, 4096]),
], ids=["auto", "explicit", "fixed buckets"])
def test_a_repeated_call_builds_nothing(make, builders):
  f = make()
  ref = jax.jit(loglik)
  for n in (300, 200, 250, 250, 300):  # automatic mode: 200 makes the axis dynamic
    f(DATA[:n], MU, LS)
  builders.clear()
  for _ in range(50):
    for n in (200, 250, 300):
      got = f(DATA[:n], MU, LS)
  assert builders == {}, dict(builders)
  np.testing.assert_allclose(got, ref(DATA[:300], MU, LS), rtol=1e-5)


def test_a_never_seen_size_in_a_compiled_bucket_only_resizes_its_plan(builders):
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[4096])
  f(DATA[:3000], MU, LS)
  builders.clear()
  with pj.diagnostics.count_compiles() as compiles:
    for n in range(1000, 1100):
      f(DATA[:n], MU, LS)
  assert len(compiles) == 0
  # one resized plan per size, built from the bucket's template: no new plan,
  # no flattening, no padded shapes
  assert builders["plan_at"] == builders["resized"] == 100
  assert builders["__init__"] == builders["prepare"] == builders["padded_shapes"] == 0
  np.testing.assert_allclose(f(DATA[:1050], MU, LS), jax.jit(loglik)(DATA[:1050], MU, LS),
                             rtol=1e-5)


def record_size(stats):
  """What the record keeps, entry by entry (not its bytes: a count of items)."""
  return (len(stats.bucket_hits), len(stats.compile_events),
          {d: len(r.sizes._hashes) <= 2 * SizeRecord.LIMIT for d, r in stats.dims.items()})


def bottom(record):
  """The sizes of a sketch's `LIMIT` smallest hashes (what it estimates from)."""
  return set(heapq.nsmallest(SizeRecord.LIMIT, record._hashes, key=record._hashes.get))


def test_the_stats_record_stays_bounded_over_distinct_sizes(monkeypatch):
  monkeypatch.setattr(SizeRecord, "LIMIT", 16)
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[4096])
  f(DATA[:4000], MU, LS)
  for n in range(100, 400):
    f(DATA[:n], MU, LS)
  first = record_size(f.stats)
  for n in range(400, 1400):
    f(DATA[:n], MU, LS)
  assert record_size(f.stats) == first == (1, 1, {"n": True})
  record = f.stats.dims["n"].sizes
  assert not record.exact and min(record) == 100 and max(record) == 4000
  assert 0.6 * 1301 < len(record) < 1.6 * 1301
  text = pj.explain(f)
  assert f"took about {len(record)} distinct sizes in [100, 4000]" in text


def test_size_record_is_exact_below_its_limit_and_a_sketch_above():
  sizes = random.Random(0).sample(range(1, 10**6), 20000)
  small = SizeRecord(sizes[:SizeRecord.LIMIT])
  assert small.exact and len(small) == SizeRecord.LIMIT and set(small) == set(sizes[:SizeRecord.LIMIT])
  record = SizeRecord(sizes)
  assert not record.exact and SizeRecord.LIMIT <= len(record._hashes) < 2 * SizeRecord.LIMIT
  assert abs(len(record) - 20000) < 0.15 * 20000  # ~3% expected (1/sqrt(LIMIT))
  assert min(record) == min(sizes) and max(record) == max(sizes)
  # duplicates and order do not change it; two records merge into the record of both
  again = SizeRecord(sizes[::-1] + sizes[:500])
  assert bottom(again) == bottom(record) and len(again) == len(record)
  merged = SizeRecord(sizes[:7000])
  merged.update(SizeRecord(sizes[7000:]))
  assert bottom(merged) == bottom(record) and len(merged) == len(record)


def test_a_size_repeated_in_a_bucket_over_twice_its_size_gets_its_own():
  # Issue 35: once seen REPEATS times, no size runs in a bucket more than
  # LOOSE x its size, even where the estimated waste has not paid a compile.
  from polyjit._buckets.cost_aware import LOOSE, REPEATS
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None])
  f(DATA[:3000], MU, LS)                       # the headroom bucket: 8192
  (first,) = [dict(e.key.bucket)["n"] for e in f.stats.compile_events]
  assert first > LOOSE * 300
  with pj.diagnostics.count_compiles() as compiles:
    for _ in range(REPEATS - 1):
      f(DATA[:300], MU, LS)
  assert len(compiles) == 0                    # the account alone has not paid
  with pj.diagnostics.count_compiles() as compiles:
    got = [f(DATA[:300], MU, LS) for _ in range(3)]
  assert len(compiles) == 1
  bought = dict(f.stats.compile_events[-1].key.bucket)["n"]
  assert 300 <= bought <= LOOSE * 300
  assert f.stats.bucket_hits[(("n", bought),)] >= 2
  assert f"n=300 ran {REPEATS} times in bucket n={first}" in pj.explain(f)
  for g in got:
    np.testing.assert_allclose(g, jax.jit(loglik)(DATA[:300], MU, LS), rtol=1e-5)
