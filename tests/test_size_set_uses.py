"""A set of sizes shares one hash only if no later use can look a value up in it,
nor see the order its members iterate in.

`set_sites` proves from the source that a set of sizes is only counted,
unpacked or iterated. Uses it missed: a `finally`, `except` or `else` block
after the assignment, a loop's `else`, `s |= {5}` (a store, no load), a global
read by another function, and `eval`/`locals()`. Each made `5 in s` False (or
`len(s)` 2) at n == 5. Each is compared with `jax.jit` of the function under
`pj.jit` in both modes (exact) and under `jax.jit(pj.mask)` with a traced size
(exact or refused)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from harness import assert_pj_jit_matches_jax_jit

SEEN = None


def _finally(x):
  try:
    s = {x.shape[0], x.shape[0]}
  finally:
    hit = 5 in s
  return jnp.sum(x) * hit


def _except(x):
  try:
    s = {x.shape[0], x.shape[0]}
    raise ValueError
  except ValueError:
    hit = 5 in s
  return jnp.sum(x) * hit


def _try_else(x):
  try:
    s = {x.shape[0], x.shape[0]}
  except ValueError:
    s = set()
  else:
    hit = 5 in s
  return jnp.sum(x) * hit


def _for_else(x):
  for _ in range(1):
    s = {x.shape[0], x.shape[0]}
  else:
    hit = 5 in s
  return jnp.sum(x) * hit


def _augmented(x):
  s = {x.shape[0], x.shape[0]}
  s |= {5}
  return jnp.sum(x) * len(s)


def _global(x):
  global SEEN
  SEEN = {x.shape[0], x.shape[0]}
  return jnp.sum(x) * _five_seen()


def _five_seen():
  return 5 in SEEN


def _through_eval(x):
  s = {x.shape[0], x.shape[0]}
  return jnp.sum(x) * eval("5 in s")


def _through_locals(x):
  s = {x.shape[0], x.shape[0]}
  return jnp.sum(x) * (5 in locals()["s"])


FUNS = [_finally, _except, _try_else, _for_else, _augmented, _global, _through_eval,
        _through_locals]


@pytest.mark.parametrize("fun", FUNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_a_set_used_after_its_block_is_exact(fun, mode):
  assert_pj_jit_matches_jax_jit(fun, mode, (4, 5, 6, 5))


@pytest.mark.parametrize("fun", FUNS, ids=lambda f: f.__name__)
def test_a_set_used_after_its_block_is_exact_or_refused_with_traced_sizes(fun):
  g = jax.jit(lambda xp, n: pj.mask(fun, ["n"])([xp], {"n": n}))
  try:
    got = float(g(np.ones(8, np.float32), 5))
  except pj.MaskingError:
    return
  assert got == float(fun(np.ones(5, np.float32)))


# --- reads that see the set's iteration order --------------------------------------
# A set iterates in the order of its members' hashes ({3, 5} and {5, 3} both as
# 3, 5); with one shared hash it iterates in insertion order instead.

def _unpacked_pair(x, y):
  s = {x.shape[0], y.shape[0]}
  a, b = s
  return jnp.sum(x) * a - b


def _iterated(x, y):
  out = 0
  for a in {x.shape[0], y.shape[0]}:
    out = out * 10 + a
  return jnp.sum(x) * 0 + out


def _popped(x, y):
  s = set([x.shape[0], y.shape[0]])
  return jnp.sum(x) * 0 + s.pop()


def _listed(x, y):
  return jnp.sum(x) * 0 + jnp.asarray(list({x.shape[0], y.shape[0]}))[0]


ORDERED = [_unpacked_pair, _iterated, _popped, _listed]


@pytest.mark.parametrize("fun", ORDERED, ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_a_read_that_sees_the_order_is_exact(fun, mode):
  f = pj.jit(fun, polymorphic_shapes=None if mode == "auto" else ["n", "m"])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.FallbackWarning)
    for n, m in ((5, 3), (3, 5), (9, 2)):
      x, y = np.ones(n, np.float32), np.ones(m, np.float32)
      assert float(f(x, y)) == float(jax.jit(fun)(x, y)), (fun.__name__, n, m)


@pytest.mark.parametrize("fun", ORDERED, ids=lambda f: f.__name__)
def test_a_read_that_sees_the_order_is_exact_or_refused_with_traced_sizes(fun):
  g = jax.jit(lambda xp, yp, n, m: pj.mask(fun, ["n", "m"])([xp, yp], {"n": n, "m": m}))
  for n, m in ((5, 3), (3, 5)):
    try:
      got = float(g(np.ones(8, np.float32), np.ones(8, np.float32), n, m))
    except pj.MaskingError:
      continue
    assert got == float(fun(np.ones(n, np.float32), np.ones(m, np.float32)))
