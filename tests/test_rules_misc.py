"""Random numbers, host callbacks, JAX's refusals, and the rows no other table has.

Every row of the random and callback rules runs eagerly, under jit, under
vmap over different logical sizes and under grad (see harness.py), with
NaN/inf/huge values in the padding; the rows for other families' rules skip
the eager run (see COMPILED).

* Random numbers of a dynamic shape must be the very numbers the unpadded
  program draws: for the dynamic axis first ((n,), (n, 3)), drawn at the
  padded size; otherwise ((3, n), (n, m)) drawn flat and gathered. The
  property the rules rely on is checked by itself for every PRNG they accept.
* Host callbacks must see the unpadded values: the host functions here give a
  wrong answer on padded ones (a reversed cumulative sum reads the end), and
  record what they were called with.
* The last rows exercise rules of the first rule families that no other table
  reaches (tests/test_coverage.py requires a row for every rule).
"""

from __future__ import annotations

import jax
import jax.extend as jex
import jax.numpy as jnp
import jax.scipy.special as special
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import io_callback

import polyjit as pj
from harness import Case, bools, check, const, ints, make, normal, positive, table_test
from polyjit._masking.rules.random import COUNTER_BASED

FORWARD = ("eager", "jit", "vmap")
# Rows for other families' rules skip the eager run: op-by-op dispatch of
# special functions compiles every op at every size, and jit runs the same rules.
COMPILED = ("jit", "vmap", "grad")
TWO = ({"n": 2}, {"n": 5})
NM = {"n": 8, "m": 6}
SIZES_NM = ({"n": 1, "m": 6}, {"n": 5, "m": 2})
KEY = np.array([0, 42], np.uint32)   # a raw threefry key, passed as an argument


def row(name, fun, in_shapes, *pieces, **kw):
  """A table row at two logical sizes, whose reference and grad check run
  compiled (op-by-op dispatch of samplers and special functions is slow)."""
  return Case(name, fun, in_shapes, make(*pieces), **{"sizes": TWO, "compiled": True, **kw})


def keyed(name, fun, **kw):
  """A row of `fun(x, key)`, x a float vector of length n."""
  return row(name, fun, ["n", None], normal("n"), const(KEY), **kw)


def bounded(*shape):
  """Floats in (-0.9, 0.9)."""
  base = normal(*shape)
  return lambda rng, s: (0.9 * np.tanh(base(rng, s))).astype(np.float32)


def other_prngs(x, _):
  """Both layouts, with every counter-based PRNG but the default one."""
  out = 0.0
  for impl in COUNTER_BASED[1:]:
    key = jax.random.key(7, impl=impl)
    out = out + jax.random.normal(key, (x.shape[0], 2)).sum(1) * x
    out = out + jax.random.uniform(key, (2, x.shape[0]))[1]
  return out


def layouts(x, k):
  """Both layouts: the dynamic axis first, drawn padded; and last, gathered."""
  return (x * jax.random.normal(k, x.shape) + jax.random.exponential(k, x.shape),
          jax.random.uniform(k, (x.shape[0], 3), minval=-1.0) * x[:, None],
          jax.random.normal(k, (3, x.shape[0])) * x)


def integers_and_keys(x, k):
  """Draws without gradients, and key arrays of a dynamic shape."""
  n = x.shape[0]
  index = jnp.arange(n, dtype=jnp.uint32)
  keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.wrap_key_data(k), index)
  return (jax.random.bernoulli(k, 0.3, x.shape), jax.random.randint(k, x.shape, 0, 10),
          jax.random.bits(k, (2, n), jnp.uint8), jax.random.categorical(k, x),
          jax.random.key_data(jax.random.split(k, (2, n))),
          jax.random.key_data(jax.random.clone(keys)),
          jax.random.key_data(jax.vmap(jax.random.key)(index * 7)),
          jex.random.threefry_2x32(k, index * 3))


RANDOM_CASES = [
    keyed("random_layouts", layouts),
    row("random_uniform_n_by_m",
        lambda x, y, k: jax.random.uniform(k, (x.shape[0], y.shape[0])) * x[:, None] + y,
        ["n", "m", None], normal("n"), normal("m"), const(KEY), sizes=SIZES_NM, padded=NM),
    keyed("random_split_then_draw", lambda x, k: x * jax.vmap(lambda k: jax.random.normal(k, ()))(
        jax.random.split(k, x.shape[0]))),
    keyed("random_gamma", lambda x, k: jax.random.gamma(k, jnp.exp(x)), sizes=({"n": 4},)),
    # Many draws, no gradients: the eager run of the same rules is in random_layouts.
    keyed("random_integers_and_keys", integers_and_keys, modes=("jit", "vmap")),
    keyed("random_philox_threefry4x32", other_prngs),
]


# --- callbacks -----------------------------------------------------------------

def _host_revcumsum(a):
  return np.cumsum(np.asarray(a)[::-1])[::-1].astype(np.float32)


def _host_cumsum(a):
  return np.cumsum(np.asarray(a)).astype(np.float32)


def _callback(host, x):
  return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="sequential")


@jax.custom_vjp
def host_revcumsum(x):
  """A reverse cumulative sum on the host: wrong on padded data."""
  return _callback(_host_revcumsum, x)


host_revcumsum.defvjp(lambda x: (host_revcumsum(x), None),
                      lambda _, g: (_callback(_host_cumsum, g),))


def diff_and_total(x):
  """Results of other sizes than the operand: (n - 1,) and ()."""
  shapes = (jax.ShapeDtypeStruct((x.shape[0] - 1,), x.dtype), jax.ShapeDtypeStruct((), x.dtype))
  return jax.pure_callback(lambda a: (np.diff(np.asarray(a)), np.asarray(a).sum()),
                           shapes, x, vmap_method="sequential")


def outer_with_fixed(x, w):
  return jax.pure_callback(lambda a, b: np.outer(np.asarray(a)[::-1], b),
                           jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), x.dtype), x, w,
                           vmap_method="sequential")


