"""Strided and reversed slices of a data-dependent size: `x[x > 0][::2]`.

JAX spells a slice with a step at a symbolic size as a gather whose shape rule
asks `size >= 1`; polyjit does such slices on data-dependent axes with
`lax.rev` and `lax.slice` (`_spellings/data_dependent._strided_slices`), so an
empty selection gives the empty result NumPy gives. The reference is NumPy on
the unpadded data; the subjects are pj.jit (automatic and
`polymorphic_shapes`), pj.mask with concrete sizes and jax.jit(pj.mask) with
traced sizes (NaN padding), at selection counts 0, 1, 2, some and all.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from harness import nan_padded, unpad_outputs


def _rows(xp, x):
  """Rank-1 `x`."""
  y = x[x > 0]
  (nz,) = xp.nonzero(x > 0)
  return {
      "[::2]": y[::2] * 2,
      "[1::3]": y[1::3],
      "[::-1]": y[::-1],
      "[::-2]": y[::-2] + 1,
      "[-2::-3]": y[-2::-3],
      "[1:-1:2]": y[1:-1:2],
      "[:3:2]": y[:3:2],
      "[(::2)][::-1]": y[::2][::-1],
      "[::2] sum": xp.sum(y[::2] ** 2),
      "[::2] len": xp.asarray(y[::2].shape[0]),
      "nonzero[::2]": nz[::2],
      "nonzero[::-1]": nz[::-1],
  }


def _rows_2d(xp, x):
  """Rank-2 `x` (n, 3): the selection is the leading axis."""
  y = x[x[:, 0] > 0]
  return {
      "[::2, 1]": y[::2, 1],
      "[::-1, ::2]": y[::-1, ::2],
      "[None, 1::2, ...]": y[None, 1::2, ...],
      "[..., ::-1][::2]": y[..., ::-1][::2],
  }


def _data(n, count, rank=1, seed=0):
  rng = np.random.default_rng(seed + 7 * count + n)
  shape = (n,) if rank == 1 else (n, 3)
  mag = rng.integers(1, 9, shape).astype(np.float32) + 0.5
  rows = rng.permutation(n) < count
  sign = np.where(rows if rank == 1 else rows[:, None], 1.0, -1.0).astype(np.float32)
  if rank == 2:  # only column 0 decides
    sign = np.concatenate([sign[:, :1], np.ones((n, 2), np.float32)], axis=1)
  return mag * sign


def _close(got, want):
  assert got.keys() == want.keys()
  for name in want:
    g, w = np.asarray(got[name]), np.asarray(want[name])
    assert g.shape == w.shape, (name, g.shape, w.shape)
    assert not np.isnan(g).any(), name
    np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=name)


CASES = [(n, c) for n in (5, 7) for c in sorted({0, 1, 2, n // 2, n})]


@pytest.mark.parametrize("rows, rank", [(_rows, 1), (_rows_2d, 2)])
def test_strided_slices_of_selections(rows, rank):
  spec = "n" if rank == 1 else "(n, _)"
  f = lambda x: rows(jnp, x)
  auto = pj.jit(f)
  poly = pj.jit(f, polymorphic_shapes=[spec])
  masked = pj.mask(f, [spec])
  traced = jax.jit(lambda x, n: masked([x], {"n": n}))
  for n, count in CASES:
    x = _data(n, count, rank)
    want = rows(np, x)
    _close(auto(x), want)
    _close(poly(x), want)
    _close(unpad_outputs(*masked([nan_padded(x, 8)], {"n": n})), want)
    _close(unpad_outputs(*traced(nan_padded(x, 8), n)), want)


@pytest.mark.heavy
def test_every_bound_and_step_matches_numpy():
  # (each bound's sign and clipping, each step's sign and stride: 90 slices)
  starts, stops, steps = [None, -4, -1, 0, 3, 9], [None, -9, -2, 0, 5], [-3, -1, 2]
  slices = [slice(*s) for s in itertools.product(starts, stops, steps)]
  # 15 slices per function: one program each, which every count reuses (its
  # data-dependent size is traced). One function of all 90 took 2.5 times as
  # long to trace and compile as six of 15.
  groups = [slices[i:i + 15] for i in range(0, len(slices), 15)]
  for group in groups:
    f = pj.jit(lambda x, group=group: [x[x > 0][s] for s in group])
    for count in (0, 1, 3, 6):  # (empty, one, odd, full)
      x = _data(6, count)
      for s, got in zip(group, f(x), strict=True):
        want = x[x > 0][s]
        assert np.asarray(got).shape == want.shape, (s, count)
        np.testing.assert_array_equal(got, want, err_msg=str((s, count)))


def test_gradient_through_a_strided_selection():
  loss = lambda x: jnp.sum(x[x > 0][::2] ** 2)

  def reference(x):
    g = np.zeros_like(x)
    where = np.flatnonzero(x > 0)[::2]
    g[where] = 2 * x[where]
    return g

  grad = pj.jit(jax.grad(loss))
  masked = pj.mask(loss, ["n"])
  masked_grad = jax.jit(jax.grad(lambda x, n: masked([x], {"n": n})[0]))
  for n, count in CASES:
    x = _data(n, count)
    np.testing.assert_allclose(grad(x), reference(x))
    g = np.asarray(masked_grad(nan_padded(x, 8), n))
    np.testing.assert_allclose(g[:n], reference(x))
    assert np.all(g[n:] == 0)


def test_the_spelling_leaves_other_indexing_alone():
  # Static axes, symbolic sizes of the inputs, step 1 and array indices keep
  # JAX's own spelling (same results either way).
  f = pj.jit(lambda x: (x[::2], x[::-1], x[x > 0][1:], x[x > 0][jnp.array([0])]))
  x = _data(6, 3)
  for got, want in zip(f(x), (x[::2], x[::-1], x[x > 0][1:], x[x > 0][[0]]), strict=True):
    np.testing.assert_array_equal(got, want)
  with pytest.raises(Exception, match="slice step cannot be zero"):  # JAX's own error
    pj.jit(lambda x: x[x > 0][::0])(x)


def test_what_numpy_refuses_still_raises():
  x_empty = _data(6, 0)
  maximum = pj.jit(lambda x: jnp.max(x[x > 0][::2]))
  np.testing.assert_allclose(maximum(_data(6, 4)), np.max(_data(6, 4)[_data(6, 4) > 0][::2]))
  with pytest.raises(ValueError, match="zero-size array"):
    maximum(x_empty)
  with pytest.raises(ValueError, match="zero-size array"):
    pj.jit(lambda x: jnp.argmin(x[x > 0][::-1]))(x_empty)
  with pytest.raises(ValueError):
    pj.jit(lambda x: jax.lax.top_k(x[x > 0][::2], 2))(_data(6, 2))
  with pytest.raises(IndexError, match="index out of bounds"):
    pj.jit(lambda x: x[x > 0][::2][0])(x_empty)
  with pytest.raises(IndexError, match="index out of bounds"):
    pj.jit(lambda x: x[x > 0][::-1][-1])(x_empty)
  # Under traced sizes nothing can raise: NaN, as for jnp.min of a selection.
  masked = pj.mask(lambda x: jnp.max(x[x > 0][::2]), ["n"])
  out, _ = jax.jit(lambda x, n: masked([x], {"n": n}))(nan_padded(x_empty, 8), 6)
  assert np.isnan(out)
