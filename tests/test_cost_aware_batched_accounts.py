"""Cost-aware accounts charged in batches buy the same buckets in the same calls.

A call that borrows a larger bucket is counted, and the waste is charged to
the accounts of the smaller buckets later, in a batch (`Rental.settle_up`),
while no account can have reached its price. Charged call by call
(`QUIET_MAX = 1`: every paying call settles up) the run must be the same:
the same programs, for the same reasons, each call in the same bucket.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._buckets import cost_aware
from polyjit._jit import hot_shapes


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def run(sizes):
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None])
  data = np.random.default_rng(0).standard_normal(max(sizes)).astype(np.float32)
  buckets = []
  for i, n in enumerate(sizes):
    f(data[:n], np.float32(0.1), np.float32(0.3))
    buckets.append(tuple(f.stats.bucket_hits.items()))
    if i == 0:  # compiles priced low, so that accounts pay for several in this run
      (struct,) = f._structures.values()
      struct.rental.compile_estimate = 2e-4
  events = [(e.key.bucket, e.cause.reason) for e in f.stats.compile_events]
  return events, buckets


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_charges_buy_the_same_buckets_in_the_same_calls(seed, monkeypatch):
  # Hot shapes buy `jax.jit`'s own program once a shape's timed overhead pays
  # for it (`_jit/hot_shapes.py`): wall-clock, so on a loaded machine the 150
  # calls of 37 bought theirs at different calls in the two runs (CI, stop 5).
  # The accounts are what is compared here: hot shapes never buy.
  monkeypatch.setattr(hot_shapes, "RENT", math.inf)
  rng = np.random.default_rng(seed)
  sizes = [int(n) for n in np.exp(rng.uniform(np.log(20), np.log(3000), 1500))]
  sizes += [37] * 150  # a size repeated in a loose bucket: bought by `insist`
  batched = run(sizes)
  monkeypatch.setattr(cost_aware, "QUIET_MAX", 1)
  per_call = run(sizes)
  assert batched == per_call
  assert any("waste" in (reason or "") for _, reason in batched[0])  # accounts did pay


def test_calls_from_several_threads_keep_the_accounts_and_the_results():
  import concurrent.futures
  import jax
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None])
  ref = jax.jit(loglik)
  data = np.random.default_rng(3).standard_normal(3000).astype(np.float32)
  mu, ls = np.float32(0.1), np.float32(0.3)
  f(data[:2500], mu, ls)                 # the headroom bucket: every size below borrows it
  (struct,) = f._structures.values()
  struct.rental.compile_estimate = 5e-4  # accounts pay for buckets during the run
  sizes = [int(n) for n in np.random.default_rng(4).integers(20, 2500, 800)]

  def work(part):
    return [(n, f(data[:n], mu, ls)) for n in sizes[part::4]]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    done = [r for part in pool.map(work, range(4)) for r in part]
  assert len(done) == len(sizes)
  for n, got in done[::20]:
    np.testing.assert_allclose(got, ref(data[:n], mu, ls), rtol=1e-5)
  rental = struct.rental
  rental.settle_up()
  assert not rental.unpaid and all(not b.unpaid for b in rental.borrows.values())
