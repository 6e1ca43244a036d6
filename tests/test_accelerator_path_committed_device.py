"""The accelerator path (`POLYJIT_INLINE_CPU=0`, as on a GPU) on a machine of
several devices: device arguments are padded and unpadded on their device,
the default one or one they are committed to, and the program's size
arguments live there (`_jit/resident.py`).

Since pj.jit runs where jax.jit runs (`_sharding/placement.py`), a structure
committed to device 1 has a placement, and its plans took the host path of a
placed structure: every call read the argument into host memory, padded it
there and uploaded it, so a call at a shape whose pad and slice programs were
already bought raised under `jax.transfer_guard("disallow_explicit")`, where
jax.jit runs (and the size scalars were put on the default device, which the
program copied them from every call). With several devices every call takes
`Plan.run` (the hot path serves one-device machines only), which never put a
resized plan's size scalars on the device: they were uploaded at every call,
on the default device too.

Checked in a process with two CPU devices, for arrays on device 1 (committed)
and on device 0 (the default): after a warm-up, nothing is uploaded for device
arguments, the user's host argument is padded and uploaded to the device the
other argument is on (where jax.jit uploads it), and calls run under
`disallow_explicit`; outputs equal jax.jit's, on its device. And under a
guard, the user's host values are logged as uploads to the default device,
`jax.default_device`'s where set (they were logged against device 0).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import polyjit as pj
    from polyjit._jit import resident
    resident.RENT = 0.0   # (a shape's pad and slice programs bought at its second call)
    d1 = jax.devices()[int(sys.argv[1])]   # (device 0 is the default one)
    one = lambda x: jnp.cumsum(x) * 2
    two = lambda x, y: jnp.cumsum(x) * 2 + jnp.sum(y)
    f = pj.jit(one, buckets=pj.buckets.PowersOfTwo())
    g = pj.jit(two, buckets=pj.buckets.PowersOfTwo())
    rng = np.random.default_rng(0)
    sizes = (5, 6, 7)   # (one bucket: 8)
    xs = {n: jax.device_put(rng.normal(size=n).astype(np.float32), d1) for n in sizes}
    ys = {n: rng.normal(size=n).astype(np.float32) for n in sizes}   # the user's host arrays

    def same(got, want):
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
      assert got.sharding == want.sharding, (got.sharding, want.sharding)

    for _ in range(5):   # programs, plans, pad and slice programs, sizes on the device
      for n in sizes:
        f(xs[n]), g(xs[n], ys[n])
    for struct in f._structures.values():   # the size arguments live on x's device
      for plan in struct.plans.values():
        assert all(v.devices() == {d1} for v in plan.logical), (plan.logical, d1)
    for phase, call in (("ONE", lambda n: f(xs[n])), ("TWO", lambda n: g(xs[n], ys[n]))):
      sys.stderr.write(phase + "\\n"); sys.stderr.flush()
      with jax.transfer_guard("log_explicit"):   # every upload, explicit or not, is logged
        outs = {n: call(n) for n in sizes}
      sys.stderr.write("END\\n"); sys.stderr.flush()
      for n in sizes:
        same(outs[n], jax.jit(one)(xs[n]) if phase == "ONE" else jax.jit(two)(xs[n], ys[n]))
    for n in sizes:
      with jax.transfer_guard("disallow_explicit"):   # nothing moves through the host
        guarded = f(xs[n])
      same(guarded, jax.jit(one)(xs[n]))
    print("stayed on the device")
""")

_UPLOAD = re.compile(r"host-to-device transfer: aval=ShapedArray\((?P<dtype>[a-z0-9]+)\[(?P<dims>[0-9,]*)\]"
                     r".*?dst_sharding=SingleDeviceSharding\(device=CpuDevice\(id=(?P<device>[0-9]+)\)")


def _uploads(stderr: str, phase: str) -> list[re.Match[str]]:
  logged = stderr.split(phase + "\n", 1)[1].split("END\n", 1)[0]
  # (JAX also logs an upload without its type: the one it then logs with it)
  return [m for m in map(_UPLOAD.search, logged.splitlines()) if m is not None]


@pytest.mark.parametrize("device", ["1", "0"], ids=["committed_off_the_default", "default"])
def test_device_arguments_are_padded_on_their_device(device: str) -> None:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             POLYJIT_INLINE_CPU="0")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  done = subprocess.run([sys.executable, "-c", SCRIPT, device], env=env, capture_output=True,
                        text=True, timeout=120)
  assert "stayed on the device" in done.stdout, done.stderr[-3000:]
  # device arguments only: nothing uploaded (the sizes are on the device already)
  assert [m[0] for m in _uploads(done.stderr, "ONE")] == []
  # the user's host arrays padded and uploaded to the device x is on, where
  # jax.jit uploads them (the program would copy them there every call)
  two = [m for m in _uploads(done.stderr, "TWO") if m["dims"] == "16"]
  assert len(two) == 3 and all(m["device"] == device for m in two), [m[0] for m in two]


DEFAULT_DEVICE_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import polyjit as pj
    d1 = jax.devices()[1]
    f = pj.jit(lambda x: jnp.cumsum(x) * 2)
    x = np.arange(5, dtype=np.float32)   # the user's host array
    with jax.default_device(d1):
      for _ in range(3):
        f(x)
      sys.stderr.write("ONE\\n"); sys.stderr.flush()
      with jax.transfer_guard("log"):
        out = f(x)
      sys.stderr.write("END\\n"); sys.stderr.flush()
    assert out.devices() == {d1}, out.devices()
    np.testing.assert_allclose(np.asarray(out), np.cumsum(x) * 2)
    print("logged")
""")


def test_host_values_are_logged_against_the_default_device() -> None:
  """Under a transfer guard, the user's host values are put to the guard as
  the implicit uploads jax.jit makes of them, to the device it makes them to:
  `jax.default_device`'s (they went to device 0, whatever the default)."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             POLYJIT_INLINE_CPU="0")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  done = subprocess.run([sys.executable, "-c", DEFAULT_DEVICE_SCRIPT], env=env,
                        capture_output=True, text=True, timeout=120)
  assert "logged" in done.stdout, done.stderr[-3000:]
  user = [m for m in _uploads(done.stderr, "ONE") if m["dims"] == "5"]
  assert user and all(m["device"] == "1" for m in user), [m[0] for m in user]
