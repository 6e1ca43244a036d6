"""A size in user code answers as jax.jit's Python int does, or is refused.

Under jax.jit `len(x)`, `x.shape[0]` and their arithmetic are Python ints;
while polyjit traces they are symbolic. Two ways that could give a
different answer, each checked against jax.jit on the unpadded input:

* a branch on the type: `if isinstance(n, int): A else: B` (also
  `numbers.Integral`, `functools.singledispatch`) must take A, as under
  jax.jit (`polyjit/_jax/size_class.py`), and nowhere else (JAX's own code,
  another thread, after the trace) may a size claim to be an int;
* a product of sizes used as a value, computed in int32: where it could pass
  2**31 at the padded sizes it is refused (`dim_as_value`), and pj.jit then
  compiles that size exactly, as jax.jit, which raises OverflowError where
  the Python int does not fit int32, instead of returning a wrapped value.
"""

from __future__ import annotations

import functools
import numbers
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import polyjit as pj
from harness import Case, make, normal, table_test


def by_type(x):
  n = len(x)
  m = x.shape[0] // 2 + 1
  if isinstance(n, int) and isinstance(m, numbers.Integral) and n.__class__ is int:
    return x.sum() / n + m
  return x.sum()


@functools.singledispatch
def _scale(n):
  return 0.0


@_scale.register
def _(n: int):
  return 2.0


def by_dispatch(x):
  return x * _scale(x.shape[0])


CASES = [
    Case("isinstance_of_len_and_shape", by_type, ["n"], make(normal("n"))),
    Case("singledispatch_on_a_size", by_dispatch, ["n"], make(normal("n"))),
]

CASES_BY_NAME, test_rule = table_test(CASES)


def test_pj_jit_takes_jax_jits_branch_on_the_type_of_a_size():
  f = pj.jit(by_type)
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.FallbackWarning)
    for n in (3, 8, 13, 21, 30):
      x = np.linspace(-1.0, 2.0, n, dtype=np.float32)
      np.testing.assert_allclose(f(x), jax.jit(by_type)(x), rtol=1e-6)
  r = pj.Ragged.from_list([np.arange(k, dtype=np.float32) for k in (2, 5)])
  want = [by_type(np.arange(k, dtype=np.float32)) for k in (2, 5)]
  np.testing.assert_allclose(np.asarray(pj.vmap(by_type)(r)), want, rtol=1e-6)


def test_a_size_is_its_own_class_to_jax_other_threads_and_after_the_trace():
  n, = export.symbolic_shape("n")
  seen = {}
  inside, release = threading.Event(), threading.Event()

  def traced(x):
    inside.set()
    release.wait(30)
    seen["traced"] = isinstance(x.shape[0], int)
    return x.sum()

  def other():
    inside.wait(30)
    seen["other thread"] = isinstance(n, int)
    release.set()

  t = threading.Thread(target=other)
  t.start()
  pj.mask(traced, ["n"])([np.ones(8, np.float32)], {"n": 3})
  t.join(30)
  assert seen == {"traced": True, "other thread": False}
  assert not isinstance(n, int) and n.__class__ is type(n)
  assert not isinstance(n, numbers.Integral)


def sizes_product(x, y):
  return jnp.arange(3) + len(x) * len(y), x.sum() / (len(x) * len(y))


def test_a_product_of_sizes_past_int32_is_not_wrapped():
  f = pj.jit(sizes_product, buckets=pj.buckets.PowersOfTwo())
  overflowed = []
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.FallbackWarning)
    for n in (300, 3000, 40_000, 50_000):
      x, y = np.ones(n, np.float32), np.ones(n, np.float32)
      try:
        want = jax.jit(sizes_product)(x, y)
      except OverflowError:   # the Python int does not fit int32
        with pytest.raises(OverflowError):
          f(x, y)
        overflowed.append(n)
        continue
      got = f(x, y)
      np.testing.assert_array_equal(got[0], want[0])
      np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
  assert overflowed == [50_000]


def test_pj_mask_refuses_a_product_of_sizes_that_can_pass_int32():
  masked = pj.mask(sizes_product, ["n", "m"])
  x = np.ones(50_000, np.float32)
  with pytest.raises(pj.MaskingError, match=r"test_size_seen_as_python_int.py.*\n.*as a float"):
    masked([x, x], {"n": 3, "m": 4})
  small = np.ones(8, np.float32)
  out = masked([small, small], {"n": 3, "m": 4})
  np.testing.assert_array_equal(out[0], [12, 13, 14])


def ceil_of_a_fraction(x):
  # under jax.jit a Python float: 50 * 0.3 = 15.000000000000002, 15 in float32
  k = jnp.ceil(len(x) * 0.3)
  return (k, jnp.where(jnp.arange(x.shape[0]) < k, x, 0.0), x + len(x) / 3,
          len(x) / np.float32(3))


def float32_constants(x):
  n = len(x)
  return (x * (n * 2.0) - (0.5 - n), 1.0 / n + x, x * (n / 4), n * jnp.float32(0.3),
          jnp.ceil(n * jnp.float32(0.3)), n * jnp.float32(1 / 3))


def test_a_size_times_a_float_that_is_not_a_float32_is_computed_as_jax_jit_does():
  f = pj.jit(ceil_of_a_fraction, buckets=pj.buckets.PowersOfTwo())
  with pytest.warns(pj.FallbackWarning, match=r"jnp.float32\(0.3\)"):
    for n in (43, 50, 90, 100):   # (the first call runs jax.jit's own program)
      x = np.ones(n, np.float32)
      for got, want in zip(f(x), jax.jit(ceil_of_a_fraction)(x), strict=True):
        np.testing.assert_array_equal(got, want)
  with pytest.raises(pj.SizeValueError, match=r"\* 0.3.*test_size_seen_as_python_int.py"):
    pj.mask(ceil_of_a_fraction, ["n"])([np.ones(64, np.float32)], {"n": 50})


def test_a_size_with_float32_constants_runs_in_buckets_as_jax_jit_computes_it():
  f = pj.jit(float32_constants, buckets=pj.buckets.PowersOfTwo())
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.FallbackWarning)
    for n in (50, 43, 90, 100, 71, 113):
      x = np.ones(n, np.float32)
      for got, want in zip(f(x), jax.jit(float32_constants)(x), strict=True):
        np.testing.assert_array_equal(got, want)
  assert pj.stats(f).compiles <= 3
