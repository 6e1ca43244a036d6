"""`pj.PerformanceWarning`: a slow path polyjit takes is announced (issue 32).

Where the native gate (`_masking/native.py`) refuses a masked function and a
batch differentiates it with respect to an input every example shares, that
input's gradient is built once per example and summed: one warning per
function names the reason and what to do. Functions differentiated natively,
and per-example gradients (vmap of grad), warn nothing.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def refused(p, x):
  # a scatter-add that promises its indices in bounds on a dynamic axis: the
  # native gate refuses it (JAX's own derivatives of it disagree out of bounds)
  y = jnp.tanh(x @ p)
  shifted = jnp.zeros_like(y).at[::-1].add(y, mode="promise_in_bounds")
  return jnp.sum(jnp.tanh(shifted) * y)


def native(p, x):
  return jnp.sum(jax.nn.relu(x @ p))


def _batch():
  rng = np.random.default_rng(0)
  return pj.Ragged.from_list([rng.standard_normal((n, 3)).astype(np.float32)
                              for n in (2, 5, 4)])


def _grad_of_batch(fun, p, batch):
  return jax.grad(lambda p: pj.vmap(fun, in_axes=(None, 0))(p, batch).sum())(p)


def _performance(caught):
  return [w for w in caught if issubclass(w.category, pj.PerformanceWarning)]


def test_refused_function_warns_once_naming_the_reason():
  fun = lambda p, x: refused(p, x)   # a function of its own: its own warning
  p, batch = jnp.ones((3, 2)), _batch()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = _grad_of_batch(fun, p, batch)
    _grad_of_batch(fun, p, batch)
  (w,) = _performance(caught)
  assert issubclass(w.category, pj.PolyjitWarning)
  text = str(w.message)
  assert "PROMISE_IN_BOUNDS" in text and "float32[3,2]" in text and "What to do" in text
  assert w.filename == __file__   # attributed to the user's line
  want = sum(jax.grad(fun)(p, jnp.asarray(x)) for x in batch.to_list())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_native_function_and_per_example_gradients_warn_nothing():
  p, batch = jnp.ones((3, 2)), _batch()
  fun = lambda p, x: refused(p, x)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _grad_of_batch(lambda p, x: native(p, x), p, batch)
  assert _performance(caught) == []
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    # gradients per example are what is asked for: nothing is summed (the
    # sizes may be 0 here, which is announced apart: see below)
    per_example = pj.mask(fun, [None, "(n, 3)"])
    jax.vmap(jax.grad(lambda p, x, n: per_example([p, x], {"n": n})), in_axes=(None, 0, 0))(
        p, batch.data, batch.lengths)
  assert not [w for w in _performance(caught) if "one example at a time" in str(w.message)]


def test_sizes_that_may_be_empty_under_vmap_warn_once():
  p, batch = jnp.ones((3, 2)), _batch()
  masked = pj.mask(lambda p, x: native(p, x), [None, "(n, 3)"])
  loss = lambda p: jax.vmap(lambda x, n: masked([p, x], {"n": n}))(
      batch.data, batch.lengths).sum()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = jax.grad(loss)(p)
    jax.grad(loss)(p)
  (w,) = _performance(caught)
  assert "may be 0" in str(w.message) and "float32[3,2]" in str(w.message)
  assert w.filename == __file__
  want = sum(jax.grad(native)(p, jnp.asarray(x)) for x in batch.to_list())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ragged_known_nonempty_warns_nothing():
  p, batch = jnp.ones((3, 2)), _batch()
  assert batch.nonempty
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _grad_of_batch(lambda p, x: native(p, x), p, batch)
  assert _performance(caught) == []


def test_a_constraint_that_sizes_are_nonzero_takes_no_empty_path():
  # jax.vmap of pj.mask with traced sizes may see 0: each example then selects
  # between its computation and an empty path, copying the shared input per
  # example (announced). `constraints=["n >= 1"]` rules 0 out: no select, no
  # warning; a 0 that comes anyway violates the constraint and is poisoned.
  rng = np.random.default_rng(1)
  xs = rng.standard_normal((3, 6, 3)).astype(np.float32)
  p = rng.standard_normal((3, 2)).astype(np.float32)
  loss = lambda p, x: jnp.sum(jnp.tanh(x @ p))

  def batched(masked, ns):
    return jax.vmap(lambda x, n: masked([p, x], {"n": n}))(xs, ns)

  for constraints, announced in ((None, True), (["n >= 1"], False)):
    kw = {} if constraints is None else {"constraints": constraints}
    masked = pj.mask(loss, [None, "(n, _)"], **kw)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      out = np.asarray(jax.jit(lambda ns: batched(masked, ns))(np.array([2, 6, 1], np.int32)))
    assert any(issubclass(w.category, pj.PerformanceWarning) for w in caught) == announced
    np.testing.assert_allclose(out, [loss(p, xs[i, :n]) for i, n in enumerate((2, 6, 1))],
                               rtol=1e-6)
  zero = np.asarray(jax.jit(lambda ns: batched(masked, ns))(np.array([2, 0, 1], np.int32)))
  assert np.isnan(zero[1]) and np.isfinite(zero[[0, 2]]).all()
