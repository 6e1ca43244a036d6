"""pj.jit: same results as jax.jit, one compile per bucket, measured."""

from __future__ import annotations

import functools
import logging
import math
import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj


def default_compiles(lengths):
  """Compiles of automatic mode under the default policy for a cheap function
  (no tighter bucket pays for itself): the first call's exact program, then
  a headroom bucket whenever no compiled one holds a size."""
  policy, largest, programs = pj.buckets.CostAware(), lengths[0], []
  for n in lengths[1:]:
    if not any(b >= n for b in programs):
      programs.append(policy.roomy(n, largest))
    largest = max(largest, n)
  return 1 + len(programs)


def loglik(x, mu):
  return jnp.sum(-0.5 * (x - mu) ** 2) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


def rnn(x, w):
  h, ys = lax.scan(lambda h, xt: (jnp.tanh(w @ h + xt), h.sum()), jnp.zeros(3), x)
  return h, ys


def outer_and_stats(x, y):
  return {"outer": x[:, None] * y[None, :], "stats": (x.sum(), jnp.argmax(y)),
          "fixed": jnp.ones(3) * x.shape[0]}


FUNCTIONS = [
    ("loglik", lambda x: loglik(x, 0.3), lambda n, rng: [rng.standard_normal(n)]),
    ("softmax", jax.nn.softmax, lambda n, rng: [rng.standard_normal(n).astype(np.float32)]),
    ("cumsum_out", lambda x: jnp.cumsum(x) * x[0], lambda n, rng: [rng.standard_normal(n)]),
    ("rnn", rnn, lambda n, rng: [rng.standard_normal((n, 3)).astype(np.float32),
                                 np.eye(3, dtype=np.float32) * 0.5]),
    ("pytree_two_dims", outer_and_stats,
     lambda n, rng: [rng.standard_normal(n), rng.standard_normal(n // 2 + 1)]),
    ("ints", lambda x: (x * 2, x.max(), jnp.sort(x.shape[0] * jnp.ones(2, jnp.int32))),
     lambda n, rng: [rng.integers(-9, 9, n).astype(np.int32)]),
]


def assert_same(actual, expected, exact=False):
  a_leaves, a_tree = jax.tree.flatten(actual)
  e_leaves, e_tree = jax.tree.flatten(expected)
  assert a_tree == e_tree
  for a, e in zip(a_leaves, e_leaves):
    assert isinstance(a, jax.Array), type(a)
    assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, e.shape, a.dtype, e.dtype)
    if exact:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
    else:
      np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", ["auto", "explicit"])
@pytest.mark.parametrize("name", [f[0] for f in FUNCTIONS])
def test_same_results_as_jax_jit(name, mode):
  _, fun, make = next(f for f in FUNCTIONS if f[0] == name)
  rng = np.random.default_rng(0)
  lengths = [7, 30, 3, 31, 18, 1, 64, 40]
  example = make(5, rng)
  specs = None
  if mode == "explicit":
    specs = [{"rnn": "(n, _)", "pytree_two_dims": "n"}.get(name, "n")] + [None] * (len(example) - 1)
    if name == "pytree_two_dims":
      specs = ["n", "m"]
  f = pj.jit(fun, polymorphic_shapes=specs)
  ref = jax.jit(fun)
  for n in lengths:
    args = make(n, rng)
    assert_same(f(*args), ref(*args))


def count(fn, *calls):
  with pj.diagnostics.count_compiles() as compiles:
    results = [fn(*c) for c in calls]
  return len(compiles), results


def test_compiles_grow_with_the_log_of_the_size_range():
  rng = np.random.default_rng(1)
  lengths = rng.choice(np.arange(100, 10_001), 60, replace=False)
  data = [rng.standard_normal(n).astype(np.float32) for n in lengths]
  f = pj.jit(loglik)
  n_compiles, results = count(f, *[(x, 0.1) for x in data])
  # Every compile during the calls is counted: this is also the proof that
  # padding and unpadding compile nothing per shape.
  assert n_compiles <= math.log2(10_000 / 100) + 5
  assert n_compiles == f.stats.compiles
  for x, r in zip(data, results):   # (NumPy in float64: eager JAX compiled each op per length)
    x64 = x.astype(np.float64)
    want = np.sum(-0.5 * (x64 - 0.1) ** 2) - 0.5 * len(x) * np.log(2 * np.pi)
    np.testing.assert_allclose(r, want, rtol=1e-4)


def test_no_compile_for_new_lengths_in_a_known_bucket():
  f = pj.jit(lambda x: (jnp.cumsum(x), x.sum()), polymorphic_shapes=["n"])
  f(np.ones(40, np.float32))  # bucket 64
  n_compiles, results = count(f, *[(np.arange(n, dtype=np.float32),) for n in range(33, 65)])
  assert n_compiles == 0
  for n, (c, s) in zip(range(33, 65), results):
    assert c.shape == (n,) and float(s) == n * (n - 1) / 2


def test_a_known_bucket_with_other_fixed_sizes_or_shared_dims_gets_its_own_program():
  # New sizes in a known bucket reuse its program; a fixed axis of another
  # size, or a shared dim whose axes disagree, must not.
  f = pj.jit(lambda x, y: (x @ x.T, x.sum(0), y * 2.0), polymorphic_shapes=["(n, _)", "n"],
             buckets=pj.buckets.PowersOfTwo())
  rng = np.random.default_rng(0)
  calls = [(20, 3), (21, 3), (30, 3), (22, 4), (23, 4), (40, 4)]
  seen = set()
  for n, k in calls:
    x, y = rng.standard_normal((n, k)).astype(np.float32), np.arange(n, dtype=np.float32)
    n_compiles, [(gram, colsum, twice)] = count(f, (x, y))
    assert n_compiles == (0 if (k, 32 if n <= 32 else 64) in seen else 1), (n, k)
    seen.add((k, 32 if n <= 32 else 64))
    np.testing.assert_allclose(gram, x @ x.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(colsum, x.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(twice, y * 2.0)
  with pytest.raises(pj.ShapeError):
    f(np.ones((21, 3), np.float32), np.ones(22, np.float32))


def test_decorator_forms_and_static_arguments():
  @pj.jit
  def a(x):
    return x * 2

  @pj.jit(buckets=pj.buckets.Multiples(10))
  def b(x):
    return x.sum()

  @functools.partial(pj.jit, static_argnums=1, static_argnames="mode")
  def c(x, k, mode="sum"):
    return getattr(jnp, mode)(x * k)

  x = np.arange(5.0, dtype=np.float32)
  np.testing.assert_array_equal(a(x), x * 2)
  assert float(b(x)) == 10.0
  assert float(c(x, 2)) == 20.0 and float(c(x, 3, mode="max")) == 12.0
  assert float(c(np.arange(7.0, dtype=np.float32), 2)) == 42.0
  with pytest.raises(TypeError, match="hashable"):
    c(x, np.ones(2))


def test_inputs_of_every_kind():
  f = pj.jit(lambda d, s, t: (d["a"] * s + jnp.asarray(t)).sum())
  for n in (3, 5, 9):
    d = {"a": np.ones(n, np.float32)}
    assert float(f(d, 2.0, 1)) == 3.0 * n
    assert float(f({"a": jnp.ones(n)}, jnp.float32(2.0), np.int32(1))) == 3.0 * n


def test_explicit_mode_errors():
  f = pj.jit(lambda x, y: x + y, polymorphic_shapes=["n"])
  with pytest.raises(pj.ShapeError, match="1 spec.*2 positional"):
    f(np.ones(3), np.ones(3))


def test_shared_symbols_until_sizes_differ():
  f = pj.jit(lambda x, y: x + y)
  for n in (3, 5, 9):
    np.testing.assert_array_equal(f(np.ones(n), np.ones(n)), np.full(n, 2.0))
  assert f.stats.compiles == 2  # exact first call, then one bucket serving 5 and 9
  with pytest.raises(TypeError, match="add got incompatible shapes"):
    f(np.ones(4), np.ones(6))  # exactly what jax.jit raises


def test_branching_on_a_size_gets_guarded_programs(caplog):
  def branchy(x):
    return x.sum() if x.shape[0] > 10 else x.max()

  f = pj.jit(branchy, buckets=pj.buckets.PowersOfTwo())
  with caplog.at_level(logging.WARNING, logger="polyjit"):
    got = [float(f(np.arange(n, dtype=np.float32))) for n in (5, 20, 8, 30, 12, 9, 3)]
  assert got == [4.0, 190.0, 7.0, 435.0, 66.0, 8.0, 2.0]
  assert not [r for r in caplog.records if r.name == "polyjit"]
  # exact 5; guard x_0 >= 11: buckets 32 and 16; guard x_0 <= 10: bucket 16
  # clipped to 10, which also serves 9 and 3.
  assert f.stats.compiles == 4 and f.stats.fallback_calls == 0


def test_equal_sizes_after_they_differed_run_exactly():
  def f(x, y):
    return x + y if x.shape[0] == y.shape[0] else x.sum() + y.sum()

  g, ref = pj.jit(f), jax.jit(f)
  for n, m in [(3, 3), (5, 5), (4, 6), (7, 7), (9, 2), (6, 6)]:
    assert_same(g(np.ones(n), np.ones(m)), ref(np.ones(n), np.ones(m)))


def test_a_function_that_cannot_be_masked_falls_back_with_one_log_message(caplog):
  from jax.extend.core import Primitive
  opaque_p = Primitive("opaque_for_test")
  opaque_p.def_abstract_eval(lambda x: x)
  opaque_p.def_impl(lambda x: x)
  jax.interpreters.mlir.register_lowering(
      opaque_p, jax.interpreters.mlir.lower_fun(lambda x: x, multiple_results=False))

  f = pj.jit(lambda x: opaque_p.bind(x).sum())
  with caplog.at_level(logging.WARNING, logger="polyjit"):
    got = [float(f(np.arange(n, dtype=np.float32))) for n in (5, 20, 8)]
  assert got == [10.0, 190.0, 28.0]
  messages = [r.getMessage() for r in caplog.records if r.name == "polyjit"]
  assert len(messages) == 1 and "opaque_for_test" in messages[0]
  assert f.stats.fallback_calls == 2


def test_concurrent_calls_compile_a_bucket_once():
  f = pj.jit(lambda x: (x * 2).sum(), polymorphic_shapes=["n"])
  barrier = threading.Barrier(6)
  results, errors = {}, []

  def worker(n):
    try:
      barrier.wait()
      results[n] = float(f(np.ones(n, np.float32)))
    except Exception as e:  # pragma: no cover - reported below
      errors.append(e)

  with pj.diagnostics.count_compiles() as compiles:
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(20, 26)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  assert not errors
  assert results == {n: 2.0 * n for n in range(20, 26)}
  assert len(compiles) == 1


def test_the_cache_is_bounded_least_recently_used():
  f = pj.jit(lambda x: x.sum(), polymorphic_shapes=["n"], cache_size=2,
             buckets=pj.buckets.PowersOfTwo(minimum=1))
  sizes = (3, 6, 12)  # buckets 4, 8, 16
  n_compiles, _ = count(f, *[(np.ones(n),) for n in sizes])
  assert n_compiles == 3 and len(f._cache) == 2 and f._cache.evictions == 1
  n_again, _ = count(f, (np.ones(12),), (np.ones(3),))
  assert n_again == 1  # bucket 16 was kept, bucket 4 had been dropped


def test_precompile_then_no_compiles():
  f = pj.jit(lambda x: jnp.cumsum(x)[-1], polymorphic_shapes=["n"],
             buckets=pj.buckets.PowersOfTwo())
  envs = f.precompile(jax.ShapeDtypeStruct((1,), jnp.float32), sizes={"n": range(100, 1001)},
                      progress=False)
  assert sorted(e["n"] for e in envs) == [128, 256, 512, 1024]
  n_compiles, results = count(f, *[(np.ones(n, np.float32),) for n in (100, 300, 999)])
  assert n_compiles == 0 and [float(r) for r in results] == [100.0, 300.0, 999.0]


def test_precompile_names_automatic_dimensions():
  f = pj.jit(lambda x: x.sum())
  f.precompile(np.ones(3, np.float32), sizes={"x_0": [10, 50]}, progress=False)
  n_compiles, results = count(f, (np.ones(9, np.float32),), (np.ones(33, np.float32),))
  assert n_compiles == 0 and [float(r) for r in results] == [9.0, 33.0]


def test_background_compile_borrows_a_larger_bucket():
  f = pj.jit(lambda x: x.sum(), polymorphic_shapes=["n"], background_compile=True,
             buckets=pj.buckets.PowersOfTwo())
  assert float(f(np.ones(900, np.float32))) == 900.0          # compiles 1024
  assert float(f(np.ones(100, np.float32))) == 100.0          # runs on 1024
  assert f.stats.bucket_hits[(("n", 1024),)] == 2
  for fut in [f._cache.peek(k) for k in f._cache.keys()]:
    fut.result()                                               # wait for bucket 128
  assert float(f(np.ones(100, np.float32))) == 100.0
  assert f.stats.bucket_hits[(("n", 128),)] == 1


def test_inside_other_transformations():
  f = pj.jit(lambda x, w: jnp.tanh(x * w).sum())
  x = np.linspace(-1, 2, 7).astype(np.float32)
  ref = lambda x, w: jnp.tanh(x * w).sum()
  np.testing.assert_allclose(jax.jit(f)(x, 0.5), ref(x, 0.5), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(f, 1)(x, 0.5), jax.grad(ref, 1)(x, 0.5), rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(f, (0, None))(np.stack([x, x * 2]), 0.5),
                             jax.vmap(ref, (0, None))(np.stack([x, x * 2]), 0.5), rtol=1e-6)


def test_value_and_grad_inside_is_exact():
  def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

  step = pj.jit(jax.value_and_grad(loss))
  reference = jax.jit(jax.value_and_grad(loss))   # (a compile per size, not per op and size)
  rng = np.random.default_rng(2)
  w = rng.standard_normal((3, 2)).astype(np.float32)
  for n in (4, 9, 13, 30):
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = rng.standard_normal((n, 2)).astype(np.float32)
    (v, g), (rv, rg) = step(w, x, y), reference(w, x, y)
    np.testing.assert_allclose(v, rv, rtol=1e-5)
    np.testing.assert_allclose(g, rg, rtol=1e-4, atol=1e-6)
  # exact, then the default's headroom buckets (a cheap step buys no tighter one)
  assert step.stats.compiles == default_compiles([4, 9, 13, 30])


def test_call_padded_chains_on_the_device():
  f = pj.jit(lambda x: jnp.cumsum(x), polymorphic_shapes=["n"])
  g = pj.jit(lambda x: x * 2, polymorphic_shapes=["n"])
  y = f.call_padded(np.arange(5, dtype=np.float32))
  assert isinstance(y, pj.Padded) and y.shape == (5,) and y.data.shape == (16,)
  z = g.call_padded(y)
  assert isinstance(z, pj.Padded)
  np.testing.assert_array_equal(z.unpad(), np.cumsum(np.arange(5.0)) * 2)
  np.testing.assert_array_equal(g(y), np.cumsum(np.arange(5.0)) * 2)


def test_donated_arguments_are_accepted():
  f = pj.jit(lambda x, y: x + y, donate_argnums=0, polymorphic_shapes=["n", "n"])
  np.testing.assert_array_equal(f(jnp.ones(16), jnp.ones(16)), np.full(16, 2.0))
  np.testing.assert_array_equal(f(jnp.ones(5), jnp.ones(5)), np.full(5, 2.0))


def test_a_second_process_compiles_nothing(tmp_path):
  script = textwrap.dedent(f"""
      import numpy as np, jax.numpy as jnp, polyjit as pj
      pj.enable_persistent_cache({str(tmp_path)!r})
      f = pj.jit(lambda x: jnp.sum(jnp.sin(x)))
      with pj.diagnostics.count_compiles() as compiles:
        for n in (5, 100, 300, 2000):
          f(np.ones(n, np.float32))
      print("COMPILES", len(compiles), "LOADS", len(compiles.cache_loads))
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300) for _ in range(2)]
  counts = []
  for r in runs:
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    counts.append((int(words[words.index("COMPILES") + 1]), int(words[words.index("LOADS") + 1])))
  assert counts[0] == (4, 0)  # the exact first call, then buckets 128, 512, 2048
  assert counts[1] == (0, 4)  # everything loaded from the persistent cache


def test_the_signature_lists_every_keyword_with_its_default():
  """`help(pj.jit)` and IDEs see jax.jit-style keywords, from their one definition."""
  import inspect
  from polyjit._jit.options import DEFAULTS, JitOptions
  params = inspect.signature(pj.jit).parameters
  assert list(params)[0] == "fun"
  assert {k: p.default for k, p in list(params.items())[1:]} == DEFAULTS
  assert set(DEFAULTS) == set(JitOptions.__annotations__)
  jax_params = set(inspect.signature(jax.jit).parameters)
  assert {"static_argnums", "static_argnames", "donate_argnums", "donate_argnames",
          "keep_unused", "inline", "in_shardings", "out_shardings"} <= jax_params & set(params)
  assert "static_argnums" not in inspect.signature(pj.filter_jit).parameters
