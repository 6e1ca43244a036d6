"""`precompile` compiles the programs that the calls with its examples run.

A precompiled program serves a call only where the call's structure is the
examples' (`StructureKey`: dtypes and weak types, shardings on a mesh, the
trace context). `precompile` made its examples abstract with
`jax.ShapeDtypeStruct(shape, dtype)`, dropping an array's sharding and weak
type: on a mesh, arguments sharded on two devices precompiled a program for
unsharded ones, and a weakly typed argument one for a strongly typed one;
the call then compiled its own (silently, the precompile wasted). And the
compile threads lacked `jax.set_mesh`'s context, so on a mesh `precompile`
raised JAX's "Please enter your `jit` into a mesh context". Compiles are
counted with `jax.monitoring` (`pj.diagnostics.count_compiles`); results are
compared with `jax.jit`'s.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj

ROOT = pathlib.Path(__file__).parent.parent


def scaled(x, s):
  return jnp.cumsum(x) * s + jnp.sum(x)


def test_precompile_keeps_a_weak_type():
  x = np.linspace(0.5, 9.5, 100).astype(np.float32)
  s = jnp.asarray(2.0)   # weakly typed, as jax.jit sees it
  assert jax.typeof(s).weak_type
  f = pj.jit(scaled, polymorphic_shapes=["n", None], buckets=[128, 512])
  assert f.precompile(x, s, sizes={"n": [100]}, progress=False) == [{"n": 128}]
  with pj.diagnostics.count_compiles() as events:
    got = f(x, s)
  assert len(events) == 0, events   # the precompiled program serves the call
  want = jax.jit(scaled)(x, s)
  assert got.dtype == want.dtype and jax.typeof(got).weak_type == jax.typeof(want).weak_type
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


ON_A_MESH = """
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
  with pj.diagnostics.count_compiles() as events:
    got = g(x)
  assert len(events) == 0, events   # the precompiled program serves the call
  want = jax.jit(f)(x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
print("ok")
"""


def test_precompile_on_a_mesh_of_two_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu", POLYJIT_NO_CACHE="1",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
  r = subprocess.run([sys.executable, "-c", ON_A_MESH], capture_output=True,
                     text=True, env=env, timeout=240)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
