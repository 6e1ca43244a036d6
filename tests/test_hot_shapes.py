"""Hot shapes buy their own program (`polyjit/_jit/hot_shapes.py`): once a
plan's calls have paid a compile in overhead, its shapes run `jax.jit`'s own
program: exact as jax.jit by construction, compiled once (counted with
`jax.monitoring`), with jax.jit's donation and transfer-guard semantics, on
both call paths; shapes called a few times buy nothing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from call_paths import backend_compiles, bought, buy_at_once, path, settle  # noqa: F401 (fixtures)


def _loglik(x, mu):
  return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def _scaled(x):  # a dynamic-size output
  return jnp.tanh(x) * 2.0


def test_hot_shape_runs_jax_jit_program_exactly(path: str, buy_at_once: None) -> None:
  rng = np.random.default_rng(0)
  f = pj.jit(_scaled, buckets=pj.buckets.PowersOfTwo())
  ref = jax.jit(_scaled)
  sizes = (5, 7, 6)  # one bucket (8)
  xs = [jax.device_put(rng.standard_normal((n, 3)).astype(np.float32)) for n in sizes]
  for x in xs:
    f(x)
  for x in xs:
    assert bought(f, x)
  assert sum(p.exact_call is not None for p in f._hot.values()) == len(sizes)
  before = backend_compiles()
  for _ in range(3):
    for x in xs:
      out = f(x)
      want = ref(x)
      assert out.shape == want.shape and out.dtype == want.dtype
      np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
  assert backend_compiles() == before  # bought programs are found in jax.jit's cache
  causes = [e.cause.kind for e in f.stats.compile_events]
  assert causes.count("hot shape") == len(sizes)
  assert "hot shape" not in causes[:2]  # (the first call, then the bucket)
  assert "called so often" in pj.explain(f)


def test_hot_shape_compiles_are_counted_by_jax_monitoring(path: str, buy_at_once: None) -> None:
  rng = np.random.default_rng(1)
  f = pj.jit(lambda x, mu: jnp.sum((x - mu) ** 2) / x.shape[0],
             buckets=pj.buckets.PowersOfTwo())
  mu = jax.device_put(np.float32(0.5))
  x5, x6 = (jax.device_put(rng.standard_normal(n).astype(np.float32)) for n in (5, 6))
  f(x5, mu)
  f(x6, mu)  # the bucket
  want = np.sum((np.asarray(x6) - np.float32(0.5)) ** 2) / 6
  before = backend_compiles()
  assert bought(f, x6, mu)
  assert backend_compiles() == before + 1  # its own program, once
  for _ in range(5):
    np.testing.assert_allclose(f(x6, mu), want, rtol=1e-6)
  assert backend_compiles() == before + 1


def test_few_calls_buy_nothing(path: str) -> None:
  rng = np.random.default_rng(2)
  f = pj.jit(_loglik, buckets=pj.buckets.PowersOfTwo())
  mu = jax.device_put(np.float32(0.1))
  xs = [jax.device_put(rng.standard_normal(n).astype(np.float32)) for n in (900, 1000, 950)]
  for _ in range(20):
    for x in xs:
      f(x, mu)
  settle()
  assert all(p.exact_call is None for p in f._hot.values())
  assert "hot shape" not in [e.cause.kind for e in f.stats.compile_events]


def test_hot_shape_keeps_donation(buy_at_once: None) -> None:
  f = pj.jit(lambda x: x * 2.0, buckets=pj.buckets.PowersOfTwo(), donate_argnums=0)
  make = lambda n: jax.device_put(np.arange(n, dtype=np.float32))  # noqa: E731
  f(make(5))
  f(make(6))
  x = make(6)
  assert bought(f, make(6))
  x = make(6)
  out = f(x)
  np.testing.assert_array_equal(np.asarray(out), np.arange(6, dtype=np.float32) * 2)
  with pytest.raises(RuntimeError, match="deleted"):  # donated, as jax.jit does
    np.asarray(x)


def test_hot_shape_runs_under_transfer_guard(path: str, buy_at_once: None) -> None:
  rng = np.random.default_rng(3)
  f = pj.jit(_loglik, buckets=pj.buckets.PowersOfTwo())
  mu = jax.device_put(np.float32(0.1))
  x5, x7 = (jax.device_put(rng.standard_normal(n).astype(np.float32)) for n in (5, 7))
  f(x5, mu)
  f(x7, mu)
  assert bought(f, x7, mu)
  with jax.transfer_guard("disallow"):
    got = f(x7, mu)
  np.testing.assert_allclose(got, jax.jit(_loglik)(x7, mu), rtol=1e-6)
  with jax.transfer_guard("disallow"), pytest.raises(Exception, match="host-to-device"):
    f(np.asarray(x7), mu)  # a host argument: jax.jit's guard refuses it too


def test_hot_shapes_are_per_trace_context(buy_at_once: None) -> None:
  f = pj.jit(lambda x: jnp.sum(x * 3), buckets=pj.buckets.PowersOfTwo())
  x5, x6 = (jax.device_put(np.arange(n, dtype=np.int32)) for n in (5, 6))
  f(x5)
  f(x6)
  assert bought(f, x6)
  with jax.numpy_dtype_promotion("strict"):
    out = f(x6)
  assert out.dtype == jax.jit(lambda x: jnp.sum(x * 3))(x6).dtype
  assert int(out) == 45


def test_clear_cache_drops_hot_shape_programs(buy_at_once: None) -> None:
  f = pj.jit(lambda x: jnp.cumsum(x) * 2, buckets=pj.buckets.PowersOfTwo())
  x5, x6 = (jax.device_put(np.arange(n, dtype=np.float32)) for n in (5, 6))
  want = np.cumsum(np.arange(6, dtype=np.float32)) * 2
  f(x5)
  f(x6)
  assert bought(f, x6)
  f.clear_cache()
  before = backend_compiles()
  np.testing.assert_array_equal(np.asarray(f(x6)), want)
  assert backend_compiles() > before  # compiled again: nothing kept
  assert all(p.exact_call is None for p in f._hot.values())
