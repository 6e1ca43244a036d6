"""Small `pj.jit` programs run on polyjit's synchronous CPU client (`_jit/inline.py`,
`_jax/inline_cpu.py`): the same executable as on JAX's default client, so the
same results bit for bit, with outputs that look like `jax.jit`'s (the default
device, dtype, weak type, commitment), and no `jax.config` value changed.
Programs that cannot move there (donation, host callbacks, large ones, the
opt-out) stay on the default client."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._caching import disk as _disk_cache
from polyjit._jit import inline as _inline
from polyjit._jit.inline import InlineProgram

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not jax.config.values.get("jax_cpu_enable_async_dispatch", True),
    reason="only CPU with asynchronous dispatch (JAX's default) hands programs to a pool")


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def programs(f):
  """Every program a pj.jit function's plans run."""
  return [p.program for s in f._structures.values() for p in s.plans.values()]


def bits(x):
  return np.asarray(x).tobytes()


SIZES = [300, 301, 40, 299, 1000, 17, 300]


def test_small_programs_run_inline_and_give_the_default_clients_bits(monkeypatch):
  monkeypatch.setenv("POLYJIT_INLINE_CPU", "0")
  plain = pj.jit(loglik)
  mu, ls = np.float32(0.3), np.float32(-0.2)
  rng = np.random.default_rng(1)
  xs = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
  want = [bits(plain(x, mu, ls)) for x in xs]
  assert not any(isinstance(p, InlineProgram) for p in programs(plain))
  monkeypatch.delenv("POLYJIT_INLINE_CPU")
  f = pj.jit(loglik)
  got = [bits(f(x, mu, ls)) for x in xs]
  assert got == want
  assert programs(f) and all(isinstance(p, InlineProgram) for p in programs(f))
  # new sizes in a compiled bucket (resized plans, host size scalars) agree too
  extra = [rng.standard_normal(n).astype(np.float32) for n in (302, 303, 41)]
  assert [bits(f(x, mu, ls)) for x in extra] == [bits(plain(x, mu, ls)) for x in extra]


def test_outputs_look_like_jax_jits(monkeypatch):
  def fun(x, s):
    return {"total": jnp.sum(x) * s, "scaled": x * 2.0, "weak": s * 2.0}
  monkeypatch.setenv("POLYJIT_INLINE_CPU", "0")
  plain = pj.jit(fun)
  plain(np.arange(7, dtype=np.float32), 1.5)
  monkeypatch.delenv("POLYJIT_INLINE_CPU")
  f, j = pj.jit(fun), jax.jit(fun)
  for n in (7, 9, 12):
    x = np.arange(n, dtype=np.float32)
    got, want, before = f(x, 1.5), j(x, 1.5), plain(x, 1.5)
    for k in want:
      assert type(got[k]) is type(want[k])
      assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
      assert got[k].weak_type == want[k].weak_type
      assert got[k].device == jax.devices()[0]
      assert got[k].committed == before[k].committed  # (pj.jit's, inline or not)
      assert bits(got[k]) == bits(want[k])
  assert any(isinstance(p, InlineProgram) for p in programs(f))
  # an output fed to plain JAX mixes with the default device's arrays
  committed = jax.device_put(np.float32(1), jax.devices()[0])
  assert float(jnp.add(f(np.ones(3, np.float32), 1.0)["total"], committed)) == 4.0


def test_device_array_arguments_cross_over_with_their_types():
  def fun(x, y, w):
    return jnp.sum(x * y) + w
  f, j = pj.jit(fun), jax.jit(fun)
  dev = jax.devices()[0]
  for n in (5, 6, 11):
    x = jax.device_put(np.linspace(0, 1, n, dtype=np.float32), dev)   # committed
    y = jnp.asarray(np.linspace(1, 2, n, dtype=np.float32))           # uncommitted
    w = jnp.asarray(0.25)                                             # weakly typed
    got, want = f(x, y, w), j(x, y, w)
    assert bits(got) == bits(want)
    assert got.weak_type == want.weak_type and got.device == jax.devices()[0]
  assert any(isinstance(p, InlineProgram) for p in programs(f))


def test_programs_that_stay_on_the_default_client(monkeypatch):
  x = np.ones(9, np.float32)
  donating = pj.jit(lambda a: a * 2.0, donate_argnums=0)
  donating(jnp.ones(9))
  assert not any(isinstance(p, InlineProgram) for p in programs(donating))
  seen = []
  calling_back = pj.jit(lambda a: jax.debug.callback(seen.append, jnp.sum(a)) or a + 1.0)
  calling_back(x)
  jax.effects_barrier()
  assert seen and not any(isinstance(p, InlineProgram) for p in programs(calling_back))
  monkeypatch.setattr(_inline, "INLINE_FLOPS", 0.0)
  large = pj.jit(lambda a: jnp.sum(a * a))
  assert float(large(x)) == 9.0
  assert not any(isinstance(p, InlineProgram) for p in programs(large))


def test_programs_loaded_from_polyjits_disk_cache_run_inline(tmp_path):
  mu, ls = np.float32(0.1), np.float32(0.2)
  xs = [np.linspace(-1, 1, n, dtype=np.float32) for n in (50, 51, 60)]
  _disk_cache.enable(str(tmp_path))
  try:
    # (explicit specs: both run the same bucket programs; in automatic mode the
    # second would start with the axes the first learned and skip its exact
    # first-call program, `_caching/axes.py`, and round differently)
    first = pj.jit(loglik, polymorphic_shapes=("n", None, None))
    want = [bits(first(x, mu, ls)) for x in xs]
    second = pj.jit(loglik, polymorphic_shapes=("n", None, None))
    got = [bits(second(x, mu, ls)) for x in xs]
    assert second.stats.cache_loads > 0
  finally:
    _disk_cache.disable()
  assert got == want
  assert all(isinstance(p, InlineProgram) for p in programs(second))


def test_no_jax_setting_changes():
  before = {n: repr(v) for n, v in jax.config.values.items()}
  devices = jax.devices()
  f = pj.jit(lambda a: jnp.cumsum(a))
  for n in (4, 5, 6):
    f(np.ones(n, np.float32))
  assert any(isinstance(p, InlineProgram) for p in programs(f))
  assert {n: repr(v) for n, v in jax.config.values.items()} == before
  assert jax.devices() == devices


def test_an_unchanged_argument_crosses_once_and_a_deleted_one_is_refused():
  f = pj.jit(loglik)
  rng = np.random.default_rng(3)
  mu = jax.device_put(np.float32(0.3))
  ls = jax.device_put(np.float32(-0.2))
  ref = jax.jit(loglik)
  for n in SIZES:
    x = jax.device_put(rng.standard_normal(n).astype(np.float32))
    np.testing.assert_allclose(np.asarray(f(x, mu, ls)), np.asarray(ref(x, mu, ls)), rtol=1e-5)
  assert any(isinstance(p, InlineProgram) for p in programs(f))
  assert _inline._crossed.get(mu) is not None  # (crossed once, kept while mu lives)
  other = jax.device_put(np.float32(0.7))    # a new argument: its own value, not mu's
  np.testing.assert_allclose(np.asarray(f(x, other, ls)), np.asarray(ref(x, other, ls)), rtol=1e-5)
  mu.delete()
  with pytest.raises(RuntimeError, match="deleted"):
    f(x, mu, ls)
