"""Traced sizes that break the contract poison every output (issue 31).

The contract (docs/guide/mask.md, "The contract for traced sizes"): a traced
size outside `[0, padded]` gets no plausible number. Every output, so also
the logical shapes a data-dependent function returns (its counts: 1 at n = 20
on 8 padded values before, 5 at n = 2**31 - 1) and typed PRNG
keys (returned unchanged before). A declared constraint (`constraints=["n >=
3"]`) is part of the contract too: with a traced size that violates it,
`lax.top_k(x, 3)` returned `[5, 1, nan]` where jax.jit raises; now the
outputs are poisoned, and under `pj.verify()` the call raises.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

INT_MIN = np.iinfo(np.int32).min
X = np.array([5., 1., 3., 4., np.nan, np.nan, np.nan, np.nan], np.float32)
OUT_OF_RANGE = (0, -3, 9, 20, 2 ** 31 - 1)


def selection():
  return pj.mask(lambda v: v[v > 2], ["n"])


def test_counts_are_poisoned_with_sizes_out_of_range():
  masked = selection()
  call = jax.jit(lambda x, n: masked([x], {"n": n}))
  out, (count,) = call(X, 4)
  assert int(count) == 3 and np.array_equal(np.asarray(out)[:3], [5., 3., 4.])
  for n in OUT_OF_RANGE:
    out, (count,) = call(X, n)
    assert int(count) == INT_MIN, n
    assert np.all(np.isnan(out))


def test_counts_under_vmap_over_sizes():
  masked = selection()
  out, (count,) = jax.vmap(lambda n: masked([X], {"n": n}))(np.array([4, 20, 2, 0], np.int32))
  assert np.asarray(count).tolist() == [3, INT_MIN, 1, INT_MIN]


def test_counts_are_poisoned_where_a_check_failed():
  """An empty selection's max raises under pj.jit; with traced sizes the
  values are poisoned, and now the count with them."""
  masked = pj.mask(lambda v: (v[v > 4.5], jnp.max(v[v > 4.5])), ["n"])
  call = jax.jit(lambda x, n: masked([x], {"n": n}))
  (sel, top), ((count,), _) = call(X, 4)
  assert int(count) == 1 and float(top) == 5.0
  x = np.where(np.isnan(X), X, 1.0).astype(np.float32)
  (sel, top), ((count,), _) = call(x, 4)
  assert np.isnan(top) and int(count) == INT_MIN


def keyed():
  return pj.mask(lambda v, key: (jnp.sum(v), jax.random.split(key)[0]), ["n", None])


def test_typed_keys_are_poisoned_with_sizes_out_of_range():
  masked = keyed()
  key = jax.random.key(0)
  call = jax.jit(lambda x, n: masked([x, key], {"n": n}))
  total, good = call(np.nan_to_num(X), 3)
  assert float(total) == 9.0
  want = jax.random.key_data(jax.random.split(key)[0])
  assert np.array_equal(jax.random.key_data(good), want)
  for n in (-1, 20):
    total, bad = call(np.nan_to_num(X), n)
    assert np.isnan(total)
    assert np.all(np.asarray(jax.random.key_data(bad)) == np.iinfo(np.uint32).max)


def test_typed_keys_under_pj_vmap_with_a_length_out_of_range():
  data = np.nan_to_num(np.stack([X, X]))
  keys = jax.random.split(jax.random.key(1), 2)
  f = pj.vmap(lambda v, key: (jnp.sum(v), jax.random.split(key)[0]))
  # (traced lengths: concrete ones out of range are a ShapeError before running)
  total, k = jax.jit(lambda d, n, ks: f(pj.Ragged(d, n), ks))(
      data, np.array([3, 30], np.int32), keys)
  assert float(total[0]) == 9.0 and np.isnan(total[1])
  kd = np.asarray(jax.random.key_data(k))
  assert np.all(kd[1] == np.iinfo(np.uint32).max) and not np.all(kd[0] == np.iinfo(np.uint32).max)


def top3():
  return pj.mask(lambda x: lax.top_k(x, 3)[0], ["n"], constraints=["n >= 3"])


def test_a_violated_constraint_poisons_the_outputs():
  masked = top3()
  call = jax.jit(lambda x, n: masked([x], {"n": n}))
  np.testing.assert_array_equal(np.asarray(call(X, 4))[:3], [5., 4., 3.])
  with pytest.raises(ValueError):   # what jax.jit of the function does at n = 2
    jax.jit(lambda x: lax.top_k(x, 3)[0])(X[:2])
  assert np.all(np.isnan(call(X, 2)))
  rows = np.asarray(jax.vmap(lambda n: masked([X], {"n": n}))(np.array([3, 2, 4], np.int32)))
  assert np.all(np.isnan(rows[1])) and not np.any(np.isnan(rows[[0, 2]][:, :3]))


def test_a_violated_constraint_with_data_dependent_counts():
  masked = pj.mask(lambda v: v[v > 2] * v.shape[0], ["n"], constraints=["n >= 2"])
  call = jax.jit(lambda x, n: masked([x], {"n": n}))
  out, (count,) = call(X, 4)
  assert int(count) == 3
  out, (count,) = call(X, 1)
  assert int(count) == INT_MIN and np.all(np.isnan(out))


def test_the_checking_mode_raises_for_a_violated_constraint():
  masked = top3()
  with pj.verify():
    call = jax.jit(lambda x, n: masked([x], {"n": n}))
    call(X, 4)
    with pytest.raises(Exception, match="(?s)SizeRangeError.*violate the declared constraints"):
      jax.block_until_ready(call(X, 2))


def test_concrete_sizes_still_raise_for_a_violated_constraint():
  with pytest.raises(pj.ShapeError, match="n >= 3"):
    top3()([X], {"n": 2})
