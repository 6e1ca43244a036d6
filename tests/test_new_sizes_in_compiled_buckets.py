"""Long runs: a never-seen size in a compiled bucket reuses that bucket's plan
(no new plan built, nothing compiled), with results equal to `jax.jit`'s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jit import plans as _jit_plans
from polyjit._jit.args import call_signature
from test_jit import assert_same


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def scaled(x, k):
  return x * k, jnp.cumsum(x)


@pytest.mark.parametrize("mode", ["explicit", "automatic", "keywords"])
def test_a_new_size_in_a_compiled_bucket_builds_no_plan(mode):
  if mode == "explicit":
    f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[64])
  else:
    f = pj.jit(loglik, buckets=[64])
  ref = jax.jit(loglik)
  rng = np.random.default_rng(1)
  data = rng.standard_normal(64).astype(np.float32)
  call = ((lambda n: f(data[:n], mu=np.float32(0.3), log_sigma=np.float32(-0.2)))
          if mode == "keywords" else (lambda n: f(data[:n], np.float32(0.3), np.float32(-0.2))))
  for n in (10, 11, 12):  # automatic mode: exact first call, then the bucket's first plan
    assert_same(call(n), ref(data[:n], np.float32(0.3), np.float32(-0.2)))
  built = _jit_plans.plans_built
  with pj.diagnostics.count_compiles() as compiles:
    got = [call(n) for n in range(13, 64)] + [call(n) for n in (40, 13, 63)]
  assert len(compiles) == 0
  assert _jit_plans.plans_built == built, "a new size built a new plan"
  for n, g in zip(list(range(13, 64)) + [40, 13, 63], got, strict=True):
    assert_same(g, ref(data[:n], np.float32(0.3), np.float32(-0.2)))


def test_resized_plans_slice_dynamic_outputs_and_keep_device_arrays():
  # Outputs with a dynamic dim are sliced to each new size; device-array and
  # Python-scalar arguments take the same path.
  f = pj.jit(scaled, polymorphic_shapes=["n", None], buckets=[32])
  ref = jax.jit(scaled)
  x = np.arange(32, dtype=np.float32)
  f(x[:3], 2.0), f(x[:4], 2.0)
  built = _jit_plans.plans_built
  for n in range(5, 33):
    arg = jnp.asarray(x[:n]) if n % 2 else x[:n]
    assert_same(f(arg, 2.0), ref(arg, 2.0))
  assert _jit_plans.plans_built == built


def test_a_new_size_under_the_default_policy_reuses_the_roomy_bucket():
  # Cost-aware default: sizes below the headroom bucket run there, resized.
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None])
  rng = np.random.default_rng(2)
  data = rng.standard_normal(300).astype(np.float32)
  mu, ls = np.float32(0.1), np.float32(0.4)
  f(data[:200], mu, ls)
  built = _jit_plans.plans_built
  ref = jax.jit(loglik)
  sizes = range(100, 200, 7)
  with pj.diagnostics.count_compiles() as compiles:
    got = [f(data[:n], mu, ls) for n in sizes]
  assert len(compiles) == 0
  for n, g in zip(sizes, got, strict=True):
    np.testing.assert_allclose(g, ref(data[:n], mu, ls), rtol=1e-5)
  assert _jit_plans.plans_built == built



def test_a_new_program_rebuilds_only_the_borrowing_plans_it_may_hold():
  # Cost-aware default: 30 and 150 borrow the headroom bucket (512). A new
  # program that holds neither (2048) leaves both plans as they are; once a
  # bucket that holds 30 is compiled (32), 30 moves there and 150 stays.
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None])
  rng = np.random.default_rng(3)
  data = rng.standard_normal(3000).astype(np.float32)
  mu, ls = np.float32(0.2), np.float32(-0.1)
  call = lambda n: f(data[:n], mu, ls)
  plan = lambda n: f._hot[call_signature((data[:n], mu, ls))]
  call(200)
  assert list(f.stats.bucket_hits) == [(("n", 512),)]
  call(30), call(150)
  before = {n: plan(n) for n in (30, 150)}
  assert all(p.borrow is not None for p in before.values())
  call(1000)                                     # a new program: bucket 2048
  assert len(f.stats.compile_events) == 2
  for n in (30, 150):
    assert_same(call(n), jax.jit(loglik)(data[:n], mu, ls))
    assert plan(n) is before[n], f"{n}: its plan was rebuilt"
  f.precompile(jax.ShapeDtypeStruct((8,), jnp.float32), mu, ls, sizes={"n": [30]},
               progress=False)                   # bucket 32, noticed with the
  call(3000)                                     # next new program (8192)
  assert len(f.stats.compile_events) == 4
  for n in (30, 150):
    assert_same(call(n), jax.jit(loglik)(data[:n], mu, ls))
  assert plan(150) is before[150]
  assert plan(30) is not before[30] and plan(30).bucket == (("n", 32),)
  assert f.stats.bucket_hits[(("n", 32),)] == 1
