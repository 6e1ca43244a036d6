"""A size used as a value (`a.shape[0]`, `jnp.size(a)`: JAX's `dim_as_value`)
is weakly typed in JAX, as a Python int is, so `f(a) + jnp.int8(1)` is int8.
The masked rule converted it with `lax.convert_element_type`, which gives a
strong type: from the second size on (the first runs at exact shapes) `pj.jit`
returned a strong int32 and the sum promoted to int32. Each result is compared
with `jax.jit` on the same input: value, dtype, weak type, and the dtype it
promotes an int8 (or float16) to; with x64 too."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

FUNS = {
    "a.shape[0]": lambda a: a.shape[0],
    "a.shape[0] + 1": lambda a: a.shape[0] + 1,
    "jnp.size(a)": lambda a: jnp.size(a),
    "a.size * 2": lambda a: a.size * 2,
    "a.shape[0] * 1.5": lambda a: a.shape[0] * 1.5,
    "(a.shape[0], a.sum())": lambda a: (a.shape[0], a.sum()),
}


def check(f, fun, x):
  got, want = jax.tree.leaves(f(x)), jax.tree.leaves(jax.jit(fun)(x))
  for g, w in zip(got, want, strict=True):
    g, w = jnp.asarray(g), jnp.asarray(w)
    assert (g.dtype, g.shape, g.weak_type) == (w.dtype, w.shape, w.weak_type), (g, w)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    small = jnp.float16(1) if jnp.issubdtype(w.dtype, jnp.floating) else jnp.int8(1)
    assert (g + small).dtype == (w + small).dtype, (g, w)


@pytest.mark.parametrize("name", list(FUNS))
def test_a_size_used_as_a_value_is_weakly_typed_at_every_size(name):
  fun = FUNS[name]
  f = pj.jit(fun)
  for n in (3, 5, 12):
    check(f, fun, np.arange(n, dtype=np.float32))


def test_a_size_used_as_a_value_is_weakly_typed_with_x64():
  fun = FUNS["a.shape[0] + 1"]
  with jax.enable_x64():
    f = pj.jit(fun)
    for n in (3, 5, 12):
      check(f, fun, np.arange(n, dtype=np.float64))
