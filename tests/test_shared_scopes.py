"""Symbolic scopes shared by traces that ask no size question (`_masking/scopes.py`).

The class of wrong answers they could open: a JAX trace cache (a `jax.jit`
helper) holding a trace made under one answer to a size comparison, replayed
in another trace that never records it. The design rules it out by never
answering a size question in a shared scope; these tests try to make one
reach a shared cache anyway, from each direction.
"""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from polyjit import _jax as jc
from polyjit._masking import scopes


def example(n, seed=0):
  return np.random.default_rng(seed + n).standard_normal(n).astype(np.float32)


def padded(x, size=8, fill=np.nan):
  out = np.full(size, fill, np.float32)
  out[: x.shape[0]] = x
  return out


def scope_of(masked, *args):
  traced = masked.trace(args)
  dim = next(d for a in traced.in_avals for d in a.shape if jc.is_symbolic_dim(d))
  return traced, jc.dim_scope(dim)


def test_traces_that_ask_nothing_share_a_scope():
  f = pj.mask(lambda x: jnp.sum(jnp.sin(x)), ["n"])
  g = pj.mask(lambda x: jnp.cumsum(x) * 2, ["n"])
  tf, sf = scope_of(f, padded(example(3)))
  tg, sg = scope_of(g, padded(example(3)))
  assert tf.shared_scope and tg.shared_scope
  assert sf is sg


def test_a_trace_that_asks_leaves_the_shared_scope_and_is_exact_on_both_sides():
  def f(x):
    return jnp.sum(x) if x.shape[0] > 3 else jnp.prod(x)

  masked = pj.mask(f, ["n"])
  traced, scope = scope_of(masked, padded(example(5)))
  assert not traced.shared_scope
  assert scope is not scope_of(pj.mask(jnp.sum, ["n"]), padded(example(2)))[1]
  for n in (2, 5):
    out = jax.jit(masked)([padded(example(n))], {"n": n})
    np.testing.assert_allclose(out, f(jnp.asarray(example(n))), rtol=1e-6)


def test_a_helper_that_asks_is_never_replayed_across_functions():
  # `helper` asks its question inside jax.jit; if any trace left its answer in
  # JAX's cache for the shared scope, a later function calling it would take
  # that side for every size.
  @jax.jit
  def helper(x):
    return jnp.sum(x) * 0 + 42.0 if x.shape[0] == 1 else jnp.sum(x)

  clean = pj.jit(lambda x: jnp.sum(x * 3), polymorphic_shapes=["n"])
  first = pj.jit(lambda x: helper(x) * 2, polymorphic_shapes=["n"])
  second = pj.jit(lambda x: helper(x) + 1, polymorphic_shapes=["n"])
  for n in (1, 3, 1, 4):
    np.testing.assert_allclose(clean(example(n)), np.sum(example(n) * 3), rtol=1e-5)
    np.testing.assert_allclose(first(example(n)), helper(example(n)) * 2, rtol=1e-6)
    np.testing.assert_allclose(second(example(n)), helper(example(n)) + 1, rtol=1e-6)
  ragged = pj.Ragged.from_list([example(1), example(3)])
  out = pj.vmap(lambda x: helper(x) - 1)(ragged)
  np.testing.assert_allclose(out, [helper(example(1)) - 1, helper(example(3)) - 1], rtol=1e-6)


def test_user_code_catching_exceptions_does_not_keep_the_shared_scope():
  def f(x):
    try:
      long = x.shape[0] > 3
    except Exception:  # what leaves the shared scope is not an Exception
      long = False
    return jnp.sum(x) if long else -jnp.sum(x)

  masked = jax.jit(pj.mask(f, ["n"]))
  for n in (2, 5):
    np.testing.assert_allclose(masked([padded(example(n))], {"n": n}),
                               f(jnp.asarray(example(n))), rtol=1e-6)


def test_a_size_question_in_a_custom_jvp_rule_is_refused_not_answered():
  @jax.custom_jvp
  def scaled(x):
    return x * 2.0

  @scaled.defjvp
  def scaled_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    factor = 1.0 if x.shape[0] == 1 else 2.0  # JAX alone would answer False
    return scaled(x), t * factor

  masked = pj.mask(lambda x: jnp.sum(scaled(x)), ["n"])
  np.testing.assert_allclose(masked([padded(example(3))], {"n": 3}), 2 * example(3).sum(),
                             rtol=1e-6)
  with pytest.raises(pj.MaskingError, match="custom_jvp or custom_vjp rule"):
    jax.grad(lambda x: masked([x], {"n": 3}))(padded(example(3), fill=0.0))


def test_a_trace_with_data_dependent_sizes_has_a_scope_of_its_own():
  masked = pj.mask(lambda x: jnp.sum(pj.nonzero(x > 0)[0] * 1.0), ["n"])
  traced, scope = scope_of(masked, padded(example(4)))
  assert traced.size_names and not traced.shared_scope
  _, other = scope_of(pj.mask(lambda x: jnp.sum(x * 5), ["n"]), padded(example(4)))
  assert other is not scope


positives = jax.jit(lambda x: x[x > 0])


def _asks(x):  # a size question after the selection: the trace leaves the shared scope
  s = jnp.sum(positives(x))
  return s if x.shape[0] > 3 else 2 * s


def _guard(x):  # no question of the user's: lax.top_k needs the guard n >= 3
  return jnp.sum(positives(x)) + jnp.sum(lax.top_k(x, 3)[0])


def _raises(x):
  positives(x)
  raise ValueError("while tracing")


@pytest.mark.parametrize("first", [_asks, _guard, _raises], ids=["asks", "guard", "raises"])
def test_an_abandoned_trace_leaves_no_data_dependent_size_to_a_later_one(first):
  # Found by review: the abandoned trace's cached `positives` (size pj_dd0) stayed
  # in the shared scope, and the next function's own selection, also pj_dd0,
  # took its size from it.
  def second(x):
    return jnp.sum(x[x < 0]), jnp.sum(positives(x))

  x = np.array([1., -2., 3., -4., -5., -6.], np.float32)
  try:
    pj.mask(first, ["n"])([padded(x)], {"n": 6})
  except (ValueError, pj.MaskingError):
    pass
  out, _ = pj.mask(second, ["n"])([padded(x)], {"n": 6})
  np.testing.assert_allclose(out, [x[x < 0].sum(), x[x > 0].sum()])
  ragged = pj.Ragged.from_list([x, -x[:4]])
  try:
    pj.vmap(first)(ragged)
  except (ValueError, pj.MaskingError):
    pass
  sums = pj.vmap(second)(ragged)
  want = [(e[e < 0].sum(), e[e > 0].sum()) for e in (x, -x[:4])]
  np.testing.assert_allclose(np.stack(sums, 1), want)


def test_a_lent_scope_serves_one_trace_at_a_time():
  a = scopes.lend(("n >= 7",))
  b = scopes.lend(("n >= 7",))
  assert a is not b
  scopes.give_back(a, ("n >= 7",))
  assert scopes.lend(("n >= 7",)) is a


def test_concurrent_traces_are_exact():
  def f(x):
    return jnp.sum(x) if x.shape[0] % 2 == 0 else jnp.max(x)

  errors = []

  def work(seed):
    try:
      for n in (2, 3, 4, 5):
        fn = pj.jit(lambda x: f(x) + seed, polymorphic_shapes=["n"])
        np.testing.assert_allclose(fn(example(n, seed)), f(jnp.asarray(example(n, seed))) + seed,
                                   rtol=1e-6)
    except BaseException as e:  # noqa: BLE001 (reported below)
      errors.append(e)

  threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors
