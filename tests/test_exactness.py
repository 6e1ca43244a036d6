"""Never a silent wrong answer, never a silent fallback (issue 10).

* Size comparisons in user code (`==`, `%`, `>`, between two dynamic sizes)
  give the unpadded program's result for every size, whether the sizes are
  concrete (`pj.jit`, `pj.mask` with ints) or traced (`jax.jit(pj.mask)`,
  `jax.vmap` over sizes, `pj.vmap` over a `pj.Ragged` mixing both sides), or
  raise a polyjit error at trace time.
* A zero-sized dynamic axis under `pj.jit` behaves exactly as under `jax.jit`.
* `None` leaves in argument and output pytrees pass through.
* JAX's errors from symbolic tracing come out as polyjit errors naming the
  user's line; an automatic-mode fallback is a `pj.FallbackWarning`.

Padding holds NaN everywhere, so a branch that reads it shows.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

P = 8  # padded size


def padded(x, size=P):
  out = np.full(size, np.nan, np.float32)
  out[:len(x)] = x
  return out


def example(n):
  return np.arange(1, n + 1, dtype=np.float32) / 4 + 0.5


def equal_one(x):
  return x[0] * 0 + 42.0 if x.shape[0] == 1 else jnp.sum(x)


def parity(x):
  return jnp.sum(x) * 2 if x.shape[0] % 2 == 0 else jnp.sum(x ** 2)


def greater(x):
  return jnp.sum(x[3:]) if x.shape[0] > 3 else -jnp.max(x)


def nested(x):
  if x.shape[0] >= 2:
    return jnp.sum(x[:2]) if x.shape[0] % 3 == 0 else jnp.prod(x[:2])
  return x[0]


BRANCHING = [equal_one, parity, greater, nested]
SIZES = [1, 2, 3, 4, 5, 6, P - 1, P]


def reference(f, sizes):
  return np.array([float(f(jnp.asarray(example(n)))) for n in sizes], np.float32)


@pytest.mark.parametrize("f", BRANCHING, ids=lambda f: f.__name__)
def test_comparisons_with_traced_sizes(f):
  want = reference(f, SIZES)
  ragged = pj.vmap(f)(pj.Ragged.from_list([example(n) for n in SIZES]))
  np.testing.assert_allclose(ragged, want, rtol=1e-6)

  masked = pj.mask(f, ["n"])
  jitted = jax.jit(masked)
  got = [jitted([padded(example(n))], {"n": n}) for n in SIZES]
  np.testing.assert_allclose(got, want, rtol=1e-6)

  data = padded(example(P))
  over_sizes = jax.vmap(masked, in_axes=(None, 0))([data], {"n": jnp.array(SIZES)})
  np.testing.assert_allclose(over_sizes, reference(f, SIZES), rtol=1e-6)


@pytest.mark.parametrize("f", BRANCHING, ids=lambda f: f.__name__)
def test_comparisons_with_concrete_sizes(f):
  want = reference(f, SIZES)
  auto, explicit = pj.jit(f), pj.jit(f, polymorphic_shapes=["n"])
  masked = pj.mask(f, ["n"])
  for fn in (auto, explicit):
    np.testing.assert_allclose([fn(example(n)) for n in SIZES], want, rtol=1e-6)
  np.testing.assert_allclose([masked([padded(example(n))], {"n": n}) for n in SIZES],
                             want, rtol=1e-6)
  # one program per side and bucket, never one per size
  assert pj.stats(explicit).compiles <= 4


def test_comparison_between_two_dynamic_sizes():
  def f(x, y):
    return jnp.dot(x, y) if x.shape[0] == y.shape[0] else jnp.sum(x) - jnp.sum(y)

  pairs = [(3, 3), (3, 5), (6, 6), (1, 2)]
  want = [float(f(jnp.asarray(example(a)), jnp.asarray(example(b)) * 2)) for a, b in pairs]
  masked = jax.jit(pj.mask(f, ["n", "m"]))
  got = [masked([padded(example(a)), padded(example(b) * 2)], {"n": a, "m": b})
         for a, b in pairs]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  jf = pj.jit(f)
  np.testing.assert_allclose([jf(example(a), example(b) * 2) for a, b in pairs], want,
                             rtol=1e-6)


def test_a_comparison_of_sizes_inside_jax_that_decides_the_result():
  # jnp.array_equal returns False when `np.shape(a1) != np.shape(a2)`, which
  # JAX answers for two size variables as "different": equal arrays of sizes
  # equal at run time must still compare equal (the function itself passed,
  # as well as called from a lambda).
  pairs = [(3, 3), (3, 5), (6, 6), (2, 1)]
  xs = [(example(a), example(b)) for a, b in pairs]
  want = [bool(np.array_equal(x, y)) for x, y in xs]
  assert want == [True, False, True, False]
  for f in (jnp.array_equal, lambda x, y: jnp.array_equal(x, y)):
    masked = jax.jit(pj.mask(f, ["n", "m"]))
    assert [bool(masked([padded(x), padded(y)], {"n": len(x), "m": len(y)}))
            for x, y in xs] == want
    assert [bool(pj.mask(f, ["n", "m"])([padded(x), padded(y)], {"n": len(x), "m": len(y)}))
            for x, y in xs] == want
    jf = pj.jit(f)
    assert [bool(jf(x, y)) for x, y in xs + xs] == want + want
    batch = pj.vmap(f)(pj.Ragged.from_list([x for x, _ in xs]),
                       pj.Ragged.from_list([y for _, y in xs]))
    assert np.asarray(batch).tolist() == want


def test_gradients_of_a_batch_mixing_both_sides_are_exact_and_finite():
  def f(x):
    return jnp.log(x[0]) * 3 if x.shape[0] == 1 else jnp.sum(jnp.sqrt(x))

  sizes = [1, 2, 3]
  batch = pj.Ragged.from_list([example(n) for n in sizes])
  data = np.asarray(batch.data).copy()
  for i, n in enumerate(sizes):
    data[i, n:] = np.nan
  grads = jax.grad(lambda d: pj.vmap(f)(pj.Ragged(d, batch.lengths)).sum())(data)
  assert np.all(np.isfinite(grads))
  for i, n in enumerate(sizes):
    np.testing.assert_allclose(grads[i, :n], jax.grad(f)(jnp.asarray(example(n))), rtol=1e-6)
    assert np.all(grads[i, n:] == 0)


def test_outputs_whose_shape_depends_on_a_comparison():
  def f(x):
    return x if x.shape[0] == 1 else x[1:]

  jf = pj.jit(f, polymorphic_shapes=["n"])  # concrete sizes: each side its own program
  for n in (1, 4, 1, 6):
    np.testing.assert_allclose(jf(example(n)), f(jnp.asarray(example(n))))
  with pytest.raises(pj.ShapeError, match="outputs depend on a size comparison"):
    jax.jit(pj.mask(f, ["n"]))([padded(example(3))], {"n": 3})


def test_a_comparison_hidden_in_a_jitted_helper_is_followed():
  # A trace that asks a size question has a symbolic scope of its own (issue
  # 22 §1, `_masking/scopes.py`): the helper is traced again for each side,
  # never replayed from JAX's cache.
  @jax.jit
  def helper(x):
    return x[0] * 0 + 42.0 if x.shape[0] == 1 else jnp.sum(x)

  f = lambda x: helper(x) * 2
  examples = [example(1), example(2)]
  out = pj.vmap(f)(pj.Ragged.from_list(examples))
  np.testing.assert_allclose(out, [f(x) for x in examples], rtol=1e-6)


def test_a_missing_lower_bound_is_added_for_concrete_sizes_and_explained_when_traced():
  f = lambda x: lax.top_k(x, 3)[0]
  masked = pj.mask(f, ["n"])
  np.testing.assert_allclose(masked([padded(example(5))], {"n": 5}), f(example(5)))
  with pytest.raises(pj.MaskingError, match="top_k") as info:
    jax.jit(masked)([padded(example(5))], {"n": 5})
  assert "constraints=['n >= 3']" in "".join(getattr(info.value, "__notes__", []))
  bounded = jax.jit(pj.mask(f, ["n"], constraints=["n >= 3"]))
  np.testing.assert_allclose(bounded([padded(example(5))], {"n": 5}), f(example(5)))


# --- length 0 -------------------------------------------------------------------

ZERO = {
    "diff": jnp.diff, "slice": lambda x: x[1:] * 2, "sum": jnp.sum, "max": jnp.max,
    "first": lambda x: x[0], "argmax": jnp.argmax, "median": jnp.median,
    "quantile": lambda x: jnp.quantile(x, 0.5), "cumsum": jnp.cumsum,
}


def _outcome(fn, x):
  try:
    return np.asarray(fn(x))
  except Exception as e:  # the same exception type as jax.jit's
    return type(e)


@pytest.mark.parametrize("name", sorted(ZERO))
@pytest.mark.parametrize("mode", ["automatic", "explicit"])
def test_length_zero_behaves_as_jax_jit(name, mode):
  f = ZERO[name]
  jf = pj.jit(f, **({"polymorphic_shapes": ["n"]} if mode == "explicit" else {}))
  jf(example(5))
  jf(example(9))  # a bucket and a template exist
  got, want = _outcome(jf, np.zeros(0, np.float32)), _outcome(jax.jit(f), np.zeros(0, np.float32))
  if isinstance(want, type):
    assert got is want
  else:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(jf(example(7)), f(jnp.asarray(example(7))), rtol=1e-6)


def test_length_zero_is_an_empty_example_and_below_zero_a_clear_error():
  # sizes 0..padded are in the contract (issue 33): an empty sum is 0, as in NumPy
  assert float(pj.mask(jnp.sum, ["n"])([padded(example(3))], {"n": 0})) == 0.0
  with pytest.raises(pj.ShapeError, match="between 0 and"):
    pj.mask(jnp.sum, ["n"])([padded(example(3))], {"n": -1})
  r = pj.Ragged.from_list([np.zeros(0, np.float32), example(3)])
  np.testing.assert_allclose(pj.vmap(jnp.sum)(r)[:2], [0.0, float(jnp.sum(example(3)))], rtol=1e-6)


# --- None leaves --------------------------------------------------------------------

def layer(params, x):
  y = x @ params["w"]
  if params["b"] is not None:
    y = y + params["b"]
  return {"y": jnp.sum(jnp.tanh(y), axis=0), "aux": None}


@pytest.mark.parametrize("kwargs", [{}, {"polymorphic_shapes": [None, "(n, _)"]}],
                         ids=["automatic", "explicit"])
def test_none_leaves_in_arguments_and_outputs(kwargs):
  params = {"w": np.full((3, 2), 0.5, np.float32), "b": None}
  jf = pj.jit(layer, **kwargs)
  for n in (5, 7, 9, 11, 13):
    x = np.linspace(-1, 1, 3 * n, dtype=np.float32).reshape(n, 3)
    out = jf(params, x)
    assert out["aux"] is None
    np.testing.assert_allclose(out["y"], layer(params, jnp.asarray(x))["y"], rtol=1e-5)
  assert pj.stats(jf).compiles <= 2  # 5..13 share the bucket 16 (+ the first exact call)


# --- errors and fallbacks -------------------------------------------------------------

@pytest.mark.parametrize("f, error, match", [
    (lambda x: sum(x[i] for i in range(len(x))), pj.ShapeError, "range\\(len\\(x\\)\\)"),
    (lambda x: sum(x[i] for i in range(x.shape[0])), pj.ShapeError, "fori_loop"),
    (lambda x: jnp.pad(x, 2, mode="reflect"), pj.MaskingError, "jnp.pad"),
], ids=["range-len", "python-loop", "pad-reflect"])
def test_symbolic_tracing_errors_are_polyjit_errors(f, error, match):
  masked = pj.mask(f, ["n"])
  for call in (masked, jax.jit(masked)):
    with pytest.raises(error, match=match) as info:
      call([padded(example(5))], {"n": 5})
    assert "test_exactness.py" in str(info.value)  # the user's line


def _svd_values(x):
  return jnp.linalg.svd(x.reshape(x.shape[0], 1))[1]


def test_fallback_warns_once_and_explains_itself():
  jf = pj.jit(_svd_values)
  with pytest.warns(pj.FallbackWarning, match="svd") as record:
    for n in (3, 4, 5, 6):
      jf(example(n))
  assert len([w for w in record if issubclass(w.category, pj.FallbackWarning)]) == 1
  assert record[0].filename == __file__  # attributed to the user's call
  text = pj.explain(jf)
  assert "see the log" not in text and "svd" in text


def test_fallback_error_and_silent():
  strict = pj.jit(_svd_values, fallback="error")
  strict(example(3))
  with pytest.raises(pj.MaskingError, match="svd"):
    strict(example(4))
  quiet = pj.jit(_svd_values, fallback="silent")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    for n in (3, 4):
      np.testing.assert_allclose(quiet(example(n)), _svd_values(jnp.asarray(example(n))),
                                 rtol=1e-6)
  with pytest.raises(ValueError, match="fallback"):
    pj.jit(_svd_values, fallback="sometimes")