def io_revcumsum(x):
  return io_callback(_host_revcumsum, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def printed(x):
  jax.debug.print("x = {x}, last = {last}", x=x, last=x[-1])
  return jnp.sin(x)


def recorded(x, log):
  jax.debug.callback(lambda a: log.append(np.asarray(a)), x)
  return jnp.sin(x)


CALLBACK_CASES = [
    row("pure_callback", lambda x: host_revcumsum(x) * 2.0, ["n"], normal("n")),
    row("pure_callback_other_shapes", diff_and_total, ["n"], normal("n"),
        sizes=({"n": 1}, {"n": 5}), modes=FORWARD),
    row("pure_callback_fixed_operand", outer_with_fixed, ["n", None], normal("n"), normal(3),
        modes=FORWARD),
    row("io_callback", io_revcumsum, ["n"], normal("n"), modes=FORWARD),
    row("debug_print", printed, ["n"], normal("n")),
    row("debug_callback", lambda x: recorded(x, []), ["n"], normal("n")),
]


# --- rows for rules no other table reaches ---------------------------------------

def _via_call(prim, closed_jaxpr: bool):
  """A function that binds a call primitive (`closed_call`, `call`) directly."""
  def fun(x):
    closed = jax.make_jaxpr(lambda y: jnp.cumsum(y[::-1]) * 2.0)(x)
    jaxpr = closed if closed_jaxpr else closed.jaxpr
    return prim.bind(x, **prim.get_bind_params({"call_jaxpr": jaxpr}))[0]
  return fun


def variadic_argmax(x):
  """`lax.reduce` over two operands: the `reduce` primitive."""
  def pick(a, b):
    take_b = b[0] > a[0]
    return lax.select(take_b, b[0], a[0]), lax.select(take_b, b[1], a[1])
  index = lax.iota(jnp.int32, x.shape[0])
  return lax.reduce((x, index), (np.float32(-np.inf), np.int32(0)), pick, (0,))


def scatter_combiners(x, idx):
  return (x.at[idx].multiply(2.0), x.at[idx].min(0.0), x.at[idx].max(0.0),
          lax.scatter_sub(x, idx[:, None], jnp.ones(idx.shape[0]),
                          lax.ScatterDimensionNumbers((), (0,), (0,))))


def float_elementwise(x, y):
  """x: any float, y: positive."""
  b = 0.9 * jnp.tanh(x)
  z = lax.complex(x, y)
  return (jnp.arcsin(b), jnp.arccos(b), jnp.arctan(x), jnp.arctanh(b), special.erfinv(b),
          jnp.arctan2(x, y), jnp.sinh(x), jnp.cosh(x), jnp.tan(0.5 * b), jnp.arcsinh(x),
          jnp.arccosh(1.0 + y), jnp.sqrt(y), lax.rsqrt(y), jnp.cbrt(x), jnp.exp2(x),
          jnp.expm1(x), jnp.power(y, x), jnp.round(x), jnp.ceil(x), jnp.isfinite(x),
          jnp.sign(x), jnp.real(z * jnp.conj(z)), jnp.imag(z * z),
          lax.reduce_precision(x, 5, 10), lax.optimization_barrier(x) * 2.0, jnp.copy(x),
          lax.clamp(-0.5, x, 0.5), checkpoint_name(x * y, "tagged"))


def special_functions(x, y):
  """x, y: positive."""
  return (special.gammaln(x), special.digamma(x), special.erfc(x), special.i0e(x),
          special.i1e(x), special.gammainc(x, y), special.gammaincc(x, y),
          special.polygamma(1, x), special.zeta(x + 1.0, y), special.betainc(1.5, 2.0, 0.4 * y))


def differentiable_special_functions(x, y):
  """x, y: positive; the functions of special_functions that JAX differentiates."""
  return (special.digamma(x), special.erfc(x), special.i0e(x), special.i1e(x),
          special.gammaincc(x, y), special.polygamma(1, x), special.betainc(1.5, 2.0, 0.4 * y))


def without_gradients(a, b, p, q, x):
  """a, b: ints; p, q: bools; x: floats."""
  return (a << 2, lax.shift_right_logical(a, 3), lax.population_count(a), lax.clz(a),
          lax.mulhi(a, b), lax.bitcast_convert_type(a, jnp.float32), a <= b, p != q, p <= q,
          jnp.nextafter(x, x + 1.0), variadic_argmax(x))


def call_primitives(x):
  return (_via_call(jex.core.primitives.closed_call_p, True)(x),
          _via_call(jex.core.primitives.call_p, False)(x))


ELEMENTWISE_CASES = [
    row("float_elementwise", float_elementwise, ["n", "n"], normal("n"), positive("n"),
        modes=COMPILED),
    row("special_functions", special_functions, ["n", "n"], positive("n"), positive("n"),
        modes=("jit", "vmap"), rtol=1e-4, atol=1e-4),
    row("special_function_gradients", differentiable_special_functions, ["n", "n"],
        positive("n"), positive("n"), modes=("grad",), rtol=1e-4, atol=1e-4),
    row("incomplete_gamma", special.gammainc,
        ["n", "n"], positive("n"), positive("n"), modes=COMPILED, rtol=1e-4, atol=1e-4),
    row("without_gradients", without_gradients, ["n"] * 5, ints("n", low=-1000, high=1000),
        ints("n", low=-1000, high=1000), bools("n"), bools("n"), normal("n"),
        modes=("jit", "vmap")),
    row("scatter_combiners", scatter_combiners, ["n", None], normal("n"),
        const(np.array([0, 3, 1, 9], np.int32)), sizes=({"n": 2}, {"n": 6}), modes=COMPILED),
    row("call_primitives", call_primitives, ["n"], normal("n"), modes=COMPILED),
    # `eq_to` only appears in sort comparators, where no operand is padded.
    row("eq_to", lax.eq_to_p.bind, ["n", "n"], ints("n", low=0, high=3), ints("n", low=0, high=3),
        modes=("jit", "vmap")),
    # `lt_to` and `le_to` likewise (on JAX 0.12 the sort rows reach them no more).
    row("lt_to", lax.lt_to_p.bind, ["n", "n"], normal("n"), normal("n"), modes=("jit", "vmap")),
    row("le_to", lax.le_to_p.bind, ["n", "n"], ints("n", low=0, high=3), ints("n", low=0, high=3),
        modes=("jit", "vmap")),
    row("approx_top_k_along_a_fixed_axis",
        lambda x: lax.approx_min_k(x, 2, reduction_dimension=1)[0], ["(n, _)"], normal("n", 4),
        modes=COMPILED),
]

# Found by tests/test_fuzz.py: JAX's reduce_prod JVP reshapes its operand with
# static sizes, so it failed whenever any axis was dynamic, reduced or not.
REGRESSION_CASES = [
    row("prod_along_a_fixed_axis", lambda x: jnp.prod(x, axis=1), ["(n, _)"], normal("n", 3)),
]

CASES = RANDOM_CASES + CALLBACK_CASES + ELEMENTWISE_CASES + REGRESSION_CASES
CASES_BY_NAME, test_rule = table_test(CASES)


# --- the PRNG property the random rules rely on ------------------------------------

@pytest.mark.parametrize("impl", COUNTER_BASED)
def test_counter_based_prngs_draw_by_flat_index(impl):
  """A value depends on the key and its flat index only, not on the shape."""
  key = jax.random.key(3, impl=impl)
  long = np.asarray(jax.random.bits(key, (8, 3)))
  np.testing.assert_array_equal(np.asarray(jax.random.bits(key, (5, 3))), long[:5])
  np.testing.assert_array_equal(np.asarray(jax.random.bits(key, (3, 5))).ravel(),
                                np.asarray(jax.random.bits(key, (15,))))
  np.testing.assert_array_equal(jax.random.key_data(jax.random.split(key, 5)),
                                jax.random.key_data(jax.random.split(key, 8))[:5])


def _draw_normal(impl="threefry2x32"):
  return pj.mask(lambda x: x * jax.random.normal(jax.random.key(0, impl=impl), x.shape), ["n"])


def test_rbg_keys_are_refused_for_dynamic_shapes():
  with pytest.raises(pj.MaskingError, match="'rbg' PRNG draws different numbers"):
    _draw_normal("rbg")([np.ones(8, np.float32)], {"n": 3})


def test_threefry_without_partitionable_is_refused():
  with jax.threefry_partitionable(False):
    with pytest.raises(pj.MaskingError, match="jax_threefry_partitionable=False"):
      _draw_normal()([np.ones(8, np.float32)], {"n": 3})


def test_dynamic_keys_need_no_counter_based_prng():
  """Keys of a dynamic shape draw position by position, with any PRNG."""
  def f(x):
    keys = jax.random.split(jax.random.key(1, impl="rbg"), 4)
    return jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys)[:, 0] * x.sum()
  x = np.full(8, np.nan, np.float32)
  x[:3] = 1.0
  np.testing.assert_array_equal(jax.jit(pj.mask(f, ["n"]))([x], {"n": 3}), f(jnp.ones(3)))


