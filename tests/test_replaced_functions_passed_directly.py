"""A JAX function polyjit replaces while tracing (`polyjit/_spellings/`), passed
to `pj.jit` itself (`pj.jit(jnp.unique)`), runs exactly like the same function
called inside a lambda (`pj.jit(lambda v: jnp.unique(v))`): the replacement is
keyed by JAX's function object and put at its module sites, which the object
passed in never goes through (`_jax.as_called_by_name`). Each row is compared
with the function run eagerly on the unpadded input, over sizes that share a
bucket and sizes that do not. (A function held in a variable and called
through it, `f = jnp.unique; pj.jit(lambda v: f(v))`, is not reached by
either: it is traced as JAX's own.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

SIZES = (5, 9, 1)


def data(n, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(0, 4, size=n).astype(np.float32)


CASES = {  # name: (the function passed, a lambda calling it by name, its arguments at size n)
    "unique": (jnp.unique, lambda v: jnp.unique(v), lambda n: (data(n),)),
    "nonzero": (jnp.nonzero, lambda v: jnp.nonzero(v), lambda n: (data(n),)),
    "extract": (jnp.extract, lambda c, v: jnp.extract(c, v), lambda n: (data(n) > 1, data(n, 1))),
    "compress": (jnp.compress, lambda c, v: jnp.compress(c, v),
                 lambda n: (data(n) > 1, data(n, 1))),
    "searchsorted": (jnp.searchsorted, lambda a, v: jnp.searchsorted(a, v),
                     lambda n: (np.sort(data(n)), np.float32(1.5))),
}


def check(got, want, what):
  got_leaves, got_tree = jax.tree.flatten(got)
  want_leaves, want_tree = jax.tree.flatten(want)
  assert got_tree == want_tree, what
  for g, w in zip(got_leaves, want_leaves, strict=True):
    g, w = jnp.asarray(g), jnp.asarray(w)
    assert (g.dtype, g.shape) == (w.dtype, w.shape), (what, g, w)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=what)


# (a function polyjit cannot trace would still give the right answer, compiled
# per shape with a FallbackWarning: an error here)
@pytest.mark.filterwarnings("error::polyjit.FallbackWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_a_replaced_function_passed_itself_runs_like_a_lambda_calling_it(name):
  fun, by_name, make = CASES[name]
  direct, wrapped = pj.jit(fun), pj.jit(by_name)
  assert direct.__name__ == fun.__name__
  for n in SIZES:
    args = make(n)
    want = fun(*args)  # eager JAX on the unpadded input
    check(direct(*args), want, f"pj.jit({name}) n={n}")
    check(wrapped(*args), want, f"pj.jit(lambda: {name}) n={n}")


def test_a_replaced_function_passed_to_mask_runs_like_a_lambda_calling_it():
  a = np.array([0.5, 1., 1.5, 2., 3., np.nan, np.inf], np.float32)  # NaN/inf: padding
  v = np.float32(1.7)
  want = jnp.searchsorted(a[:5], v)  # eager JAX on the unpadded input
  for fun in (jnp.searchsorted, lambda a, v: jnp.searchsorted(a, v)):
    masked = pj.mask(fun, ["n", None])
    for run in (lambda a, n: masked([a, v], {"n": n}), jax.jit(lambda a, n: masked([a, v], {"n": n}))):
      got = run(a, 5)
      assert got.dtype == want.dtype and int(got) == int(want), (fun, got, want)
