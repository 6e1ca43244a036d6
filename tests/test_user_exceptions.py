"""User code that catches polyjit's signals cannot steer a trace (issue 31).

polyjit steers a trace by raising into user code (`_masking/signals.py`): it
leaves a shared scope at the first size question, settles comparisons as
constraints, refuses `int(n)`. A user's bare `except:`, `except BaseException`,
`contextlib.suppress`, an `__exit__` returning True, a `return` in `finally`,
or a generator could stop the signal and let the trace go on along a side
polyjit never chose: -100.0 where jax.jit gives 0.645. Each case here must give
jax.jit's value or a polyjit error, under `pj.jit` (explicit specs and
automatic once the axis is dynamic), `pj.mask` (concrete and traced sizes) and
`pj.vmap` over a `pj.Ragged`, with NaN in every padding.
"""
import contextlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

P = 8
SIZES = (2, 5)


def example(n):
  return (np.arange(n, dtype=np.float32) + 1.0) * 0.5


def nan_padded(x):
  out = np.full(P, np.nan, np.float32)
  out[: x.shape[0]] = x
  return out


# --- the functions: each catches what its size question raises -------------------

def bare_except(x):
  try:
    y = x * 2.0 if x.shape[0] > 3 else x
  except:  # noqa: E722  (the case under test)
    return jnp.float32(-100.0)
  return jnp.mean(jnp.sin(y))


def except_base(x):
  try:
    y = x * 2.0 if x.shape[0] > 3 else x
  except BaseException:
    return jnp.float32(-100.0)
  return jnp.mean(jnp.sin(y))


def suppress_base(x):
  y = x
  with contextlib.suppress(BaseException):
    y = x * 2.0 if x.shape[0] > 3 else x
  return jnp.mean(jnp.sin(y))


class Swallow:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return True


def exit_returns_true(x):
  y = x
  with Swallow():
    y = x * 2.0 if x.shape[0] > 3 else x
  return jnp.mean(jnp.sin(y))


def _finally_returns(x):
  y = x
  try:
    if x.shape[0] > 3:
      y = x * 2.0
  finally:
    return jnp.mean(jnp.sin(y))  # noqa: B012  (the case under test)


with warnings.catch_warnings():
  warnings.simplefilter("ignore", SyntaxWarning)   # 3.14 warns of `return` in `finally`
  finally_returns = _finally_returns


def _gen(x):
  try:
    yield x * 2.0 if x.shape[0] > 3 else x
  except BaseException as e:
    if isinstance(e, GeneratorExit):
      raise
    yield x * 0.0 - 100.0


def generator(x):
  return jnp.mean(jnp.sin(next(_gen(x))))


def wrapped(x):
  try:
    y = x * 2.0 if x.shape[0] > 3 else x
  except BaseException as e:
    raise RuntimeError("could not scale") from e
  return jnp.mean(jnp.sin(y))


def caught_int(x):
  try:
    k = int(x.shape[0])
  except Exception:
    k = 1
  return jnp.sum(x) * k


def wrapped_int(x):
  try:
    k = int(x.shape[0])
  except TypeError as e:
    raise RuntimeError("no size") from e
  return jnp.sum(x) * k


STEERED = [bare_except, except_base, suppress_base, exit_returns_true, finally_returns,
           generator, wrapped]
REFUSED = [caught_int, wrapped_int]   # jax.jit takes the `try` side: polyjit cannot


# --- the modes ------------------------------------------------------------------

def explicit_jit(f, n):
  return pj.jit(f, polymorphic_shapes=["n"])(example(n))


def mask_concrete(f, n):
  return pj.mask(f, ["n"])([nan_padded(example(n))], {"n": n})


def mask_traced(f, n):
  masked = pj.mask(f, ["n"])
  return jax.jit(lambda a, k: masked([a], {"n": k}))(nan_padded(example(n)), n)


def ragged(f, n):
  out = pj.vmap(f)(pj.Ragged.from_list([example(n), example(1), example(7)]))
  return np.asarray(out)[0]


MODES = [explicit_jit, mask_concrete, mask_traced, ragged]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("f", STEERED, ids=lambda f: f.__name__)
def test_a_caught_signal_never_steers_the_trace(f, mode):
  for n in SIZES:
    np.testing.assert_allclose(mode(f, n), jax.jit(f)(example(n)), rtol=1e-6)


