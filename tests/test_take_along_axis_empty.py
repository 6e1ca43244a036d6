"""`jnp.take_along_axis` at a dynamic size that may be 0.

A next-token loss, `jnp.take_along_axis(jax.nn.log_softmax(logits[:-1]),
targets[1:, None], axis=-1)`, gathers along an axis of size `n - 1`, empty
for an example of one token. JAX's gather there has slice size 1 along that
axis, and at a symbolic `n - 1` its check `1 <= n - 1` cannot be proven:
pj.mask raised pj.MaskingError at n = 1, a packed pj.vmap whatever the
lengths, the padded pj.vmap refused examples of one token (pj.ShapeError)
and pj.jit fell back to jax.jit once sizes varied, where jax.jit
at n = 1 gives an empty gather (its loss sum 0, its mean NaN). So for
`take_along_axis(x[1:], idx, axis=0)` (the axis taken from may be empty:
JAX returns zeros there). `_spellings/along_axis.py` gathers from arrays
padded by one along those axes; each way polyjit takes sizes is checked here
against JAX on the unpadded arrays, with NaN and inf in the padding, and
gradients with respect to shared parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from harness import Case, make, normal, table_test
from test_packing import _check

V = 5


def next_token_loss(w, logits, targets):
  lp = jnp.take_along_axis(jax.nn.log_softmax((logits @ w)[:-1]), targets[1:, None], axis=-1)
  return jnp.sum(lp), jnp.mean(lp), lp


def targets(rng, sizes):
  return rng.integers(0, V, sizes["n"]).astype(np.int32)


def indices(low, high, count=lambda n: 4):
  """Int32 indices in [low(n), high(n)) of the unpadded size n, count(n) of them."""
  return lambda rng, sizes: rng.integers(low(sizes["n"]), high(sizes["n"]),
                                         count(sizes["n"])).astype(np.int32)


def along_a_shorter_axis(x, i):
  """Taken along an axis of size n - 1 (empty at n = 1: JAX's zeros), every mode."""
  y = x[1:]
  return (jnp.take_along_axis(y, i, axis=0),
          jnp.take_along_axis(y, i, axis=0, mode="clip"),
          jnp.take_along_axis(y, i, axis=0, mode="fill", fill_value=-3.0),
          jnp.take_along_axis(y * 2.0, jnp.clip(i, 0, None) % jnp.maximum(y.shape[0], 1),
                              axis=0, mode="promise_in_bounds"),
          jnp.take_along_axis(y[:, None], i[:, None], axis=0))


def batched_and_along(x, i):
  """(n - 1, n - 1): batched along one short axis, taken along the other."""
  y = x[1:, None] * x[None, 1:]
  return jnp.take_along_axis(y, i[1:, None] % jnp.maximum(y.shape[1], 1), axis=1)


SIZES = ({"n": 1}, {"n": 2}, {"n": 5})
CASES = [
    Case("next_token_loss", next_token_loss, [None, "(n, _)", "n"],
         make(normal(V, V), normal("n", V), targets), sizes=SIZES, compiled=True),
    Case("along_a_shorter_axis", along_a_shorter_axis, ["n", None],
         make(normal("n"), indices(lambda n: -n - 1, lambda n: n + 1)), sizes=SIZES,
         compiled=True),
    Case("batched_and_along_shorter_axes", batched_and_along, ["n", "n"],
         make(normal("n"), indices(lambda n: 0, lambda n: 2 * n + 1, count=lambda n: n)),
         sizes=SIZES, compiled=True),
]
CASES_BY_NAME, test_masked_take_along_axis = table_test(CASES)


def test_the_loss_of_one_token_is_what_jax_gives():
  """pj.mask at n = 1 (NaN in the padding): the loss sum 0, the mean NaN, no
  entries; a shared parameter's gradient of the sum 0, as jax.jit's."""
  rng = np.random.default_rng(1)
  w = rng.standard_normal((V, V)).astype(np.float32)
  logits = np.full((6, V), np.nan, np.float32)
  logits[0] = rng.standard_normal(V)
  tgt = np.array([2, 7, -9, 100, 3, 1], np.int32)
  masked = pj.mask(next_token_loss, [None, "(n, _)", "n"])
  total, mean, _ = masked([w, logits, tgt], {"n": 1})
  assert float(total) == 0.0 and np.isnan(mean)
  grad = jax.grad(lambda w: masked([w, logits, tgt], {"n": 1})[0])(w)
  want = jax.jit(jax.grad(lambda w: next_token_loss(w, logits[:1], tgt[:1])[0]))(w)
  np.testing.assert_array_equal(grad, want)


def _examples(lengths, seed=2):
  rng = np.random.default_rng(seed)
  return [(rng.standard_normal((n, V)).astype(np.float32),
           rng.integers(0, V, n).astype(np.int32)) for n in lengths]


def _example_loss(w, example):
  total, mean, lp = next_token_loss(w, *example)
  return total, jnp.where(jnp.isnan(mean), 0.0, mean), lp


def test_packed_next_token_loss_is_exact():
  """Packed (examples of one token among longer ones, NaN and inf in the
  rows' tails), with no warning: each example's sum, mean and per-token
  values, and the shared parameter's gradient, as each alone under jax.jit."""
  w = jnp.asarray(np.random.default_rng(3).standard_normal((V, V)).astype(np.float32))
  _check(lambda w, ex: next_token_loss(w, *ex), w, _examples([5, 1, 9, 13, 1, 2]))


def test_padded_vmap_takes_examples_of_one_token():
  """pj.vmap over a pj.Ragged (one padded row per example, NaN padding):
  examples of one token are no longer refused; values and the shared
  parameter's gradient as each example alone under jax.jit."""
  w = jnp.asarray(np.random.default_rng(4).standard_normal((V, V)).astype(np.float32))
  examples = _examples([1, 4, 1, 7])
  ragged = pj.Ragged.from_list(examples)
  lengths = np.asarray(ragged.lengths)
  logits, tgt = ragged.data
  pad = np.arange(logits.shape[1])[None, :] >= lengths[:, None]
  logits = jnp.where(pad[..., None], jnp.asarray(np.nan, np.float32), logits)
  tgt = jnp.where(pad, 1_000_000, tgt)
  poisoned = pj.Ragged((logits, tgt), ragged.lengths)
  fun = pj.vmap(_example_loss, in_axes=(None, 0))

  def loss(w):
    total, mean, _ = fun(w, poisoned)
    return jnp.sum(total) + jnp.sum(mean), (total, mean)
  grad, (total, mean) = jax.jit(jax.grad(loss, has_aux=True))(w)
  want = jax.jit(lambda w, xs: [(_example_loss(w, x), jax.grad(
      lambda w: sum(_example_loss(w, x)[:2]))(w)) for x in xs])(w, examples)
  for i, ((t, m, _), _) in enumerate(want):
    np.testing.assert_allclose(total[i], t, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(mean[i], m, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(grad, sum(g for _, g in want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shapes", [None, [None, "(n, _)", "n"]])
def test_pj_jit_matches_jax_jit(shapes):
  """pj.jit (sizes found from the calls, or declared), with no fallback:
  examples of one token among longer ones in the same programs."""
  rng = np.random.default_rng(5)
  w = rng.standard_normal((V, V)).astype(np.float32)
  f = pj.jit(next_token_loss, polymorphic_shapes=shapes, fallback="error")
  for n in (3, 1, 2, 6, 1):
    logits, tgt = rng.standard_normal((n, V)).astype(np.float32), targets(rng, {"n": n})
    got = f(w, logits, tgt)
    want = jax.jit(next_token_loss)(w, logits, tgt)
    for g, e in zip(got, want, strict=True):
      np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-5, err_msg=str(n))
