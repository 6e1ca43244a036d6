"""Size decisions that cannot be replayed, are missed, or go out of range.

One test per class of silent wrong answer the adversarial pass found, each run
through every way polyjit takes sizes: `pj.jit` (automatic and explicit),
`jax.jit(pj.mask)` (traced sizes), `jax.vmap` over sizes and `pj.vmap` over a
`pj.Ragged`, with NaN padding. A way may refuse with a `pj.PolyjitError` (a
hash needs a value that traced sizes do not have); it may never return a
wrong number.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

PADDED = 8


def _x(n, padded=None):
  x = np.arange(1, n + 1, dtype=np.float32)
  if padded is None:
    return x
  return np.concatenate([x, np.full(padded - n, np.nan, np.float32)])


def _ways(fun, sizes):
  """{way: [result per size] or the PolyjitError it raised} for `fun(x)`."""
  out = {}
  for name, make in (("auto", lambda: pj.jit(fun)),
                     ("explicit", lambda: pj.jit(fun, polymorphic_shapes=["n"]))):
    f = make()
    out[name] = [f(_x(n)) for n in sizes]
  masked = pj.mask(fun, ["n"])
  try:
    run = jax.jit(lambda xp, n: masked([xp], {"n": n}))
    out["mask_traced"] = [run(_x(n, PADDED), n) for n in sizes]
  except pj.PolyjitError as e:
    out["mask_traced"] = e
  try:
    batch = np.stack([_x(n, PADDED) for n in sizes])
    out["vmap_sizes"] = list(jax.vmap(lambda xp, n: masked([xp], {"n": n}))(
        batch, np.array(sizes, np.int32)))
  except pj.PolyjitError as e:
    out["vmap_sizes"] = e
  try:
    ragged = pj.Ragged(np.stack([_x(n, PADDED) for n in sizes]), np.array(sizes, np.int32))
    out["ragged"] = list(pj.vmap(fun)(ragged))
  except pj.PolyjitError as e:
    out["ragged"] = e
  return out


def _assert_right_or_refused(fun, sizes, traced_may_refuse=False):
  want = [fun(_x(n)) for n in sizes]
  for way, got in _ways(fun, sizes).items():
    if isinstance(got, pj.PolyjitError):
      assert traced_may_refuse and way not in ("auto", "explicit"), (way, got)
      assert "What to do" in str(got), got
      continue
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-6, err_msg=way)


# --- §1: no JAX cache carries a size decision between traces -----------------------

@jax.jit
def _helper(x):
  return x * 2.0 if x.shape[0] > 4 else x * 100.0


def test_a_jitted_helper_is_not_replayed_across_functions():
  f1 = pj.jit(lambda x: _helper(x).sum(), polymorphic_shapes=["n"])
  f2 = pj.jit(lambda x: _helper(x).sum(), polymorphic_shapes=["n"])
  assert float(f1(_x(2))) == 300.0
  assert float(f2(_x(10))) == 110.0
  # The masked form after pj.jit, traced sizes: both sides in one program.
  m = jax.jit(lambda xp, n: pj.mask(lambda x: _helper(x).sum(), ["n"])([xp], {"n": n}))
  assert float(m(_x(2, 16), 2)) == 300.0 and float(m(_x(10, 16), 10)) == 110.0


def _scan_body(c, x):
  return c + (x if c.shape[0] > 2 else -x), None


def test_cached_scan_cond_and_checkpoint_traces_follow_each_trace():
  def fun(x):
    a = lax.scan(_scan_body, jnp.zeros_like(x), jnp.stack([x, x]))[0].sum()
    b = lax.cond(x[0] > -1, lambda y: y.sum() * (3.0 if y.shape[0] == 3 else 1.0),
                 lambda y: y.sum(), x)
    c = jax.checkpoint(lambda y: y.sum() * (5.0 if y.shape[0] < 2 else 1.0))(x)
    return a + b + c
  _assert_right_or_refused(fun, [1, 2, 3, 5])


def test_a_static_argument_change_retraces_the_sizes():
  f = pj.jit(lambda x, k: _helper(x).sum() * k, static_argnums=1, polymorphic_shapes=["n", None])
  assert float(f(_x(2), 1)) == 300.0
  assert float(f(_x(10), 2)) == 220.0
  assert float(f(_x(3), 2)) == 1200.0


# --- §2: every question Python asks of a size ----------------------------------------

@pytest.mark.parametrize("spelling", [
    lambda x: 7.0 if x.shape[0] in {1, 2} else 1.0,
    lambda x: {1: 7.0}.get(x.shape[0], 1.0),
    lambda x: 7.0 if x.shape[0] == 1.0 else 1.0,
    lambda x: 7.0 if x.shape[0] != 2.0 else 1.0,
    lambda x: 1.0 if x.shape[0] - 1 else 7.0,
    lambda x: 7.0 if x.shape[0] in range(1, 3) else 1.0,
    lambda x: 7.0 if x.shape[0] == np.float32(1) else 1.0,
    lambda x: 7.0 if x.shape[0] == 1.5 else 1.0,
], ids=["set", "dict_get", "eq_float", "ne_float", "bool", "range", "eq_np_float",
        "eq_nonintegral"])
def test_size_questions_are_answered_or_refused(spelling):
  fun = lambda x: jnp.sum(x) + spelling(x)
  _assert_right_or_refused(fun, [1, 2, 3, 5], traced_may_refuse=True)


def test_a_size_compared_with_a_traced_value_is_a_traced_comparison():
  fun = lambda x: jnp.where(x.shape[0] == jnp.sum(x[:1]).astype(jnp.int32), 7.0, 1.0)
  _assert_right_or_refused(fun, [1, 2, 3])


@pytest.mark.parametrize("convert", [int, float, lambda n: list(range(n))])
def test_a_size_as_a_python_number_is_refused_with_the_line(convert):
  f = pj.jit(lambda x: x * len([convert(x.shape[0])]), polymorphic_shapes=["n"], fallback="error")
  with pytest.raises(pj.SizeValueError, match="(?s)test_size_decisions.py:.*What to do"):
    f(_x(3))


# --- §3: data-dependent sizes may be 0 ------------------------------------------------

NEG = np.array([-1.0, -2.0, -3.0], np.float32)
MIXED = np.array([1.0, -2.0, 3.0], np.float32)


def test_emptiness_tests_are_refused_not_decided_non_empty():
  for fun in (lambda x: (lambda y: -1.0 if y.shape[0] == 0 else y.sum())(x[x > 0]),
              lambda x: (lambda y: y.sum() / max(y.shape[0], 1))(x[x > 0]),
              lambda x: 1.0 if not x[x > 0].shape[0] else 2.0,
              lambda x: 1.0 if x[x > 0].size == 0 else 2.0):
    for f in (pj.jit(fun), pj.jit(fun, polymorphic_shapes=["n"])):
      with pytest.raises(pj.MaskingError, match="data-dependent"):
        f(NEG)
    with pytest.raises(pj.MaskingError, match="data-dependent"):
      jax.jit(lambda xp, n: pj.mask(fun, ["n"])([xp], {"n": n}))(NEG, 3)


def test_empty_selections_compute_or_raise_as_numpy():
  for x in (NEG, MIXED):
    y = x[x > 0]
    np.testing.assert_array_equal(pj.jit(lambda x: x[x > 0][:1])(x), y[:1])
    np.testing.assert_array_equal(pj.jit(lambda x: jnp.sort(x[x > 0])[-1:])(x), np.sort(y)[-1:])
    np.testing.assert_array_equal(pj.jit(lambda x: jnp.cumsum(x[x > 0])[:1])(x),
                                  np.cumsum(y)[:1])
    np.testing.assert_allclose(pj.jit(lambda x: jnp.max(x[x > 0], initial=-5.0))(x),
                               np.max(y, initial=-5.0))
    np.testing.assert_allclose(pj.jit(lambda x: jax.nn.logsumexp(x[x > 0]))(x),
                               jax.nn.logsumexp(y))
    np.testing.assert_allclose(pj.jit(lambda x: jax.nn.softmax(x[x > 0]))(x), jax.nn.softmax(y))
  np.testing.assert_allclose(pj.jit(lambda x: lax.top_k(x[x > 0], 1)[0])(MIXED), [3.0])
  with pytest.raises(ValueError):  # as JAX raises for top_k of an empty array
    pj.jit(lambda x: lax.top_k(x[x > 0], 1)[0])(NEG)
  with pytest.raises(ValueError, match="zero-size"):
    pj.jit(lambda x: jnp.max(x[x > 0]))(NEG)
  # Under traced sizes nothing can raise: never a plausible number.
  out, _ = jax.jit(lambda xp, n: pj.mask(lambda x: lax.top_k(x[x > 0], 1)[0], ["n"])(
      [xp], {"n": n}))(np.r_[NEG, np.nan], 3)
  assert np.isnan(np.asarray(out)).all()


# --- §4: traced sizes outside [0, padded] ---------------------------------------------

def test_traced_sizes_out_of_range_poison_every_output():
  masked = pj.mask(lambda x: (jnp.sum(x), jnp.argmax(x), x.shape[0] > 2), ["n"])
  run = jax.jit(lambda xp, n: masked([xp], {"n": n}))
  for n in (0, -3, 9, 100):
    total, arg, flag = run(_x(8, 8), n)
    assert np.isnan(total), n
    assert int(arg) == np.iinfo(np.int32).min and not bool(flag)
  total, arg, _ = run(_x(8, 8), 8)
  assert float(total) == 36.0 and int(arg) == 7
  means = jax.vmap(lambda xp, n: pj.mask(jnp.mean, ["n"])([xp], {"n": n}))(
      np.stack([_x(8, 8)] * 2), np.array([3, 12], np.int32))
  assert float(means[0]) == 2.0 and np.isnan(means[1])
  r = jax.jit(lambda d, l: pj.vmap(jnp.sum)(pj.Ragged(d, l)))(
      np.stack([_x(8, 8)] * 2), np.array([2, 11], np.int32))
  assert float(r[0]) == 3.0 and np.isnan(r[1])


def test_traced_sizes_out_of_range_raise_when_checking():
  run = jax.jit(lambda xp, n: pj.mask(jnp.sum, ["n"])([xp], {"n": n}))
  with pj.verify():
    with pytest.raises(Exception, match="(?s)SizeRangeError.*outside \\[0, padded size\\]"):
      jax.block_until_ready(run(_x(8, 8), 9))
  # (read when a program is traced: a fresh jax.jit outside the block poisons)
  run = jax.jit(lambda xp, n: pj.mask(jnp.sum, ["n"])([xp], {"n": n}))
  assert np.isnan(run(_x(8, 8), 9))


# --- §6: filter_jit's static outputs per variant --------------------------------------

def test_filter_jit_static_outputs_follow_the_sizes():
  fj = pj.filter_jit(lambda x: (x.sum(), x.shape[0] > 4, "big" if x.shape[0] > 4 else "small"))
  got = [fj(_x(n))[1:] for n in (1, 2, 5, 1, 7, 3)]
  assert got == [(n > 4, "big" if n > 4 else "small") for n in (1, 2, 5, 1, 7, 3)]


# --- §7: the checking mode -------------------------------------------------------------

def test_verify_catches_what_no_hook_sees():
  def sneaky(x):  # the type of a symbolic size: no hook sees `type()`
    return x.sum() * (1.0 if type(x.shape[0]) is int else 2.0)
  f = pj.jit(sneaky, polymorphic_shapes=["n"])
  assert float(f(_x(3))) == 12.0   # wrong, silently: what the checking mode is for
  g = pj.jit(sneaky, polymorphic_shapes=["n"])
  with pj.verify(), pytest.raises(pj.VerificationError, match="sneaky.*differs"):
    g(_x(3))
  with pj.verify(), pytest.raises(pj.VerificationError, match="differs"):
    pj.mask(sneaky, ["n"])([_x(3, 8)], {"n": 3})
  with pj.verify():  # right results pass, pytrees and several calls included
    h = pj.jit(lambda x: {"s": jnp.cumsum(x), "m": jnp.mean(x)})
    for n in (2, 5, 3):
      h(_x(n))


def test_verify_from_the_environment():
  code = ("import numpy as np, polyjit as pj\n"
          "f = pj.jit(lambda x: x.sum() * (1.0 if type(x.shape[0]) is int else 2.0),"
          " polymorphic_shapes=['n'])\n"
          "try:\n  f(np.ones(3, np.float32))\nexcept pj.VerificationError:\n  print('caught')\n")
  env = dict(os.environ, POLYJIT_VERIFY="1", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
  assert "caught" in out.stdout, out.stderr


# --- §8: per-size variants warn ----------------------------------------------------------

def test_variants_that_grow_with_the_sizes_warn_once():
  f = pj.jit(lambda x: x.sum() * (2.0 if x.shape[0] in range(1, 1000) else 1.0),
             polymorphic_shapes=["n"])
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for n in range(1, 13):
      f(_x(n))
  grow = [w for w in caught if issubclass(w.category, pj.FallbackWarning)
          and "its own trace" in str(w.message)]
  assert len(grow) == 1, [str(w.message) for w in caught]
