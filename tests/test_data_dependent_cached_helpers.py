"""Data-dependent sizes created inside functions JAX caches by avals (a
`jax.jit` helper): each selection gets a size of its own.

JAX replays a cached helper's jaxpr on its next call at the same avals, in
the same function or in another one traced later; a selection inside it
then repeated a size name (pj_dd0) that another selection had, and the two
read one count: a wrong sum, silently. polyjit traces such a function again
with JAX's caches missing (`data_dependent.trace_own_sizes`). Every case is
compared with NumPy on the unpadded input, with NaN in the padding.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit import _jax as jc

X = np.array([1., -2., 3., -4., -5., -6.], np.float32)


def padded(x, size=8):
  out = np.full(size, np.nan, np.float32)
  out[: x.shape[0]] = x
  return out


def twice_fn():
  """A fresh helper called twice at the same avals (case 1)."""
  positives = jax.jit(lambda x: x[x > 0])

  def f(x):
    a, b = positives(x), positives(-x)
    return jnp.sum(a), jnp.sum(b), a.shape[0] * 1.0, b.shape[0] * 1.0
  return f


def twice_ref(x):
  a, b = x[x > 0], (-x)[-x > 0]
  return a.sum(), b.sum(), float(a.shape[0]), float(b.shape[0])


def close(got, want):
  for g, w in zip(got, want, strict=True):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


def test_helper_twice_under_mask():
  f = twice_fn()
  outs, _ = pj.mask(f, ["n"])([padded(X)], {"n": 6})
  close(outs, twice_ref(X))
  masked = pj.mask(f, ["n"])
  run = jax.jit(lambda xp, n: masked([xp], {"n": n})[0])
  for n in (6, 3, 1):
    close(run(padded(X), n), twice_ref(X[:n]))


@pytest.mark.parametrize("shapes", [None, ["n"]])
def test_helper_twice_under_jit(shapes):
  f = twice_fn()
  jitted = pj.jit(f) if shapes is None else pj.jit(f, polymorphic_shapes=shapes)
  for n in (6, 5, 6, 2, 7):
    x = np.resize(X, n) * (1 + np.arange(n, dtype=np.float32))
    close(jitted(x), twice_ref(x))


def test_helper_twice_under_vmap_over_ragged():
  f = twice_fn()
  xs = [X, X[:3], -X[:4], X[:1]]
  outs = pj.vmap(f)(pj.Ragged.from_list(xs))
  for i, x in enumerate(xs):
    close([o[i] for o in outs], twice_ref(x))


def test_helper_returns_the_selections():
  positives = jax.jit(lambda x: x[x > 0])
  f = lambda x: (positives(x), positives(-x) * 2)
  a, b = pj.jit(f)(X)
  np.testing.assert_array_equal(a, X[X > 0])
  np.testing.assert_array_equal(b, (-X)[-X > 0] * 2)


def test_helper_cached_by_another_function():
  """Case 2: pj.jit traces f1 at the exact shape f32[6], and JAX caches the
  helper there with f1's size pj_dd0; f2 at the same shape makes a selection
  of its own (its pj_dd0) before or after calling the helper."""
  positives = jax.jit(lambda x: x[x > 0])
  f1 = lambda x: jnp.sum(positives(x))

  def f2(x):
    a = x[x < 0]
    b = positives(x)
    return jnp.sum(a), jnp.sum(b)

  def f3(x):  # the replayed helper first: its size is not this trace's
    b = positives(x)
    a = x[x < 0]
    return jnp.sum(b), jnp.sum(a)
  want = (X[X < 0].sum(), X[X > 0].sum())
  np.testing.assert_allclose(pj.jit(f1)(X), X[X > 0].sum())
  close(pj.jit(f2)(X), want)
  close(pj.jit(f3)(X), want[::-1])
  # Under pj.mask and pj.jit at symbolic shapes, with the cache filled by f1 there.
  np.testing.assert_allclose(pj.jit(f1, polymorphic_shapes=["n"])(X), X[X > 0].sum())
  close(pj.jit(f2, polymorphic_shapes=["n"])(X), want)
  pj.mask(f1, ["n"])([padded(X)], {"n": 6})
  for f, w in ((f2, want), (f3, want[::-1])):
    close(pj.mask(f, ["n"])([padded(X)], {"n": 6})[0], w)
    close(pj.vmap(f)(pj.Ragged.from_list([X, X[:3]])), [(a, b) for a, b in zip(
        w, (X[:3][X[:3] < 0].sum(), X[:3][X[:3] > 0].sum())[::1 if f is f2 else -1])])


def test_gradient_through_helper_twice():
  positives = jax.jit(lambda x: x[x > 0])
  loss = lambda x: jnp.sum(positives(x) ** 2) + 3 * jnp.sum(positives(-x))
  masked = pj.mask(loss, ["n"])
  g = jax.grad(lambda xp: masked([xp], {"n": 6})[0])(padded(X))
  want = np.where(X > 0, 2 * X, 0) + np.where(X < 0, -3.0, 0)
  np.testing.assert_allclose(g[:6], want)
  np.testing.assert_array_equal(g[6:], 0)


def test_no_uncached_retrace_without_a_replayed_helper(monkeypatch):
  """The retrace, which misses every JAX cache, only happens where a
  selection's size was replayed."""
  def never():
    raise AssertionError("an uncached retrace")
  monkeypatch.setattr(jc, "uncached_calls", never)
  helper = jax.jit(lambda x: x[x > 0])
  f = lambda x: (jnp.sum(x[x > 0]), jnp.sum(jnp.nonzero(x < 0)[0]), jnp.sum(helper(x)))
  want = (X[X > 0].sum(), np.nonzero(X < 0)[0].sum(), X[X > 0].sum())
  close(pj.mask(f, ["n"])([padded(X)], {"n": 6})[0], want)
  close(pj.jit(f)(X), want)


