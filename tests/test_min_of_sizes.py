"""`min(n, m)` of two traced sizes reaching a shape (`x[:min(n, m)] * y[:min(n, m)]`).

With concrete sizes (pj.jit) the comparison is settled as a constraint at
once. With traced sizes (jax.jit of pj.mask, pj.vmap over pj.Ragged) a
comparison between sizes is first answered freely; only when that trace fails
is it settled as a constraint, each side traced ('n - m >= 0', 'n - m <= -1'),
and each side runs at padded sizes that satisfy its constraint (an argument
padded further where needed). Checked against the unpadded computation with
NaN in the padding, on every side, with gradients.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

PAD = 6
SIZES = [(n, m) for n, m in itertools.product(range(1, PAD + 1), repeat=2)]


def f(a, b):
  k = min(a.shape[0], b.shape[0])
  return jnp.sum(a[:k] * b[:k])


def g_vec(a, b):
  k = max(a.shape[0], b.shape[0])   # max too: a scalar of both lengths
  return jnp.sum(jnp.sin(a[:k])) * jnp.sum(b[:k] ** 2) + k


def pick(a, b):   # compares sizes; no shape depends on the answer
  return jnp.sum(a) if a.shape[0] >= b.shape[0] else 2.0 * jnp.sum(b)


def data(n, m, seed=0):
  rng = np.random.default_rng(seed + 7 * n + m)
  return (rng.standard_normal(n).astype(np.float32),
          rng.standard_normal(m).astype(np.float32))


def nan_padded(x, pad=PAD):
  out = np.full(pad, np.nan, np.float32)
  out[:len(x)] = x
  return jnp.asarray(out)


@pytest.mark.parametrize("pads", [(PAD, PAD), (PAD, 4), (3, PAD)])
@pytest.mark.parametrize("fun", [f, g_vec, pick])
def test_jit_of_mask_traced_sizes(fun, pads):
  masked = pj.mask(fun, ["n", "m"])
  run = jax.jit(lambda a, b, n, m: masked([a, b], {"n": n, "m": m}))
  grad = jax.jit(jax.grad(lambda a, b, n, m: masked([a, b], {"n": n, "m": m}), (0, 1)))
  pa, pb = pads
  for n, m in SIZES:
    if n > pa or m > pb:
      continue
    a, b = data(n, m)
    a_pad, b_pad = nan_padded(a, pa), nan_padded(b, pb)
    want = fun(jnp.asarray(a), jnp.asarray(b))
    got = run(a_pad, b_pad, n, m)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{n=} {m=}")
    ga, gb = grad(a_pad, b_pad, n, m)
    wa, wb = jax.grad(fun, (0, 1))(jnp.asarray(a), jnp.asarray(b))
    for gx, wx, size in ((ga, wa, n), (gb, wb, m)):
      assert not np.isnan(np.asarray(gx)).any(), (n, m)
      np.testing.assert_allclose(gx[:size], wx, rtol=2e-5, atol=2e-5, err_msg=f"{n=} {m=}")
      np.testing.assert_array_equal(gx[size:], 0.0)


@pytest.mark.parametrize("fun", [f, g_vec, pick])
def test_vmap_over_ragged(fun):
  pairs = [(3, 4), (5, 2), (4, 4), (1, 6), (6, 1)]   # n < m, n > m, n == m
  examples = [data(n, m) for n, m in pairs]

  def ragged(xs):
    d = np.stack([np.asarray(nan_padded(x)) for x in xs])
    return pj.Ragged(jnp.asarray(d), jnp.asarray([len(x) for x in xs], jnp.int32))

  A, B = ragged([a for a, _ in examples]), ragged([b for _, b in examples])
  got = pj.vmap(fun)(A, B)
  want = [fun(jnp.asarray(a), jnp.asarray(b)) for a, b in examples]
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)

  loss = lambda da, db: pj.vmap(fun)(pj.Ragged(da, A.lengths), pj.Ragged(db, B.lengths)).sum()
  ga, gb = jax.jit(jax.grad(loss, (0, 1)))(A.data, B.data)
  assert not np.isnan(np.asarray(ga)).any() and not np.isnan(np.asarray(gb)).any()
  for i, (a, b) in enumerate(examples):
    wa, wb = jax.grad(fun, (0, 1))(jnp.asarray(a), jnp.asarray(b))
    np.testing.assert_allclose(ga[i, :len(a)], wa, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(gb[i, :len(b)], wb, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(ga[i, len(a):], 0.0)
    np.testing.assert_array_equal(gb[i, len(b):], 0.0)


def test_the_reported_example():
  A = pj.Ragged.from_list([np.arange(3.), np.arange(5.)])
  B = pj.Ragged.from_list([np.arange(4.), np.arange(2.)])
  np.testing.assert_allclose(pj.vmap(f)(A, B), [5.0, 1.0])


def test_pj_jit_concrete_sizes_unchanged():
  jf = pj.jit(f)
  for n, m in [(3, 5), (5, 3), (4, 4)]:
    a, b = data(n, m)
    np.testing.assert_allclose(jf(a, b), f(jnp.asarray(a), jnp.asarray(b)), rtol=2e-5)


def test_free_comparison_keeps_one_padded_environment():
  """A comparison no shape depends on is not settled as a constraint: its
  variants run at the arguments' own padded sizes (n = m = PAD included)."""
  masked = pj.mask(pick, ["n", "m"])
  args = [nan_padded(np.zeros(1, np.float32)), nan_padded(np.zeros(1, np.float32))]
  found = masked.variants(args)
  assert len(found) == 2 and all(v.constraints == () for v in found)


def test_min_of_sizes_in_an_output_shape_is_refused_clearly():
  """Sides whose outputs have different symbolic shapes ((n,) and (m,)): one
  program cannot return both; refused as before (ShapeError), never wrong."""
  masked = pj.mask(lambda a, b: a[:min(a.shape[0], b.shape[0])] * b[:min(a.shape[0], b.shape[0])],
                   ["n", "m"])
  with pytest.raises(pj.ShapeError, match="depend on a size comparison"):
    jax.jit(lambda a, b, n, m: masked([a, b], {"n": n, "m": m}))(
        nan_padded(np.ones(2)), nan_padded(np.ones(3)), 2, 3)
