"""A program `pj.jit` compiles in a thread sees the trace context of the call that asked for it.

`pj.jit` keys its programs by `jc.trace_context()` (what `jax.jit` keys its
traces on), and lowers some of them in a thread pool (`precompile`,
`background_compile=True`, a cost-aware bucket bought while calls go on).
In that thread the trace context must be the submitter's, or a program is
lowered under another context than its key's. JAX keeps some contexts
outside its registered options (`jax.set_mesh`'s abstract mesh and devices,
`with mesh:`): those were not carried over, and `precompile` under
`jax.set_mesh` of arguments sharded on two devices raised JAX's "Please
enter your `jit` into a mesh context" where the same call on the calling
thread (and `jax.jit`) ran.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax

from polyjit import _jax as jc
from polyjit._caching.executables import ExecutableCache

ROOT = pathlib.Path(__file__).parent.parent


def test_the_compile_thread_sees_the_callers_trace_context():
  mesh = jax.make_mesh((1,), ("x",))
  cache = ExecutableCache()
  with jax.set_mesh(mesh), jax.numpy_rank_promotion("raise"):
    here = jc.trace_context()
    there = cache.submit("key", jc.trace_context).result()
  assert there == here
  assert cache.submit("other", jc.trace_context).result() == jc.trace_context()


PRECOMPILE_ON_A_MESH = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import polyjit as pj

def f(x):
  return x * 2 + jnp.sum(x)

mesh = jax.make_mesh((2,), ("x",))
with jax.set_mesh(mesh):
  x = jax.device_put(np.linspace(0.5, 9.5, 100).astype(np.float32), NamedSharding(mesh, P("x")))
  g = pj.jit(f, polymorphic_shapes=["n"], buckets=[128, 512])
  assert g.precompile(x, sizes={"n": [100]}, progress=False) == [{"n": 128}]
  got = g(x)
  want = jax.jit(f)(x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
print("ok")
"""


def test_precompile_under_set_mesh_on_two_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu", POLYJIT_NO_CACHE="1",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
  r = subprocess.run([sys.executable, "-c", PRECOMPILE_ON_A_MESH], capture_output=True,
                     text=True, env=env, timeout=240)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