def test_gamma_in_a_layout_that_moves_is_refused():
  f = lambda x: jax.random.gamma(jax.random.key(0), jnp.ones((3, x.shape[0])))
  with pytest.raises(pj.MaskingError, match="dynamic axis first"):
    pj.mask(f, ["n"])([np.ones(8, np.float32)], {"n": 3})


# --- callbacks: what the host sees --------------------------------------------------

def _nan_padded(values, size=8):
  x = np.full(size, np.nan, np.float32)
  x[:len(values)] = values
  return x


@pytest.mark.parametrize("jit", [False, True])
def test_io_callback_runs_once_on_the_unpadded_values(jit):
  calls = []

  def f(x):
    def host(a):
      calls.append(np.asarray(a))
      return np.asarray(a).sum()
    return io_callback(host, jax.ShapeDtypeStruct((), x.dtype), x)

  masked = pj.mask(f, ["n"])
  run = jax.jit(masked) if jit else masked
  for n in (3, 5):
    calls.clear()
    assert float(run([_nan_padded(np.arange(n))], {"n": n})) == sum(range(n))
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0], np.arange(n, dtype=np.float32))


def test_debug_print_prints_the_unpadded_values(capfd):
  values = [1.5, -2.0, 3.25]
  printed(jnp.asarray(values))
  expected = capfd.readouterr().out
  assert "3.25" in expected
  masked = pj.mask(printed, ["n"])
  masked([_nan_padded(values)], {"n": 3})
  jax.jit(masked)([_nan_padded(values)], {"n": 3})
  jax.effects_barrier()
  assert capfd.readouterr().out == expected * 2


