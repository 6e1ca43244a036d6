"""pj.jit's hot path and the cost-aware bucket policy: same results as jax.jit,
compiles measured with jax.monitoring, decisions driven by the recorded costs."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._buckets.cost_aware import Rental
from polyjit._jit import hot_shapes
from test_jit import assert_same


@pytest.fixture(autouse=True)
def no_hot_shapes(monkeypatch):
  """The buckets' decisions are what these tests check. A hot shape's move to
  `jax.jit`'s program (`_jit/hot_shapes.py`) is timed, so a slow enough machine
  would take calls out of the buckets whose hits they count: it never buys here."""
  monkeypatch.setattr(hot_shapes, "RENT", math.inf)


def count(fn, *calls):
  with pj.diagnostics.count_compiles() as compiles:
    results = [fn(*c) for c in calls]
  return len(compiles), results


def scale_and_stats(x, w, k):
  return {"scaled": x * w + k, "sum": jnp.sum(x * w), "n": jnp.ones(2) * x.shape[0]}


def test_hot_path_repeats_match_jax_jit_for_every_argument_kind():
  # The second call of a signature takes the hot path: host and device
  # arrays, NumPy and Python scalars, an output with a dynamic dim (sliced)
  # and outputs without one.
  f = pj.jit(scale_and_stats, polymorphic_shapes=["n", None, None])
  ref = jax.jit(scale_and_stats)
  rng = np.random.default_rng(0)
  x = rng.standard_normal(37).astype(np.float32)
  calls = [(x, np.float32(0.5), 2.0), (jnp.asarray(x), 1.5, np.float32(3)),
           (x[:20], np.float32(0.5), 2)]
  for args in calls + calls:
    assert_same(f(*args), ref(*args))
  n_compiles, _ = count(f, *calls)
  assert n_compiles == 0
  assert f.stats.calls == 9


def test_hot_path_sees_a_new_program_after_a_background_compile():
  f = pj.jit(lambda x: x.sum(), polymorphic_shapes=["n"], background_compile=True,
             buckets=pj.buckets.PowersOfTwo())
  assert float(f(np.ones(900, np.float32))) == 900.0          # compiles 1024
  small = np.ones(100, np.float32)
  assert float(f(small)) == 100.0 and float(f(small)) == 100.0  # hot path, on 1024
  for key in f._cache.keys():
    f._cache.peek(key).result()                                # bucket 128 is ready
  assert float(f(small)) == 100.0
  assert f.stats.bucket_hits[(("n", 128),)] == 1


def loglik(x, mu):
  return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def test_cost_aware_compiles_with_headroom_then_runs_smaller_sizes_in_that_bucket():
  f = pj.jit(loglik, polymorphic_shapes=["n", None], buckets=pj.buckets.CostAware())
  rng = np.random.default_rng(1)
  first = rng.standard_normal(300).astype(np.float32)
  n1, _ = count(f, (first, 0.2))
  (bucket,) = f.stats.bucket_hits
  assert n1 == 1 and dict(bucket)["n"] >= 600  # twice the size, on the grid
  sizes = [599, 40, 300, 123]
  data = [rng.standard_normal(n).astype(np.float32) for n in sizes]
  n2, got = count(f, *[(x, 0.2) for x in data])
  assert n2 == 0 and set(f.stats.bucket_hits) == {bucket}
  for g, x in zip(got, data):
    assert_same(g, jax.jit(loglik)(x, 0.2))
  assert "headroom 2x" in pj.explain(f) and "cost-aware buckets compiled 1" in pj.explain(f)


def test_cost_aware_compiles_a_tighter_bucket_once_its_waste_pays_for_it():
  # Integer data: the sum is exact in any order, so the results of the large
  # and the tight bucket must agree bit for bit.
  def total(x):
    return jnp.sum(x * x), x * 2
  f = pj.jit(total, polymorphic_shapes=["n"],
             buckets=pj.buckets.CostAware(estimates="measured"))
  ref = jax.jit(total)
  x = np.arange(1, 801, dtype=np.int32)
  f(x)                                          # compiles a bucket >= 1600
  (large,) = f.stats.bucket_hits
  struct = next(iter(f._structures.values()))
  assert struct.rental.run_time(large) > 0      # measured on that call
  small = x[:50]
  assert_same(f(small), ref(small), exact=True)  # borrows the large bucket
  struct.rental.compile_estimate = 0.0          # any waste now pays for a compile
  f(small)                                      # pays: compiles in the background
  for key in f._cache.keys():
    f._cache.peek(key).result()
  assert len(f._cache.keys()) == 2              # one at a time: the tightest first
  out = f(small)
  tight = pj.buckets.CostAware().bucket(50)
  assert f.stats.bucket_hits[(("n", tight),)] >= 1
  assert_same(out, ref(small), exact=True)
  text = pj.explain(f)
  assert f"bucket n={tight} in the background" in text and "> compile 0 s" in text


def test_cost_aware_gives_a_costly_program_its_tight_bucket():
  rental = Rental({"n": pj.buckets.CostAware(estimates="measured")})
  rental.compiled((("n", 1000),), {"n": 1000}, 0.1)
  rental.record_time((("n", 1000),), 0.05)      # 50 ms a call, 100 ms a compile
  assert rental.roomy({"n": 1500}) == rental.tight({"n": 1500})
  rental.record_time((("n", 1000),), 1e-5)      # now 10 us a call: headroom pays
  assert rental.roomy({"n": 1500})["n"] >= 3000


def test_cost_aware_estimates_interpolate_and_keep_the_fixed_cost():
  rental = Rental({"n": pj.buckets.CostAware(estimates="measured")})
  for n, t in ((100, 2e-5), (1000, 1.1e-4)):
    rental.compiled((("n", n),), {"n": n}, 0.1)
    rental.record_time((("n", n),), t)
  assert rental.estimate({"n": 550}) == pytest.approx(6.5e-5)
  assert rental.estimate({"n": 10}) == pytest.approx(1.1e-5)   # the line, not 0
  (account, seconds), = rental.charges((("n", 1000),), [rental.account({"n": 550}, None)])
  assert seconds == pytest.approx(1.1e-4 - 6.5e-5)


def padded_cost(buckets, sample, power):
  return sum(min(b for b in buckets if b >= s) ** power for s in sample)


def test_fit_finds_the_cheapest_buckets_of_a_sample():
  rng = np.random.default_rng(0)
  for _ in range(60):
    sample = rng.integers(1, 40, rng.integers(1, 10)).tolist()
    k, power = int(rng.integers(1, 5)), float(rng.choice([1, 2]))
    got = pj.buckets.fit(sample, max_programs=k, power=power)
    values = sorted(set(sample))
    best = min(padded_cost(c + (values[-1],), sample, power)
               for r in range(min(k, len(values)))
               for c in itertools.combinations(values[:-1], r))
    assert len(got.buckets) <= k and max(sample) in got.buckets
    assert padded_cost(got.buckets, sample, power) == pytest.approx(best)
  with pytest.raises(ValueError, match="max_programs"):
    pj.buckets.fit([3], max_programs=0)


def test_precompile_a_fitted_policy_then_compile_nothing():
  sample = [30, 31, 90, 95, 200, 40]
  f = pj.jit(loglik, polymorphic_shapes=["n", None],
             buckets=pj.buckets.fit(sample, max_programs=2))
  assert len(f.bucket_policy("n").buckets) == 2  # which two: the test above
  mu = np.float32(0.5)
  with pj.diagnostics.count_compiles() as precompiled:
    f.precompile(jax.ShapeDtypeStruct((8,), jnp.float32), mu, sizes={"n": sample},
                 progress=False)
  data = [np.linspace(0, 1, n, dtype=np.float32) for n in (33, 200, 7, 150)]
  n_calls, got = count(f, *[(x, mu) for x in data])
  assert len(precompiled) == 2 and n_calls == 0
  for g, x in zip(got, data):
    assert_same(g, jax.jit(loglik)(x, mu))


# --- the default: cost-aware with deterministic estimates (`_buckets/cost_model.py`) --------

def run_sequence(fun, sizes, spec, **kw):
  """(results, bucket of each call, compiles) of a fresh pj.jit over `sizes`."""
  f = pj.jit(fun, polymorphic_shapes=spec, **kw)
  rng = np.random.default_rng(7)
  data = [rng.standard_normal((n, 64)).astype(np.float32) for n in sizes]
  results, buckets = [], []
  with pj.diagnostics.count_compiles() as compiles:
    for x in data:
      results.append(np.asarray(f(x, *WEIGHTS)))
      hits = dict(f.stats.bucket_hits)
      buckets.append(hits)
  return f, data, results, buckets, len(compiles)


# (Weights as arguments: jaxlib 0.10.2's CPU compiler miscomputes
# `jnp.sum(x @ jnp.ones(...), axis=1)`, a dot with a constant fused into a
# reduction, even under plain jax.jit.)
WEIGHTS = tuple(np.random.default_rng(2).standard_normal(s).astype(np.float32) / 8
                for s in ((64, 256), (256, 256)))


def wide(x, w1, w2):
  return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2), axis=1)


def test_default_policy_is_cost_aware_and_repeats_its_choices_bit_for_bit():
  sizes = [300, 40, 290, 610, 77, 600, 33, 300, 599, 45, 512, 260] * 3
  runs = [run_sequence(wide, sizes, ["n, 64", None, None]) for _ in range(2)]
  (f, data, results, buckets, compiles), (_, _, results2, buckets2, compiles2) = runs
  assert isinstance(f.bucket_policy("n"), pj.buckets.CostAware)
  assert buckets == buckets2 and compiles == compiles2  # same buckets, call by call
  for a, b in zip(results, results2):
    assert np.array_equal(a, b)                          # so the same bits
  ref = jax.jit(wide)
  for x, got in zip(data, results):
    np.testing.assert_allclose(got, ref(x, *WEIGHTS), rtol=2e-5, atol=1e-5)
  struct = next(iter(f._structures.values()))
  assert struct.rental.model is not None and struct.rental.times == {}  # nothing timed


def test_the_model_keeps_a_cheap_program_in_few_buckets_and_gives_a_costly_one_tight_ones():
  sizes = list(np.random.default_rng(5).permutation(np.arange(40, 1000, 23)))
  cheap = pj.jit(loglik, polymorphic_shapes=["n", None])
  rng = np.random.default_rng(3)
  with pj.diagnostics.count_compiles() as cheap_compiles:
    for n in sizes:
      cheap(rng.standard_normal(n).astype(np.float32), 0.1)
  fixed = len({pj.buckets.CostAware().bucket(n) for n in sizes})
  assert len(cheap_compiles) <= 3 < fixed   # microseconds of work: headroom, kept

  # 0.3 ms of work per 100 rows: the padding a larger bucket wastes soon pays for tighter ones
  w = np.random.default_rng(4).standard_normal((256, 256)).astype(np.float32) / 16
  def costly(x, w):
    return jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w), axis=1)
  f = pj.jit(costly, polymorphic_shapes=["n, 256", None])
  ref = jax.jit(costly)
  for i, n in enumerate(sizes * 6):
    x = rng.standard_normal((n, 256)).astype(np.float32)
    got = f(x, w)
    if i % 20 == 0:
      np.testing.assert_allclose(got, ref(x, w), rtol=2e-5, atol=1e-5)
  assert len(f.stats.compile_events) >= len(cheap_compiles) + 3
  assert "(estimated waste" in pj.explain(f)


def test_cost_model_counts_contractions_loops_and_branches():
  from polyjit._buckets.cost_model import CostModel, work

  def fun(x, w):
    def step(c, xt):
      return jnp.tanh(c @ w + xt), None
    c, _ = jax.lax.scan(step, jnp.zeros(8), x)
    y = jax.lax.cond(c[0] > 0, lambda: x @ w, lambda: x)
    return jnp.sum(y) + jnp.sum(c)

  def flops_at(n):
    jaxpr = jax.make_jaxpr(fun)(np.ones((n, 8), np.float32), np.ones((8, 8), np.float32))
    return work(jaxpr.jaxpr, {})
  small, large = flops_at(10), flops_at(40)
  # the scan body (a (8,)@(8,8) product: 128 flops) runs n times, the costlier
  # branch (an (n,8)@(8,8) product: 128 n flops) once: both linear in n
  assert large.flops - small.flops >= 30 * (128 + 128)
  assert large.iterations == 40 and small.iterations == 10
  model = CostModel(jax.make_jaxpr(fun)(np.ones((10, 8)), np.ones((8, 8))).jaxpr, "cpu")
  assert model.loops == 1 and model.compile_seconds() > 0


def test_a_selection_in_a_borrowed_bucket_comes_back_at_its_exact_size():
  # A call that runs in a larger compiled bucket (the cost-aware default's
  # headroom) reads its data-dependent sizes back like any other.
  f = pj.jit(lambda x: (jnp.sum(x[x > 0] ** 2), x[x > 0]), polymorphic_shapes=["n"])
  for n in (300, 50, 700, 20):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    total, kept = f(x)
    np.testing.assert_allclose(total, np.sum(x[x > 0] ** 2), rtol=1e-5)
    np.testing.assert_array_equal(kept, x[x > 0])
  assert len(pj.stats(f).buckets) < 4  # some calls borrowed a compiled bucket


def test_powers_of_two_with_steps_is_the_smallest_grid_size_that_holds():
  # Brute force: the sizes 2^k * (1 + j/steps), from 16; every power of two is one.
  for steps in (1, 2, 4):
    policy = pj.buckets.PowersOfTwo(steps=steps)
    grid = sorted({16} | {(2 ** k) * (steps + j) // steps for k in range(4, 14)
                          for j in range(steps)})
    for n in range(0, 5000, 7):
      assert policy(n) == min(b for b in grid if b >= n), (steps, n)
  assert pj.buckets.PowersOfTwo(steps=4).sizes(33, 64) == [40, 48, 56, 64]
  with pytest.raises(ValueError, match="steps"):
    pj.buckets.PowersOfTwo(steps=0)
  # the default's headroom bucket: nearby sizes agree, whatever came first
  policy = pj.buckets.CostAware()
  assert {policy.roomy(n, seen) for n in range(20, 26) for seen in range(20, 26)} == {64}
