"""Errors for JAX functions that need a size as a plain int (issue 26).

`lax.scan(..., length=x.shape[0])` and the derivative of `lax.reduce` with a
custom reducer need a Python int; with dynamic sizes polyjit's error names the
JAX function and what works instead, and the spellings it suggests work
(compared with JAX on the unpadded arrays, NaN in the padding).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj


def _padded(n, size=8):
  x = np.full(size, np.nan, np.float32)
  x[:n] = np.linspace(0.5, 1.5, n, dtype=np.float32)
  return x


def test_scan_with_a_size_as_length_names_scan_and_the_fix():
  def f(x):
    return lax.scan(lambda c, _: (c + 1.0, c), 0.0, None, length=x.shape[0])[1] * x

  with pytest.raises(pj.ShapeError) as err:
    pj.mask(f, ["n"])([_padded(5)], {"n": 5})
  message = str(err.value)
  assert "`lax.scan` needs `length=`" in message
  assert "lax.scan(f, init, jnp.arange(x.shape[0]))" in message
  assert "len(x)" not in message

  def fixed(x):  # the spelling the message suggests
    return lax.scan(lambda c, _: (c + 1.0, c), 0.0, jnp.arange(x.shape[0]))[1] * x

  m = pj.mask(fixed, ["n"])
  run = jax.jit(lambda xp, n: m([xp], {"n": n}))
  for n in (1, 3, 8):
    np.testing.assert_allclose(np.asarray(run(_padded(n), n))[:n], f(_padded(n)[:n]))


def test_grad_of_a_custom_reduce_names_reduce_and_the_fix():
  reducer = lambda a, b: a + b + a * b   # associative: (1 + a)(1 + b) - 1

  def f(x):
    return lax.reduce(x, np.float32(0.0), reducer, (0,))

  with pytest.raises(pj.ShapeError) as err:
    pj.mask(jax.grad(f), ["n"])([_padded(5)], {"n": 5})
  message = str(err.value)
  assert "`lax.reduce` with a custom reducer" in message
  assert "lax.scan(lambda c, v: (reducer(c, v), None), init, x)[0]" in message
  assert "len(x)" not in message

  def fold(x):  # the spelling the message suggests
    return lax.scan(lambda c, v: (reducer(c, v), None), np.float32(0.0), x)[0]

  m = pj.mask(jax.grad(fold), ["n"])
  run = jax.jit(lambda xp, n: m([xp], {"n": n}))
  for n in (1, 4, 8):
    g = np.asarray(run(_padded(n), n))
    np.testing.assert_allclose(g[:n], jax.grad(f)(_padded(n)[:n]), rtol=1e-5)
    assert np.all(np.isfinite(g[:n]))
