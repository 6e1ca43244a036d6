"""polyjit on many devices and many processes (`polyjit/_sharding/placement.py`).

The 8-device checks run in one subprocess (`sharding_worker.py`, 8 host
devices) so that the rest of the suite keeps one device; the multi-process
check runs two real processes (`multiprocess_worker.py`) joined by
`jax.distributed` on 127.0.0.1 with gloo CPU collectives. Each subprocess is
bounded by a timeout and killed when it expires.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import polyjit as pj

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent
TIMEOUT_S = 240


def _env(devices: int) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
             # a loaded CI machine may starve a device thread past XLA's 40 s
             # limit for a collective, which aborts the process; our own
             # timeout (TIMEOUT_S) bounds the run instead
             f"--xla_cpu_collective_call_terminate_timeout_seconds={TIMEOUT_S}")
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
  return env


def _last_json(stdout: str) -> dict:
  return json.loads(stdout.strip().splitlines()[-1])


def _run_eight_device_worker() -> dict:
  try:
    r = subprocess.run([sys.executable, str(HERE / "sharding_worker.py")], capture_output=True,
                       text=True, env=_env(8), timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:  # subprocess.run kills the child first
    pytest.fail(f"the 8-device worker ran past {TIMEOUT_S} s")
  assert r.returncode == 0, r.stderr[-4000:]
  return _last_json(r.stdout)


@pytest.mark.heavy
def test_on_eight_devices():
  """One subprocess with 8 host devices runs the three scenarios below (its
  start-up and compiles are the cost, so it runs once, not once per check)."""
  results = _run_eight_device_worker()
  _check_sharded_dynamic_axis_pads_in_multiples_of_the_shards(results["sharded_dynamic_axis"])
  _check_data_parallel_training_step_matches_jax_jit(results["training_step"])
  _check_vmap_over_a_sharded_ragged_batch(results["ragged_vmap"])


def _check_sharded_dynamic_axis_pads_in_multiples_of_the_shards(r: dict) -> None:
  assert all(n % 8 for n in r["lengths"])                  # no length splits evenly
  assert max(r["errors"]) < 1e-5 and max(r["per_element_errors"]) < 1e-5
  assert max(r["moved_errors"]) < 1e-5                      # already-sharded x, re-laid out
  assert r["chained_error"] < 1e-5                          # call_padded into pj.jit
  padded = r["padded"][1:]                                  # the first call runs exactly
  assert all(p % 8 == 0 and p >= n for p, n in zip(padded, r["lengths"][1:]))
  assert r["devices"] == [8] * len(r["lengths"])            # x stays split over 8 devices
  # two functions, one compile per distinct program each: fewer than per length
  assert r["compiles"] == 2 * len(set(r["padded"])) < 2 * len(r["lengths"])


def _check_data_parallel_training_step_matches_jax_jit(r: dict) -> None:
  assert max(r["errors"]) < 1e-5                            # loss, predictions, gradients
  assert r["devices"] == [8] * 2 * len(r["lengths"])        # per-example/token outputs spread
  assert all(r["same_sharding"])                            # as jax.jit places them
  assert r["jax_compiles"] == len(set(r["lengths"]))
  assert r["pj_compiles"] <= r["jax_compiles"] // 2          # buckets, not lengths


def _check_vmap_over_a_sharded_ragged_batch(r: dict) -> None:
  assert max(r["errors"]) < 1e-5                            # loss and gradients
  assert r["data_devices"] == [8] * 3 and r["out_devices"] == [8] * 3
  assert all(shape[0] % 8 == 0 for shape in r["out_shapes"])  # 13 examples: 16 rows
  assert r["compiles"] <= 2 * 3


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_agree_on_buckets_and_gradients():
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, str(HERE / "multiprocess_worker.py"), str(i),
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(2)) for i in range(2)]
  outs = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=TIMEOUT_S)
      assert p.returncode == 0, stderr[-4000:]
      outs.append(_last_json(stdout))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  assert [o["devices"] for o in outs] == [4, 4] and [o["local_devices"] for o in outs] == [2, 2]
  assert outs[0]["local_max"] < outs[1]["local_max"]         # different local lengths
  assert outs[0]["padded"] == outs[1]["padded"] >= outs[1]["local_max"]
  assert outs[0]["batch"] == 8
  for o in outs:
    for key in ("loss", "pj_loss"):
      np.testing.assert_allclose(o[key], o["ref_loss"], rtol=1e-5)
    for key in ("grads", "pj_grads"):
      for got, want in zip(o[key], o["ref_grads"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_one_process_from_process_local_is_from_list():
  examples = [np.arange(n * 2, dtype=np.float32).reshape(n, 2) for n in (3, 7, 5, 1)]
  sharding = NamedSharding(jax.make_mesh((1,), ("data",)), PartitionSpec("data"))
  local = pj.Ragged.from_process_local(examples, sharding)
  ref = pj.Ragged.from_list(examples)
  assert local.padded_lengths == ref.padded_lengths
  for a, b in zip(local.to_list(), ref.to_list()):
    np.testing.assert_array_equal(a, b)



def test_vmap_spmd_axis_name_reaches_the_masked_call():
  """`jax.vmap(pj.mask(f), spmd_axis_name=...)` passes the spmd axis name to
  the vmap the masked call's batching rule runs (it was dropped), and gives
  what `jax.vmap(f, spmd_axis_name=...)` gives on the unpadded examples."""
  def f(x, w):
    return jnp.sum(jnp.sin(x) * w), jnp.cumsum(x)[-1]

  sizes = [3, 5, 2]
  xs = np.full((len(sizes), 8), np.nan, np.float32)   # NaN in the padding
  for i, n in enumerate(sizes):
    xs[i, :n] = np.arange(n, dtype=np.float32) + 1.5
  ns = np.array(sizes, np.int32)
  w = np.float32(0.5)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
  masked = pj.mask(f, ["n", None])

  def batched(xs, ns):
    return jax.vmap(lambda x, n: masked([x, w], {"n": n}), spmd_axis_name="x")(xs, ns)

  # (not inside shard_map: there JAX 0.10.2's batching rule of select_n with an
  # unbatched numpy constant operand fails its varying-axis check under an spmd
  # axis name, for plain JAX functions too, and masked code has such constants)
  with jax.set_mesh(mesh):
    jaxpr = jax.make_jaxpr(batched)(xs, ns)
    got = jax.jit(batched)(xs, ns)
    for i, n in enumerate(sizes):   # plain JAX on the unpadded example (a batch of one)
      want = jax.vmap(lambda x: f(x, w), spmd_axis_name="x")(xs[i:i + 1, :n])
      for g, r in zip(got, want):
        np.testing.assert_allclose(g[i], r[0], rtol=1e-6)
  calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "polyjit_masked_call"]
  assert calls and all(getattr(e.params["node"], "spmd_axis_name", None) == ("x",)
                       for e in calls)
