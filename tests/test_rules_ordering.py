"""Ordering: sort, argsort, top_k and what is built on them.

Every row runs eagerly, under jit, under vmap over different logical sizes and
under grad (see harness.py), with NaN/inf/huge values in the padding. The
data stress what padding could get wrong: ties (stability), NaN and inf in the
valid region (padding must still sort after them), the extreme integers that
the rules fill the padding with, and descending orders.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import Case, bools, check, ints, make, normal, table_test

FORWARD = ("eager", "jit", "vmap")   # integer-only rows: no gradient to check
SIZES = ({"n": 1}, {"n": 5})
AT_LEAST_2 = ({"n": 2}, {"n": 5})
NM = {"n": 8, "m": 6}
SIZES_NM = ({"n": 1, "m": 6}, {"n": 5, "m": 3})


def choice(values, *shape, dtype):
  """An argument piece: entries drawn from `values`."""
  values = np.asarray(values, dtype)
  index = ints(*shape, low=0, high=len(values))
  return lambda rng, s: values[index(rng, s)]


def specials(*shape):
  """Floats with many ties, signed zeros, NaN and +-inf in the valid region."""
  return choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, 0.5, -3.0],
                *shape, dtype=np.float32)


def extreme_ints(*shape, dtype=np.int32):
  """Integers with ties at the values the rules fill the padding with."""
  info = np.iinfo(dtype)
  return choice([info.min, info.max, info.min, info.max, 0, 1, 2], *shape, dtype=dtype)


def complexes(*shape):
  """Complex numbers whose parts are `specials` (NaN in either part)."""
  parts = specials(*shape)

  def gen(rng, s):
    re, im = parts(rng, s), parts(rng, s)
    z = np.empty(re.shape, np.complex64)
    z.real, z.imag = re, im
    return z
  return gen


def sorted_table(rng, s):
  return np.array([-2.0, -0.5, 0.0, 0.0, 1.0, np.inf, np.nan], np.float32)


def vec(name, fun, piece=None, **kw):
  """A case of a function of one vector of length n (floats by default)."""
  return Case(name, fun, ["n"], make(piece or normal("n")), **kw)


def composite(fun):
  """A function built from many ops, jitted: the reference (`fun` run on the
  unpadded data) then compiles once per size instead of op by op, and the
  masked trace holds one `jit` equation, which masks its body."""
  return jax.jit(fun)


@composite
def quantiles(x):
  qs = jnp.array([0.0, 0.3, 0.5, 0.95, 1.0], x.dtype)
  return (jnp.quantile(x, qs), jnp.quantile(x, qs, method="nearest"),
          jnp.percentile(x, 100 * qs, method="higher"),
          jnp.quantile(x, qs, method="inverted_cdf", weights=x * x))


@composite
def unique_all(x):
  return jnp.unique(x, size=6, return_index=True, return_inverse=True, return_counts=True)


@composite
def searchsorted_all(a, v):
  return (jnp.searchsorted(a, v), jnp.searchsorted(a, v, side="right", method="compare_all"),
          jnp.searchsorted(a, v, side="right", method="scan_unrolled"))


def weighted_sort(x):
  """A sort whose gradient is not a plain permutation of ones."""
  return jnp.sort(x) * jnp.arange(1, x.shape[0] + 1)


CASES = [
    # sort / argsort
    vec("sort", jnp.sort, specials("n"), sizes=({"n": 1}, {"n": 3}, {"n": 6})),
    vec("argsort", jnp.argsort, specials("n")),
    vec("sort_descending", lambda x: (jnp.sort(x, descending=True),
                                      jnp.argsort(x, descending=True)), specials("n")),
    vec("argsort_unstable", lambda x: jnp.argsort(x, stable=False)),  # no ties: order is defined
    vec("sort_weighted_grad", weighted_sort, specials("n")),
    vec("grad_of_sort_inside", jax.grad(lambda x: weighted_sort(x).sum()), specials("n")),
    vec("sort_int_extremes", lambda x: (jnp.sort(x), jnp.argsort(x, descending=True)),
        extreme_ints("n"), modes=FORWARD),
    Case("unsigned_bool", lambda u, b: (jnp.sort(u), jnp.argsort(u), lax.top_k(u, 1),
                                        jnp.sort(b), jnp.argsort(b), lax.top_k(b, 1)),
         ["n", "n"], make(extreme_ints("n", dtype=np.uint8), bools("n")), sizes=SIZES,
         modes=FORWARD),
    vec("sort_complex", lambda z: (jnp.sort(z), jnp.argsort(z)), complexes("n"), sizes=SIZES),
    Case("lax_sort_num_keys", lambda k, f, v: lax.sort((k, f, v), num_keys=2),
         ["n", "n", "n"], make(choice([0, 1, 2], "n", dtype=np.int32), specials("n"),
                               normal("n")), sizes=({"n": 3}, {"n": 6})),
    Case("sort_key_val", lambda k, v: lax.sort_key_val(k, v, is_stable=True), ["n", "n"],
         make(specials("n"), normal("n")), sizes=SIZES),
    Case("lexsort", lambda a, b: jnp.lexsort((a, b)), ["n", "n"],
         make(choice([0, 1], "n", dtype=np.int32), extreme_ints("n")), sizes=SIZES,
         modes=FORWARD),
    Case("sort_2d_dynamic_axis", lambda x: (jnp.sort(x, axis=0), jnp.argsort(x, axis=0)),
         ["(n, _)"], make(specials("n", 3)), sizes=SIZES),
    Case("sort_2d_fixed_axis", lambda x: jnp.sort(x, axis=1), ["(n, _)"],
         make(specials("n", 3)), sizes=SIZES),
    Case("sort_2d_both_dynamic", lambda x: (jnp.sort(x, axis=1), jnp.argsort(x, axis=0)),
         ["(n, m)"], make(specials("n", "m")), sizes=SIZES_NM, padded=NM),
    Case("sort_flattened", lambda x: jnp.sort(x, axis=None), ["(n, _)"],
         make(specials("n", 2)), sizes=SIZES),
    # top_k and partition
    vec("top_k", lambda x: lax.top_k(x, 2), specials("n"), sizes=AT_LEAST_2,
        constraints=("n >= 2",)),
    vec("top_k_int_extremes", lambda x: lax.top_k(x, 2), extreme_ints("n"), sizes=AT_LEAST_2,
        constraints=("n >= 2",), modes=FORWARD),
    vec("top_k_k_is_n", lambda x: lax.top_k(-x, x.shape[0]), specials("n")),
    Case("top_k_axis0", lambda x: lax.top_k(x, 2, axis=0), ["(n, _)"],
         make(specials("n", 3)), sizes=AT_LEAST_2, constraints=("n >= 2",)),
    vec("partition", composite(lambda x: (jnp.partition(x, 1), jnp.argpartition(x, 1))),
        specials("n"), sizes=AT_LEAST_2, constraints=("n >= 2",)),
    # built on sort
    vec("median", composite(lambda x: (jnp.median(x), jnp.nanmedian(x))), specials("n")),
    Case("median_2d", composite(lambda x: (jnp.median(x, axis=0), jnp.median(x, axis=1))),
         ["(n, _)"], make(normal("n", 3)), sizes=SIZES),
    vec("quantile_methods", quantiles, sizes=({"n": 1}, {"n": 6})),
    vec("nanquantile", composite(lambda x: (jnp.nanquantile(x, jnp.array([0.2, 0.7])),
                                            jnp.nanpercentile(x, 50.0, method="nearest"))),
        specials("n")),
    vec("unique_size", unique_all, choice([3, -1, 3, 0, -1, 7], "n", dtype=np.int32),
        sizes=SIZES, modes=FORWARD),
    vec("unique_size_floats", composite(lambda x: jnp.unique(x, size=4, fill_value=-9.0)),
        specials("n"), sizes=SIZES),
    Case("searchsorted_queries", searchsorted_all, [None, "n"],
         make(sorted_table, specials("n")), sizes=SIZES, modes=FORWARD),
]

CASES_BY_NAME, test_rule = table_test(CASES)


# --- the ties with the padding, made certain --------------------------------

@pytest.mark.parametrize("dtype, top", [(np.float32, np.nan), (np.int32, 2**31 - 1),
                                        (np.bool_, True)])
def test_padding_sorts_after_equal_valid_entries(dtype, top):
  """Padding equal to the valid entries that sort last still sorts behind them,
  even in a sort asked to be unstable (XLA's reorders ties from 32 entries)."""
  n = 16
  x = np.full(32, top, dtype)
  x[1:n:2] = 0
  masked = pj.mask(lambda x: lax.sort((x, jnp.arange(x.shape[0])), is_stable=False), ["n"])
  keys, order = masked([x], {"n": n})
  assert sorted(np.asarray(order)[:n]) == list(range(n))
  np.testing.assert_array_equal(np.asarray(keys)[:n], np.sort(x[:n]))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_top_k_never_picks_padding_that_ties(dtype):
  """Padding equal to the smallest valid entries loses on its index."""
  low = _lowest(dtype)
  x = np.array([5, low, low, low, low, low], dtype)
  masked = pj.mask(lambda x: lax.top_k(x, 3), ["n"], constraints=["n >= 3"])
  values, index = masked([x], {"n": 3})
  expected_values, expected_index = lax.top_k(x[:3], 3)
  np.testing.assert_array_equal(np.asarray(index), expected_index)
  np.testing.assert_array_equal(np.asarray(values).view(np.uint8),
                                np.asarray(expected_values).view(np.uint8))


def _lowest(dtype):
  if dtype == np.float32:  # the lowest float of the total order top_k uses
    return np.array(0xFFFFFFFF, np.uint32).view(np.float32)
  return np.iinfo(dtype).min


# --- what cannot be masked says so ------------------------------------------

def test_approx_top_k_along_a_dynamic_axis_is_refused():
  masked = pj.mask(lambda x: lax.approx_max_k(x, 2), ["n"], constraints=["n >= 2"])
  with pytest.raises(pj.MaskingError, match=r"'approx_top_k'.*approximate(.|\n)*lax.top_k"):
    masked([np.zeros(8, np.float32)], {"n": 4})


def test_approx_top_k_along_a_fixed_axis_runs():
  x = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
  masked = pj.mask(lambda x: lax.approx_min_k(x, 2, reduction_dimension=1), ["(n, _)"])
  values, index = masked([x], {"n": 3})
  expected_values, expected_index = lax.approx_min_k(x[:3], 2, reduction_dimension=1)
  np.testing.assert_array_equal(np.asarray(values)[:3], expected_values)
  np.testing.assert_array_equal(np.asarray(index)[:3], expected_index)


def test_searchsorted_into_a_dynamic_array_passed_directly():
  """JAX 0.10.2 needs the sorted array's length as a constant (it checks that
  the index dtype can hold it); polyjit's replacement of `jnp.searchsorted`
  traces it, also where the function itself is passed to `pj.mask`
  (`_jax.as_called_by_name`)."""
  masked = pj.mask(jnp.searchsorted, ["n", None])
  a = np.array([1, 2, 3, np.nan, np.inf, -np.inf, np.nan, 0], np.float32)
  q = np.array([0.5, 2.5, 10.0], np.float32)
  want = jnp.searchsorted(jnp.asarray(a[:3]), q)
  np.testing.assert_array_equal(np.asarray(masked([a, q], {"n": 3})), want)
  np.testing.assert_array_equal(np.asarray(jax.jit(masked)([a, q], {"n": 3})), want)