@pytest.mark.parametrize("f", STEERED, ids=lambda f: f.__name__)
def test_automatic_jit_once_the_axis_is_dynamic(f):
  g = pj.jit(f)
  for n in (2, 3, 4, 5, 6, 7, 2):
    np.testing.assert_allclose(g(example(n)), jax.jit(f)(example(n)), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("f", REFUSED, ids=lambda f: f.__name__)
def test_a_caught_refusal_is_refused_not_computed(f, mode):
  for n in SIZES:
    with pytest.raises(pj.PolyjitError) as info:
      mode(f, n)
    assert __file__ in str(info.value)   # names the user's line


def test_the_refusal_says_the_function_caught_it():
  with pytest.raises(pj.MaskingError, match="caught an error polyjit raised") as info:
    mask_concrete(caught_int, 5)
  assert "int(n)" in str(info.value) and "What to do" in str(info.value)


def test_a_wrapped_refusal_is_polyjits_own_error():
  with pytest.raises(pj.SizeValueError, match="int\\(n\\)"):
    mask_concrete(wrapped_int, 5)


@pytest.mark.parametrize("f", REFUSED, ids=lambda f: f.__name__)
def test_automatic_jit_falls_back_to_exact_shapes(f):
  g = pj.jit(f)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", pj.PolyjitWarning)
    for n in (2, 3, 4, 5, 6):
      np.testing.assert_allclose(g(example(n)), jax.jit(f)(example(n)), rtol=1e-6)


def test_a_jitted_helper_that_swallowed_leaves_no_trace_in_a_shared_scope():
  """A jax.jit helper that stopped the signal cached its trace under the
  shared scope's avals: that scope must never serve another trace."""
  @jax.jit
  def helper(x):
    try:
      return x * 2.0 if x.shape[0] > 3 else x
    except BaseException:
      return x * 0.0 - 100.0

  def first(x):
    return jnp.sum(helper(x))

  def second(x):
    return jnp.mean(helper(x))

  for f in (first, second):
    for n in SIZES:
      np.testing.assert_allclose(mask_concrete(f, n), f(example(n)), rtol=1e-6)
      np.testing.assert_allclose(mask_traced(f, n), f(example(n)), rtol=1e-6)


def test_a_generator_closed_with_the_signal_inside():
  def gen(x):
    try:
      yield x.shape[0] > 3
    finally:
      return

  def f(x):
    wide = next(gen(x))
    return jnp.sum(x) * (2.0 if wide else 1.0)

  for mode in MODES:
    for n in SIZES:
      np.testing.assert_allclose(mode(f, n), f(example(n)), rtol=1e-6)


def test_a_helper_that_catches_and_reraises_is_unchanged():
  """Catching and re-raising is fine: the signal arrives."""
  def f(x):
    try:
      return jnp.sum(x) if x.shape[0] > 3 else jnp.prod(x)
    except BaseException:
      raise

  for mode in MODES:
    for n in SIZES:
      np.testing.assert_allclose(mode(f, n), f(example(n)), rtol=1e-6)


def test_a_caught_inconclusive_comparison_of_jax_settles_a_guard():
  """`x[:-1][0]` needs `n >= 2`, which JAX cannot decide for a symbolic `n`:
  its InconclusiveDimensionOperation is how polyjit learns the guard. Caught
  by the function, the trace went on to its `except` side (-100) where
  jax.jit raises nothing; at n = 1 jax.jit raises an IndexError, which the
  function catches, and both give -100, or polyjit refuses the side 'n <= 1'
  that a padded size of 8 cannot run (it does without the `try` too); concrete
  sizes on the other side are exact."""
  def f(x):
    try:
      return x[:-1][0] * 3.0 + jnp.sum(x)
    except Exception:
      return jnp.float32(-100.0)

  for mode in MODES:
    for n in (1, 3, 5):
      try:
        got = mode(f, n)
      except pj.PolyjitError:
        assert n == 1 or mode in (mask_traced, ragged)
        continue
      np.testing.assert_allclose(got, f(example(n)), rtol=1e-6)


def test_a_caught_shape_error_between_sizes_settles_the_comparison():
  """`jnp.dot(x, y[:n])` on the side n < m fails in JAX until polyjit tells
  it m >= n; a `suppress` around it hid that failure (found by the branch
  fuzzer), and the trace went on to the last line, where jax.jit never goes."""
  def f(x, y):
    with contextlib.suppress(BaseException):
      if x.shape[0] >= y.shape[0]:
        return jnp.sum(y) + 1.0
      else:
        return jnp.dot(x, y[:x.shape[0]]) + 2.0
    return jnp.float32(-100.0)

  masked = pj.mask(f, ["n", "m"])
  call = jax.jit(lambda a, b, n, m: masked([a, b], {"n": n, "m": m}))
  for n, m in ((1, 2), (2, 5), (5, 2), (3, 3)):
    x, y = example(n), example(m) * 0.5
    np.testing.assert_allclose(call(nan_padded(x), nan_padded(y), n, m), f(x, y), rtol=1e-6)
    np.testing.assert_allclose(pj.jit(f, polymorphic_shapes=["n", "m"])(x, y), f(x, y),
                               rtol=1e-6)
  out = pj.vmap(f)(pj.Ragged.from_list([example(1), example(5)]),
                   pj.Ragged.from_list([example(2) * 0.5, example(2) * 0.5]))
  np.testing.assert_allclose(out, [f(example(1), example(2) * 0.5),
                                   f(example(5), example(2) * 0.5)], rtol=1e-6)
