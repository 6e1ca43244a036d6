"""pj.jit / pj.filter_jit / pj.vmap as drop-ins for what jax.jit accepts (issue 26).

Each case runs the same function under `jax.jit` and under polyjit and compares
values, shapes and dtypes: typed PRNG keys (as arguments, in `eval_shape`, as
outputs along a dynamic axis, in a `pj.Ragged`), float0 outputs,
`jax.disable_jit()`, every `jax.jit` keyword, `pj.Padded` under
transformations, and keyword array arguments in explicit mode.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

KEY = jax.random.key(0)


def _same(actual, expected):
  a_leaves, a_tree = jax.tree.flatten(actual)
  e_leaves, e_tree = jax.tree.flatten(expected)
  assert a_tree == e_tree
  for a, e in zip(a_leaves, e_leaves, strict=True):
    assert a.shape == e.shape and a.dtype == e.dtype, (a, e)
    if isinstance(e, jax.ShapeDtypeStruct):
      continue
    if jax.dtypes.issubdtype(e.dtype, jax.dtypes.prng_key):
      a, e = jax.random.key_data(a), jax.random.key_data(e)
    if e.dtype != jax.dtypes.float0:
      np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-6)


@pytest.mark.parametrize("mode", ["auto", "explicit", "filter"])
def test_typed_keys(mode):
  def f(k, x):  # a key output along the dynamic axis, a used key, an unused one
    return jax.random.split(k, x.shape[0]), x + jax.random.normal(k, x.shape)

  if mode == "filter":
    g = pj.filter_jit(f)
  else:
    g = pj.jit(f, polymorphic_shapes=None if mode == "auto" else [None, "n"])
  for n in (3, 5, 6):
    x = jnp.arange(float(n))
    _same(g(KEY, x), jax.jit(f)(KEY, x))
  if mode != "filter":
    _same(g.eval_shape(KEY, x), jax.eval_shape(f, KEY, x))


def test_typed_key_ragged_outputs():
  r = pj.Ragged.from_list([jnp.ones(3), jnp.ones(5)])
  keys = pj.vmap(lambda k, x: jax.random.split(k, x.shape[0]), in_axes=(None, 0))(KEY, r)
  out = keys.to_list()
  for n, k in zip((3, 5), out, strict=True):
    _same(k, jax.random.split(KEY, n))


def test_float0_outputs():
  f = jax.grad(lambda x, i: jnp.sum(x * i), argnums=(0, 1), allow_int=True)
  g = pj.jit(f, polymorphic_shapes=["n", "n"])
  for n in (3, 5):
    args = (jnp.arange(float(n)), jnp.arange(n))
    _same(g(*args), jax.jit(f)(*args))


@pytest.mark.parametrize("wrap", [pj.jit, pj.filter_jit])
def test_disable_jit_runs_eagerly(wrap):
  seen = []

  def f(x):
    seen.append(type(x))  # eager: a concrete array, not a tracer
    return jnp.cumsum(x) / x.shape[0]

  g = wrap(f)
  x = jnp.arange(5.0)
  with jax.disable_jit():
    out = g(x)
  assert seen and not issubclass(seen[-1], jax.core.Tracer)
  _same(out, jnp.cumsum(x) / 5)


def test_jit_keywords():
  x = jnp.arange(5.0)
  # static_argnames given positionally (and static_argnums given by keyword)
  f = lambda x, k: x * jnp.ones(k).sum()  # noqa: E731
  _same(pj.jit(f, static_argnames="k")(x, 3), x * 3)
  _same(pj.jit(f, static_argnums=1)(x, k=3), x * 3)
  # a function as a static argument, by name or position
  act = lambda x, act: act(x)  # noqa: E731
  _same(pj.jit(act, static_argnames="act")(x, act=jnp.tanh), jnp.tanh(x))
  _same(pj.jit(act, static_argnames="act")(x, jnp.sin), jnp.sin(x))
  assert pj.jit(act, static_argnames="act").static_argnums == (1,)
  # donation by name, positional or keyword
  g = pj.jit(lambda x, y: x * y, donate_argnames="y")
  assert g.donate_argnums == (1,)
  _same(g(x, jnp.arange(5.0)), x * x)
  _same(g(x, y=jnp.arange(5.0)), x * x)
  _same(pj.jit(lambda x, y: x * 2, keep_unused=True, inline=True)(x, x), 2 * x)
  with pytest.raises(TypeError, match="device= or backend="):
    pj.jit(lambda x: x, device=jax.devices()[0])
  with pytest.raises(TypeError, match="compiler_options="):
    pj.jit(lambda x: x, compiler_options={"xla_cpu_enable_fast_math": True})


def test_padded_under_transformations():
  f = pj.jit(lambda x: jnp.sum(x ** 2))
  data = jnp.array([1.0, 2.0, 3.0, np.nan, np.inf])
  p = pj.Padded(data, (3,))
  _same(jax.jit(f)(p), jnp.float32(14.0))
  grad = jax.grad(f)(p)
  assert isinstance(grad, pj.Padded) and grad.shape == (3,)
  _same(grad.data, jnp.array([2.0, 4.0, 6.0, 0.0, 0.0]))


def test_keyword_arrays_in_explicit_mode_say_they_are_fixed():
  g = pj.jit(lambda x, *, w: x * w, polymorphic_shapes=["n"])
  with pytest.raises(pj.MaskingError) as info:
    g(jnp.arange(5.0), w=jnp.ones(5))
  notes = "\n".join(getattr(info.value, "__notes__", []))
  assert "keyword array arguments (w)" in notes and "positionally" in notes
  # a fixed keyword array works
  h = pj.jit(lambda x, *, w: x * w[0], polymorphic_shapes=["n"])
  _same(h(jnp.arange(5.0), w=jnp.full(2, 3.0)), jnp.arange(5.0) * 3)


def test_filter_jit_with_partial():  # keywords reach pj.jit through filter_jit
  g = pj.filter_jit(functools.partial(lambda k, x: x + jax.random.uniform(k), KEY))
  _same(g(jnp.arange(4.0)), jnp.arange(4.0) + jax.random.uniform(KEY))


def test_hessian_of_a_masked_function_in_both_spellings():
  # (forward mode of pj.mask: tests/test_forward_mode.py)
  f = lambda x: jnp.sum(jnp.sin(x) ** 2)  # noqa: E731
  m = pj.mask(f, ["n"])
  x = jnp.concatenate([jnp.arange(5.0), jnp.array([np.nan, np.inf, 0.0])])
  expected = jax.hessian(f)(x[:5])
  fwd = jax.hessian(lambda x: m([x], {"n": 5}))(x)
  np.testing.assert_allclose(fwd[:5, :5], expected, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(fwd[5:]) == 0) and np.all(np.asarray(fwd[:, 5:]) == 0)
  hess = jax.jacrev(jax.jacrev(lambda x: m([x], {"n": 5})))(x)
  np.testing.assert_allclose(hess[:5, :5], expected, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(hess[5:]) == 0) and np.all(np.asarray(hess[:, 5:]) == 0)
  # and forward mode inside the masked function works
  inner = pj.mask(jax.hessian(f), ["n"])([x], {"n": 5})
  np.testing.assert_allclose(inner[:5, :5], expected, rtol=1e-5, atol=1e-6)


# The hang of issue 26 (a batched Cholesky Hessian): tests/test_lapack_order.py.
