"""pj.jit's host buffers and size scalars on the call path.

A padded argument is a fresh host buffer whose padding is left as it comes
(masking assumes nothing about it), aligned from `ALIGN_FROM` bytes on so that
XLA:CPU uses it in place instead of copying it on every call; booleans are
zeroed (a PRED byte must be 0 or 1). A resized plan (a never-seen size in a
compiled bucket) passes its sizes as host scalars for its first calls, then
puts them on the device once. Behaviour is asserted, never timing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._jit import plans
from polyjit._jit.args import call_signature
from polyjit._masking.padding import ALIGN, ALIGN_FROM, host_buffer


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


MU, LS = np.float32(0.1), np.float32(0.3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16, np.uint32,
                                   np.complex128, np.float16, np.bool_])
@pytest.mark.parametrize("shape", [(1,), (7,), (ALIGN_FROM // 4 + 3,), (3, 5), (300, 129)])
def test_host_buffers_have_the_shape_and_dtype_asked_and_large_ones_are_aligned(dtype, shape):
  for _ in range(5):  # (malloc's alignment varies between blocks)
    buf = host_buffer(shape, np.dtype(dtype))
    assert buf.shape == shape and buf.dtype == dtype
    assert buf.flags.c_contiguous and buf.flags.writeable
    if dtype == np.bool_:
      assert not buf.any()  # a PRED byte other than 0 or 1 is not valid
    elif buf.nbytes >= ALIGN_FROM:
      assert buf.ctypes.data % ALIGN == 0


def test_a_large_bucket_gets_aligned_buffers_and_exact_results():
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[2 * ALIGN_FROM // 4])
  ref = jax.jit(loglik)
  data = np.random.default_rng(0).standard_normal(2 * ALIGN_FROM // 4).astype(np.float32)
  f(data[:1000], MU, LS)
  addresses = []
  (struct,) = f._structures.values()
  (template,) = struct.templates.values()
  program = template.plan.program

  def spy(*args):
    addresses.append(args[0].ctypes.data)
    return program(*args)
  template.plan.program = spy  # (the resized plans made from now on run through it)
  sizes = [1001 + 97 * i for i in range(12)]
  for n in sizes:
    np.testing.assert_allclose(f(data[:n], MU, LS), ref(data[:n], MU, LS), rtol=1e-5)
  assert len(addresses) == len(sizes)
  assert all(a % ALIGN == 0 for a in addresses), [a % ALIGN for a in addresses]


@pytest.mark.parametrize("mode", ["explicit", "auto"])
def test_boolean_and_integer_arguments_pad_without_changing_results(mode):
  def fun(x, keep, k):
    picked = jnp.where(keep, x * k, 0)
    return jnp.sum(picked), jnp.all(keep), jnp.any(keep), jnp.max(k), picked
  f = pj.jit(fun, polymorphic_shapes=["n", "n", "n"] if mode == "explicit" else None)
  ref = jax.jit(fun)
  rng = np.random.default_rng(1)
  for n in [5, 9, 40, 41, 77, 200, 333, 7, 1000]:
    x = rng.standard_normal(n).astype(np.float32)
    keep = rng.random(n) < 0.9
    k = rng.integers(-5, 5, n).astype(np.int32)
    got, want = f(x, keep, k), ref(x, keep, k)
    for g, w in zip(got, want, strict=True):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5)
    ones = np.ones(n, bool)  # all(): the padding must not make it False
    assert bool(f(x, ones, k)[1]) and not bool(f(x, ~ones, k)[2])


def test_a_resized_plan_puts_its_sizes_on_the_device_after_a_few_calls():
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[512])
  ref = jax.jit(loglik)
  data = np.random.default_rng(2).standard_normal(512).astype(np.float32)
  f(data[:300], MU, LS)
  built = plans.plans_built
  plan = None
  for i in range(plans.HOST_CALLS + 2):
    got = f(data[:123], MU, LS)
    np.testing.assert_allclose(got, ref(data[:123], MU, LS), rtol=1e-5)
    plan = f._hot[call_signature((data[:123], MU, LS))]
    on_device = all(isinstance(v, jax.Array) for v in plan.logical)
    assert on_device == (i >= plans.HOST_CALLS), (i, [type(v) for v in plan.logical])
  assert plans.plans_built == built  # (a resized plan, not a new one)
  assert [int(v) for v in plan.logical] == [123]
