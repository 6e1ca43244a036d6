"""`jnp.diag(x, k)` / `jnp.diagonal(x, offset)` with traced sizes (issue 26).

JAX sizes an offset diagonal with Python's `max(0, n - k)`, a size comparison
whose two sides had different symbolic shapes, so `jax.jit(pj.mask(f))` and
`pj.vmap` raised a ShapeError. polyjit swaps in the same computation with a
symbolic size (`_spellings.diagonal`). Each case: NaN in the padding, compared
with JAX on the unpadded arrays, at several sizes in one program, and the
gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

PADDED = 8
FUNS = {
    "diag_k1": lambda x: jnp.diag(jnp.outer(x, x), k=1),
    "diag_k-1": lambda x: jnp.diag(jnp.outer(x, jnp.cos(x)), k=-1),
    "diagonal_offset-1": lambda x: jnp.diagonal(jnp.outer(x, jnp.sin(x)), offset=-1),
    "diagonal_offset3": lambda x: jnp.outer(x, x + 1).diagonal(offset=3),
    "diag_k-2_sum": lambda x: jnp.sum(jnp.diag(jnp.outer(x, x), k=-2)) * jnp.ones(1),
}


def _padded(n):
  x = np.full(PADDED, np.nan, np.float32)
  x[:n] = np.arange(1, n + 1, dtype=np.float32) / 3
  return x


@pytest.mark.parametrize("name", list(FUNS))
def test_offset_diagonal_with_traced_sizes(name):
  f = FUNS[name]
  m = pj.mask(f, ["n"])
  run = jax.jit(lambda xp, n: m([xp], {"n": n}))
  for n in (1, 2, 3, 5, 8):
    expected = np.asarray(jax.jit(f)(_padded(n)[:n]))
    out = np.asarray(run(_padded(n), n))
    got = out[:expected.shape[0]]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("name", list(FUNS))
def test_offset_diagonal_under_pj_vmap_and_pj_jit(name):
  f = FUNS[name]
  sizes = (2, 5, 1, 8)
  data = np.stack([_padded(n) for n in sizes])
  res = pj.vmap(f)(pj.Ragged(data, np.array(sizes, np.int32)))
  outs = res.to_list() if isinstance(res, pj.Ragged) else list(np.asarray(res))
  for out, n in zip(outs, sizes, strict=True):
    expected = jax.jit(f)(_padded(n)[:n])
    assert np.shape(out) == expected.shape
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
    jitted = pj.jit(f)(_padded(n)[:n])
    assert jitted.shape == expected.shape and jitted.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(jitted), expected, rtol=1e-6)


def test_offset_diagonal_gradient_with_traced_sizes():
  loss = lambda x: jnp.sum(jnp.diag(jnp.outer(x, jnp.tanh(x)), k=1) ** 2)
  m = pj.mask(loss, ["n"])
  grad = jax.jit(jax.grad(lambda xp, n: m([xp], {"n": n})))
  for n in (1, 4, 7):
    g = np.asarray(grad(_padded(n), n))
    np.testing.assert_allclose(g[:n], jax.grad(loss)(_padded(n)[:n]), rtol=1e-5, atol=1e-7)
    assert np.all(g[n:] == 0)


def test_offset_diagonal_of_a_rectangle():
  f = lambda x, y: jnp.diagonal(jnp.outer(x, y), offset=-1)
  m = pj.mask(f, ["n", "m"])
  run = jax.jit(lambda xp, yp, n, k: m([xp, yp], {"n": n, "m": k}))
  for n, k in ((5, 3), (2, 6), (1, 4), (7, 7)):
    x, y = _padded(n), _padded(k) * 2
    expected = np.asarray(jax.jit(f)(x[:n], y[:k]))
    out = np.asarray(run(x, y, n, k))
    np.testing.assert_allclose(out[:expected.shape[0]], expected, rtol=1e-6)
