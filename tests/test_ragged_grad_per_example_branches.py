"""`jax.grad` of `pj.vmap` over a function that branches per example.

Under `jax.vmap` JAX turns a `cond` or `switch` on a per-example predicate
into selects whose unselected side reads `stop_gradient(x)`. polyjit's
native derivative of a batched masked call (`_masking/calls.py`) vmapped the
per-example JVP, so those selects were put on tangents, and `jax.grad`
raised "Transpose rule (for reverse-mode differentiation) for
'stop_gradient' not implemented": for the path of empty examples (a trace
with no dynamic axis, which the native gate admits), and for a branch on a
fixed-shape value (a pooled vector) with every example non-empty. The batch
is now differentiated after it is batched, as `jax.grad(jax.vmap(f))` is.

Each function is compared with each example run alone under `jax.jit`: the
per-example values, the gradient of the total with respect to the shared
weight (the sum of the per-example gradients) and to each example's tokens,
eagerly and under `jax.jit`, over a padded batch with empty examples, a
padded batch without, and a packed one (which runs these unpacked), with
NaN and inf in all padding; and as `jax.vmap` of `pj.mask`, a batch of
batches, and a second derivative.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from test_packing import _poison, with_data

WITH_EMPTY = (2, 0, 3, 16, 0, 7)
NONEMPTY = (2, 1, 3, 16, 1, 7)


def cond_tokens(w, x):
  """The branch on the tokens themselves."""
  return jnp.sum(lax.cond(jnp.sum(x) > 0, lambda x: jnp.tanh(x @ w), lambda x: -(x @ w), x))


def cond_pooled(w, x):
  """The branch on a fixed-shape value: no dynamic axis in the cond."""
  pooled = jnp.sum(x @ w, axis=0)
  return jnp.sum(lax.cond(jnp.sum(x) > 0, jnp.tanh, jnp.sin, pooled))


def switch_three(w, x):
  """Three branches, chosen by the count of positive entries."""
  index = jnp.sum(x > 0) % 3
  return jnp.sum(lax.switch(index, [lambda h: jnp.tanh(h), lambda h: h * h,
                                    lambda h: jnp.cos(h)], x @ w))


def switch_pooled(w, x):
  index = jnp.sum(x > 0) % 3
  pooled = jnp.sum(x, axis=0) @ w
  return jnp.sum(lax.switch(index, [jnp.tanh, jnp.sin, lambda h: h * h], pooled))


def cond_nn(w, x):
  """jax.nn functions that stop gradients themselves (logsumexp's and
  softmax's shift by the maximum) in the branches."""
  return jnp.sum(lax.cond(jnp.sum(x) > 0,
                          lambda h: jax.nn.logsumexp(h, axis=-1),
                          lambda h: jnp.sum(jax.nn.softmax(h, axis=-1) * h, axis=-1),
                          x @ w))


def cond_in_loop(w, x):
  """A cond in each step of a loop of fixed trip count (a scan)."""
  def step(i, h):
    return lax.cond(jnp.sum(h) > 0, jnp.tanh, lambda h: 0.5 * h + jnp.sin(h), h)
  return jnp.sum(lax.fori_loop(0, 3, step, x @ w))


FUNS = {f.__name__: f for f in (cond_tokens, cond_pooled, switch_three, switch_pooled,
                                cond_nn, cond_in_loop)}


def _examples(lengths, seed=0):
  rng = np.random.default_rng(seed)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  return w, [rng.normal(size=(n, 3)).astype(np.float32) for n in lengths]


def _padded(examples):
  """A `pj.Ragged` of `examples` with NaN and inf in its padding."""
  lengths = np.array([len(x) for x in examples], np.int32)
  data = np.full((len(examples), 16, 3), np.nan, np.float32)
  data[:, 1::2] = np.inf
  for i, x in enumerate(examples):
    data[i, :len(x)] = x
  return pj.Ragged(jnp.asarray(data), lengths)


def _alone(fun, w, examples):
  """Per example, alone under `jax.jit`: (value, (gradient for w, for x))."""
  one = jax.value_and_grad(fun, argnums=(0, 1))
  return jax.jit(lambda w, xs: [one(w, x) for x in xs])(w, [jnp.asarray(x) for x in examples])


def _check(fun, w, examples, batch, rebuild, jit):
  per_example = pj.vmap(fun, in_axes=(None, 0))

  def total(w, data):
    values = per_example(w, rebuild(batch, data))
    return jnp.sum(values), values

  step = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)
  with warnings.catch_warnings():
    # (per-example copies of w where sizes may be 0; a packed batch runs these unpacked)
    warnings.simplefilter("ignore", pj.PerformanceWarning)
    (_, values), (grad_w, grad_data) = (jax.jit(step) if jit else step)(w, batch.data)
  alone = _alone(fun, w, examples)
  grad_x = rebuild(batch, grad_data).to_list()
  for i, (value, (_, want_x)) in enumerate(alone):
    np.testing.assert_allclose(values[i], value, rtol=2e-5, atol=2e-5, err_msg=str(i))
    np.testing.assert_allclose(grad_x[i], want_x, rtol=1e-4, atol=1e-5, err_msg=str(i))
  np.testing.assert_allclose(grad_w, sum(g[0] for _, g in alone), rtol=1e-4, atol=1e-4)
  assert np.isfinite(np.asarray(grad_data)).all()   # zero in the padding, not NaN


