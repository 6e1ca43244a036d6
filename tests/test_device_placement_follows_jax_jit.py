"""`pj.jit` runs where `jax.jit` runs: an argument committed to a device keeps
the computation (and its outputs) on that device; uncommitted arguments (NumPy
arrays, arrays made without `jax.device_put(x, device)`) go to the default
device, `jax.default_device(...)`'s where one is chosen; arguments committed to
different devices fail as `jax.jit` fails them. Checked in a process with two
CPU devices (`--xla_force_host_platform_device_count=2`), with hot shapes
buying `jax.jit`'s own program at once and never (`_jit/hot_shapes.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import polyjit as pj
    from polyjit._jit import hot_shapes
    hot_shapes.RENT = float(sys.argv[1])
    fun = lambda x: jnp.cumsum(x) * 2
    f = pj.jit(fun, buckets=pj.buckets.PowersOfTwo())
    d0, d1 = jax.devices()[:2]

    def same(x):
      got, want = f(x), jax.jit(fun)(x)
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
      assert got.sharding == want.sharding, (x, got.sharding, want.sharding)

    for n in (5, 6, 6, 6):
      x = np.arange(n, dtype=np.float32)
      for device in (None, d0, d1):
        same(jax.device_put(x, device))
      same(x)
      with jax.default_device(d1):
        uncommitted = jnp.asarray(x)     # made on device 1, not committed there
        same(x)
        same(uncommitted)
        same(jax.device_put(x, d0))      # committed to the device that is not the default
      same(uncommitted)                  # (jax.jit runs it on device 0)

    add = lambda a, b: a + b
    a, b = jax.device_put(np.ones(3, np.float32), d0), jax.device_put(np.ones(3, np.float32), d1)
    for g in (jax.jit(add), pj.jit(add)):
      try:
        g(a, b)
      except ValueError as e:
        assert "incompatible devices" in str(e), e
      else:
        raise AssertionError("arguments on two devices ran")
    got, want = pj.jit(add)(jnp.ones(3), b), jax.jit(add)(jnp.ones(3), b)
    assert got.sharding == want.sharding, (got.sharding, want.sharding)
    print("placed as jax.jit")
""")


@pytest.mark.parametrize("rent", ["0.0", "inf"], ids=["hot_shapes_at_once", "no_hot_shapes"])
def test_arguments_run_on_the_device_jax_jit_runs_them_on(rent: str) -> None:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  done = subprocess.run([sys.executable, "-c", SCRIPT, rent], env=env, capture_output=True,
                        text=True, timeout=120)
  assert "placed as jax.jit" in done.stdout, done.stderr[-2000:]


AOT_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    import polyjit as pj
    d0, d1 = jax.devices()[:2]
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    fun = lambda x: jnp.cumsum(x) * 2
    for options in ({}, {"polymorphic_shapes": ["(n,)"]}):
      for device in (d1, d0, None):
        x = jax.device_put(np.arange(5, dtype=np.float32), device)
        want = jax.jit(fun).lower(x).compile()(x)
        f = pj.jit(fun, **options)
        compiled = f.lower(x).compile()
        got = compiled(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.sharding == want.sharding, (device, got.sharding, want.sharding)
        before = len(compiles)
        again = f(x)   # the call runs the program compiled ahead of time
        assert len(compiles) == before, (device, options, compiles[before:])
        assert again.sharding == want.sharding, (device, again.sharding, want.sharding)
    print("compiled where jax.jit compiles")
""")


def test_ahead_of_time_stages_of_a_committed_argument() -> None:
  """`pj.jit(f).lower(x).compile()(x)` for `x` committed to a device: its
  program is lowered for that device (the `ShapeError` "serves arguments of
  shapes [(5,)] ... called with [(5,)]" before: the stages dropped the
  placement that the call's structure holds), as `jax.jit`'s stages are, and a
  call with `x` then reuses it."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  done = subprocess.run([sys.executable, "-c", AOT_SCRIPT], env=env, capture_output=True,
                        text=True, timeout=120)
  assert "compiled where jax.jit compiles" in done.stdout, done.stderr[-2000:]