def test_debug_callback_gets_the_unpadded_values():
  log = []
  pj.mask(lambda x: recorded(x, log), ["n"])([_nan_padded([1.0, 2.0])], {"n": 2})
  jax.effects_barrier()
  assert len(log) == 1
  np.testing.assert_array_equal(log[0], [1.0, 2.0])


def test_a_callback_result_of_the_wrong_shape_is_reported():
  f = lambda x: _callback(lambda a: np.zeros(8, np.float32), x)  # padded size, not n
  with pytest.raises(Exception, match=r"expected float32\[3\] \(the unpadded shape\)"):
    np.asarray(pj.mask(f, ["n"])([_nan_padded([1.0, 2.0, 3.0])], {"n": 3}))


def test_gradients_run_an_io_callback_once():
  # The gradient's forward pass saves what its backward pass needs, so an
  # effect in `fun` runs once per gradient, not again in a replay.
  calls = []

  def f(x):
    count = io_callback(lambda c: calls.append(c) or c, jax.ShapeDtypeStruct((), jnp.int32),
                        jnp.sum(x > 0))
    return jnp.sum(x * x) * count
  masked = pj.mask(f, ["n"])
  x = _nan_padded([1.0, 2.0])
  want = np.asarray(jax.grad(f)(jnp.asarray([1.0, 2.0])))
  jax.effects_barrier()
  calls.clear()
  got = np.asarray(jax.grad(lambda x: masked([x], {"n": 2}))(x))
  jax.effects_barrier()
  assert len(calls) == 1
  np.testing.assert_array_equal(got[:2], want)
  assert not np.any(got[2:])


# --- what JAX itself refuses ---------------------------------------------------------

def test_associative_scan_at_a_dynamic_size_is_exact():
  # (an exact replacement while polyjit traces: `_spellings/scans.py`; the
  # table of such records is tests/test_lax_records_dynamic_sizes.py)
  f = lambda x: lax.associative_scan(jnp.add, x)
  x = np.array([1, 2, 3, np.nan, np.inf, -np.inf, np.nan, 7], np.float32)
  for run in (lambda *a: pj.mask(f, ["n"])(*a), jax.jit(pj.mask(f, ["n"]))):
    np.testing.assert_array_equal(np.asarray(run([x], {"n": 3}))[:3], f(jnp.asarray(x[:3])))


def test_associative_scan_along_a_fixed_axis_works():
  f = lambda x: lax.associative_scan(jnp.add, x, axis=1).sum(0)
  x = np.full((8, 4), np.nan, np.float32)
  x[:3] = np.arange(12).reshape(3, 4)
  np.testing.assert_allclose(jax.jit(pj.mask(f, ["(n, _)"]))([x], {"n": 3}),
                             f(jnp.asarray(x[:3])))


def test_permutation_at_a_dynamic_size_says_what_to_do():
  f = lambda x: jax.random.permutation(jax.random.key(0), x)
  with pytest.raises(pj.MaskingError, match="argsort"):
    pj.mask(f, ["n"])([np.ones(8, np.float32)], {"n": 3})