def _ragged_with(batch, data):
  return pj.Ragged(data, batch.lengths)


@pytest.mark.parametrize("name", sorted(FUNS))
def test_padded_batch_with_empty_examples(name):
  w, examples = _examples(WITH_EMPTY)
  _check(FUNS[name], w, examples, _padded(examples), _ragged_with, jit=True)


def test_padded_batch_with_empty_examples_eagerly():
  w, examples = _examples(WITH_EMPTY)
  _check(cond_tokens, w, examples, _padded(examples), _ragged_with, jit=False)


@pytest.mark.parametrize("name", ["cond_pooled", "switch_pooled"])
def test_padded_batch_without_empty_examples(name):
  # (no empty path: the main trace's branch on a fixed-shape value is native)
  w, examples = _examples(NONEMPTY)
  batch = _padded(examples)
  assert batch.nonempty
  _check(FUNS[name], w, examples, batch, _ragged_with, jit=True)


@pytest.mark.parametrize("name, jit", [("cond_tokens", False), ("cond_tokens", True),
                                       ("switch_three", True), ("cond_nn", True)])
def test_packed_batch_with_empty_examples(name, jit):
  w, examples = _examples(WITH_EMPTY, seed=1)
  packed = _poison(pj.Ragged.from_list(examples, packing=pj.Packing(row_length=16)))
  assert packed.rows < len(examples)   # several examples share a row
  _check(FUNS[name], w, examples, packed, with_data, jit)


def _summed_alone(fun, w, examples):
  return sum(g[0] for _, g in _alone(fun, w, examples))


@pytest.mark.parametrize("name", ["cond_tokens", "cond_pooled"])
def test_jax_vmap_of_pj_mask(name):
  """The same batch as `jax.vmap` of `pj.mask` over the lengths."""
  fun = FUNS[name]
  w, examples = _examples(WITH_EMPTY)
  batch = _padded(examples)
  masked = pj.mask(fun, [None, "(n, _)"])

  def total(w):
    return jnp.sum(jax.vmap(lambda x, n: masked([w, x], {"n": n}))(
        batch.data, jnp.asarray(batch.lengths)))

  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.PerformanceWarning)
    got = jax.jit(jax.grad(total))(w)
  np.testing.assert_allclose(got, _summed_alone(fun, w, examples), rtol=1e-4, atol=1e-4)


def test_batch_of_batches():
  """`jax.vmap` over `pj.vmap` (a batched call batched again): two batches,
  the second the first's examples in reverse order."""
  fun = cond_pooled
  w, examples = _examples(WITH_EMPTY)
  batch = _padded(examples)
  data = jnp.stack([batch.data, batch.data[::-1]])
  lengths = jnp.stack([jnp.asarray(batch.lengths), jnp.asarray(batch.lengths)[::-1]])
  per_example = pj.vmap(fun, in_axes=(None, 0))

  def total(w):
    return jnp.sum(jax.vmap(lambda d, n: per_example(w, pj.Ragged(d, n)))(data, lengths))

  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.PerformanceWarning)
    got = jax.jit(jax.grad(total))(w)
  np.testing.assert_allclose(got, 2 * _summed_alone(fun, w, examples), rtol=1e-4, atol=1e-4)


def test_second_derivatives():
  """jax.hessian (jacfwd of jacrev) of the batch's total for the weight."""
  fun = cond_tokens
  w, examples = _examples(WITH_EMPTY)
  batch = _padded(examples)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.PerformanceWarning)
    got = jax.jit(jax.hessian(lambda w: jnp.sum(pj.vmap(fun, in_axes=(None, 0))(w, batch))))(w)
  one = jax.hessian(fun)
  want = sum(jax.jit(lambda w, xs: [one(w, x) for x in xs])(w, [jnp.asarray(x) for x in examples]))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