def test_a_cache_that_cannot_be_missed_refuses(monkeypatch):
  """Where JAX would replay the helper even in the uncached retrace, polyjit
  raises, naming the helper, rather than give both selections one size."""
  import contextlib

  @contextlib.contextmanager
  def still_cached():
    yield lambda: None
  monkeypatch.setattr(jc, "uncached_calls", still_cached)

  def positives_helper(x):
    return x[x > 0]
  positives = jax.jit(positives_helper)
  f = lambda x: (jnp.sum(positives(x)), jnp.sum(positives(-x)))
  with pytest.raises(pj.MaskingError, match="(?s)in `positives_helper`.*without jax.jit"):
    pj.mask(f, ["n"])([padded(X)], {"n": 6})


def test_a_replayed_selection_that_reaches_plain_jax_is_refused_with_advice():
  # (review 3) Functions at one exact shape share a jax.jit helper that
  # selects: an exact program may lower the helper's cached trace as plain
  # JAX, which cannot run a selection. Each call is exact or says what to do.
  pos = jax.jit(lambda x: x[x > 0])
  x = np.array([1., -2., 3., -4., -5., -6.], np.float32)
  f = lambda v: (jnp.sum(pos(v)), jnp.sum(pos(-v)))
  g = lambda v: jnp.sum(pos(v)) + jnp.sum(pos(v * 3))
  refused = 0
  for fun, want in ((f, (x[x > 0].sum(), (-x)[x < 0].sum())), (g, 4 * x[x > 0].sum()),
                    (f, (x[x > 0].sum(), (-x)[x < 0].sum()))):
    try:
      out = pj.jit(fun)(x)
    except pj.MaskingError as e:
      assert "without jax.jit" in str(e) and "size=k" in str(e)
      refused += 1
    else:
      np.testing.assert_allclose(out, want)
  assert refused < 3  # the first call of a fresh helper always traces exactly
