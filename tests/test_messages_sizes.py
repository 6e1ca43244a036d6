"""Messages about sizes that say what works (issue 31, "Messages that do not help").

Each case printed advice that was reversed, internal or beside the point:
`lax.top_k` of a long-enough selection was refused (with its constraint
reversed), `abs()` of a size was blamed on unequal lengths, two selections'
sizes got "declare the axis fixed", a constant array sliced to a size did not
name `constraints=["n <= 16"]`, a selection inside `jax.checkpoint` was
"inside a loop body or a branch", and a string argument got XLA's raw error.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from polyjit import _jax as jc
from polyjit._masking.errors import trace_error

V = np.array([1., -2., 3., 4., -1.], np.float32)


def nan_padded(x, size=8):
  out = np.full(size, np.nan, np.float32)
  out[: x.shape[0]] = x
  return out


def top2(v):
  return lax.top_k(v[v > 0], 2)[0]


def test_top_k_of_a_long_enough_selection_runs():
  want = jax.jit(lambda v: lax.top_k(v, 2)[0])(V[V > 0])
  np.testing.assert_array_equal(pj.jit(top2)(V), want)
  masked = pj.mask(top2, ["n"])
  out, _ = masked([nan_padded(V)], {"n": 5})
  np.testing.assert_array_equal(out, want)
  out, _ = jax.jit(lambda x, n: masked([x], {"n": n}))(nan_padded(V), 5)
  np.testing.assert_array_equal(out, want)


def test_top_k_of_a_too_short_selection_raises_or_poisons():
  short = np.array([1., -2., -3., -4., -1.], np.float32)
  with pytest.raises(ValueError, match="too few elements"):
    pj.jit(top2)(short)
  masked = pj.mask(top2, ["n"])
  out, _ = jax.jit(lambda x, n: masked([x], {"n": n}))(nan_padded(short), 5)
  assert np.all(np.isnan(out))


def test_an_inconclusive_comparison_names_both_sides():
  error = jc.InconclusiveDimensionOperation(
      "Symbolic dimension comparison 'len(selection 1)' < '2' is inconclusive.")
  text = str(trace_error(error, "f"))
  # JAX asks `size < k` where True raises: the side the function needs is >= 2
  assert "len(selection 1) >= 2" in text and "len(selection 1) <= 2 - 1" in text


def gap(x, y):
  return jnp.sum(x) * abs(x.shape[0] - y.shape[0])


def test_abs_of_a_size_is_a_size_comparison():
  xs = [np.arange(1, 4, dtype=np.float32), np.ones(5, np.float32)]
  ys = [np.ones(4, np.float32), np.ones(2, np.float32)]
  want = [float(gap(x, y)) for x, y in zip(xs, ys)]
  got = pj.vmap(gap)(pj.Ragged.from_list(xs), pj.Ragged.from_list(ys))
  np.testing.assert_allclose(got, want)
  for x, y, w in zip(xs, ys, want):
    np.testing.assert_allclose(pj.jit(gap, polymorphic_shapes=["n", "m"])(x, y), w)
    masked = pj.mask(gap, ["n", "m"])
    args = [nan_padded(x), nan_padded(y)]
    env = {"n": x.shape[0], "m": y.shape[0]}
    try:   # concrete sizes: the side of `n - m >= 0` is a constraint, which
      got = masked(args, env)   # equal padded sizes may not satisfy
    except pj.ShapeError as e:
      assert "What to do" in str(e) and "pj.jit" in str(e)
    else:
      np.testing.assert_allclose(got, w)
    np.testing.assert_allclose(
        jax.jit(lambda a, b, n, m: masked([a, b], {"n": n, "m": m}))(*args, *env.values()), w)


def test_two_selections_say_select_once():
  with pytest.raises(pj.PolyjitError) as info:
    pj.jit(lambda v: v[v > 0] * jnp.arange(v[v > 0].shape[0]))(V)
  text = str(info.value)
  todo = text[text.index("What to do:"):]
  assert todo.startswith("What to do: select once and reuse the result")
  assert "declare the axis fixed" not in text


C16 = np.arange(16, dtype=np.float32)


def scaled(x):
  return x * jnp.asarray(C16)[:x.shape[0]]


def test_a_constant_sliced_to_a_size_names_its_constraint():
  with pytest.raises(pj.PolyjitError, match='constraints=\\["n <= 16"\\]'):
    pj.jit(scaled, polymorphic_shapes=["n"])(np.ones(5, np.float32))
  out = pj.jit(scaled, polymorphic_shapes=["n"], constraints=["n <= 16"])(np.ones(5, np.float32))
  np.testing.assert_array_equal(out, C16[:5])


def test_a_selection_inside_checkpoint_says_checkpoint():
  with pytest.raises(pj.MaskingError, match="jax.checkpoint") as info:
    pj.jit(lambda v: jax.checkpoint(lambda u: jnp.sum(u[u > 0]))(v))(V)
  assert "loop body" not in str(info.value)


def test_a_string_argument_is_named_as_jax_jit_names_it():
  with pytest.raises(TypeError, match="at path s") as info:
    pj.jit(lambda x, s: x * 2)(np.ones(3, np.float32), np.array(["a", "b"]))
  assert "static_argnums" in str(info.value)
