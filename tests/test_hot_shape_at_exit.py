"""A `pj.jit` call from an `atexit` handler works as `jax.jit`'s does, even
where its shapes would buy their own program (`polyjit/_jit/hot_shapes.py`
compiles it in a background thread, and no thread can start while the
interpreter shuts down): the call is served from its bucket."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit
    import jax, jax.numpy as jnp, numpy as np
    import polyjit as pj
    from polyjit._jit import hot_shapes
    hot_shapes.RENT = 0.0  # (buys at the first hot call)
    fun = lambda x: jnp.cumsum(x) * 2
    f = pj.jit(fun, buckets=pj.buckets.PowersOfTwo())
    x5, x6 = (jax.device_put(np.arange(n, dtype=np.float32)) for n in (5, 6))
    f(x5)

    @atexit.register
    def at_exit():
      for _ in range(3):  # the bucket's first call, then hot calls
        np.testing.assert_array_equal(np.asarray(f(x6)), np.asarray(jax.jit(fun)(x6)))
      print("served at exit")
""")


@pytest.mark.parametrize("inline_cpu", ["1", "0"])
def test_call_from_atexit_handler(inline_cpu: str) -> None:
  env = dict(os.environ, POLYJIT_INLINE_CPU=inline_cpu)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                        text=True, timeout=120)
  assert "served at exit" in done.stdout, done.stderr[-2000:]
  assert "Error" not in done.stderr, done.stderr[-2000:]
