"""JAX spellings that JAX cannot trace at symbolic sizes, replaced while polyjit traces.

`jnp.searchsorted` / `jnp.interp` on a sorted array of dynamic length,
`jnp.linspace` with a dynamic `num`, `jnp.diff(x, n>=2)` along a dynamic axis,
and reverse-mode differentiation of `lax.fori_loop` from a constant to a size
(see polyjit/_spellings/). Every row runs against the unpadded computation
with NaN/inf/huge padding, under jit, under vmap over logical sizes and under
grad where differentiable, and eagerly for the cheapest rows (tests/harness.py).
Direct tests check queries below, inside and above the data, the fori_loop
gradient against jax.grad of the unpadded function, and agreement with JAX to
rounding at more sizes. The last tests check the patching itself: its targets
exist in this JAX (a rename must fail here, loudly), JAX's originals come back
afterwards, other threads are untouched, and concrete sizes still get JAX's
own functions.
"""

from __future__ import annotations

import importlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export, lax

import polyjit as pj
from harness import Case, bools, const, ints, make, normal, table_test
from polyjit import _jax as jc
from polyjit._spellings import along_axis as _along_axis
from polyjit._spellings import data_dependent as _data_dependent
from polyjit._spellings import replacements as _spellings
from polyjit._spellings import indices as _indices
from polyjit._spellings import length as _length
from polyjit._spellings import scans as _scan_spellings
from polyjit._spellings import signal as _signal_spellings

# Most rows skip the eager run: op-by-op dispatch compiles every op at every
# size, and jit runs the same masking rules (each row passes eagerly too; the
# cheapest rows of each kind keep it here to bound the file's time).
FORWARD = ("jit", "vmap")              # integer outputs: nothing to differentiate
COMPILED = ("jit", "vmap", "grad")
ALL = ("eager", "jit", "vmap", "grad")
# Rows that compile large programs (a compile per size and mode) run at the two
# sizes that matter most: one element (every edge at once) and several.
ONE_AND_FIVE = ({"n": 1}, {"n": 5})

# Queries below, at, between and above the data, and the extremes.
QUERIES = np.array([-10.0, -3.0, -2.5, -0.5, 0.0, 0.5, 1.0, 2.0, 2.5, 3.0, 9.0,
                    np.inf, -np.inf, np.nan], np.float32)


def sorted_ties(*shape):
  """Sorted small integers as floats: ties, and values equal to QUERIES."""
  return lambda rng, s: np.sort(rng.integers(-3, 4, _n(shape, s))).astype(np.float32)


def increasing(*shape):
  """Strictly increasing floats from about -1 (interpolation knots)."""
  return lambda rng, s: (np.cumsum(rng.uniform(0.3, 1.5, _n(shape, s))) - 1.3).astype(np.float32)


def unsorted_with_sorter(rng, sizes):
  """Unsorted ints with ties, the permutation that sorts them, int queries, and
  sorted bools."""
  a = rng.integers(-3, 4, sizes["n"]).astype(np.int32)
  return [a, np.argsort(a, kind="stable").astype(np.int32),
          np.array([-5, -3, 0, 1, 3, 7], np.int32), np.sort(rng.random(sizes["n"]) < 0.5)]


def _n(shape, sizes):
  return tuple(sizes[d] if isinstance(d, str) else d for d in shape)


def row(name, fun, in_shapes, *pieces, **kw):
  """A table row, compiled (see harness.py); sizes 1, 3 and 6 unless given."""
  return Case(name, fun, in_shapes, make(*pieces), **{"compiled": True, "modes": COMPILED,
                                                      **kw})


def ss(a, v, **kw):
  return jnp.searchsorted(a, v, **kw)


def searches(a, v):
  """Every side and method, the Array method and digitize (bins = a)."""
  return (ss(a, v), ss(a, v, side="right"), ss(a, v, side="right", method="sort"),
          ss(a, v, method="compare_all"), a.searchsorted(v, side="right"),
          jnp.digitize(v, a), jnp.digitize(v, a, right=True))


def searches_other_dtypes(a, sorter, v, b):
  """Int data through a sorter, and bool data."""
  return (ss(a, v, sorter=sorter), ss(a, v, side="right", sorter=sorter),
          ss(b, jnp.array([False, True])), ss(b, jnp.array([False, True]), side="right"))


def interps(x, xp, fp):
  """The ends: fp[0]/fp[-1]; extrapolation on the left and a given value on the
  right, at queries of the dynamic length (GP-style: the inputs, stretched)."""
  return (jnp.interp(x, xp, fp),
          jnp.interp(xp * 1.3 - 0.4, xp, fp, left="extrapolate", right=fp[0] * 2))


def linspaces(x, a, b):
  """endpoint, retstep, num = n - 1 (0 at n = 1), vector bounds."""
  n = x.shape[0]
  return (jnp.linspace(-1.5, 2.0, n) * x,
          jnp.linspace(-1.5, 2.0, n, endpoint=False) * x,
          jnp.linspace(x[0], x[-1], n, retstep=True),
          jnp.linspace(x[-1], 3.0, n, endpoint=False, retstep=True),
          jnp.linspace(x[0], x[-1], n - 1),
          jnp.linspace(a, b, n, axis=-1) * x)


def diffs(x, m, w, b, i):
  """Orders 2 and 3, both axes, prepend/append, bool and int."""
  return (jnp.diff(x, n=2), jnp.diff(x, n=3) * 2, jnp.diff(m, n=2, axis=0),
          jnp.diff(w, n=2, prepend=1.5, append=w[:, :1]), jnp.diff(b, n=2), jnp.diff(i, n=3))


def fori_sq(x):
  return lax.fori_loop(0, x.shape[0], lambda i, c: c + x[i] ** 2 * i, 0.0)


def fori_loops(x, m, w):
  """A recurrence over rows; bounds 1 .. n - 1 and 2 .. n (trip counts 0 at small n),
  unrolled; an array carry written at i."""
  rnn = lax.fori_loop(0, m.shape[0], lambda i, h: jnp.tanh(w * h + m[i]), jnp.zeros(3))
  inner = lax.fori_loop(1, x.shape[0] - 1, lambda i, c: c * 0.5 + x[i] * x[i + 1], x[0])
  lagged = lax.fori_loop(2, x.shape[0], lambda i, c: (c[0] + x[i - 2] * c[1], c[1] * 0.9),
                         (0.0, 1.0), unroll=2)
  written = lax.fori_loop(0, x.shape[0], lambda i, y: y.at[i].set(jnp.sin(x[i]) + y[i - 1]),
                          jnp.zeros_like(x))
  return rnn, inner, lagged, written


CASES = [
    row("searchsorted", searches, ["n", None], sorted_ties("n"), const(QUERIES), modes=FORWARD,
        sizes=ONE_AND_FIVE),
    Case("searchsorted_sorter_int_bool", searches_other_dtypes, ["n", "n", None, "n"],
         unsorted_with_sorter, compiled=True, modes=FORWARD, sizes=ONE_AND_FIVE),
    row("searchsorted_dynamic_queries_rank", lambda x: ss(jnp.sort(x), x, side="right"),
        ["n"], normal("n"), modes=("eager",) + FORWARD, sizes=ONE_AND_FIVE),
    row("interp", interps, [None, "n", "n"], const(QUERIES[1:-3]), increasing("n"), normal("n"),
        sizes=ONE_AND_FIVE),
    # Unsorted knots: the period sorts them and wraps one around each end.
    row("interp_period", lambda x, xp, fp: jnp.interp(x, xp, fp, period=2.5), [None, "n", "n"],
        const(QUERIES[1:-3]), normal("n"), normal("n"), modes=FORWARD, sizes=ONE_AND_FIVE),
    row("linspace", linspaces, ["n", None, None], normal("n"), normal(3, 1), normal(2),
        sizes=({"n": 1}, {"n": 2}, {"n": 5})),
    row("diff", diffs, ["n", "(n, _)", "(_, n)", "n", "n"], normal("n"), normal("n", 3),
        normal(2, "n"), bools("n"), ints("n"), sizes=ONE_AND_FIVE),
    row("fori_loop_to_n", fori_sq, ["n"], normal("n"), modes=ALL),
    row("fori_loops", fori_loops, ["n", "(n, _)", None], normal("n"), normal("n", 3), normal(3),
        sizes=ONE_AND_FIVE, modes=ALL),
]
CASES_BY_NAME, test_rule = table_test(CASES)


# --- direct checks -------------------------------------------------------------------

def _padded(x, size, fill=np.nan):
  out = np.full((size,) + np.shape(x)[1:], fill, np.asarray(x).dtype)
  out[:len(x)] = x
  return out


def test_fori_loop_gradient_equals_unpadded_gradient():
  f = lambda x: lax.fori_loop(0, x.shape[0], lambda i, c: c * jnp.cos(x[i]) + x[i] ** 3, 1.0)
  masked = jax.jit(pj.mask(f, ["n"]))
  grad = jax.jit(jax.grad(lambda x, n: masked([x], {"n": n})))
  rng = np.random.default_rng(1)
  for n in (1, 2, 7):
    x = rng.standard_normal(n).astype(np.float32)
    got = np.asarray(grad(_padded(x, 8), n))
    want = np.asarray(jax.jit(jax.grad(f))(x))
    np.testing.assert_allclose(got[:n], want, rtol=1e-5, atol=1e-6)
    assert np.all(got[n:] == 0)


def test_searchsorted_and_interp_below_inside_above_the_data():
  xp = np.array([0.0, 1.0, 2.0, 4.0], np.float32)
  fp = np.array([10.0, 20.0, 0.0, 4.0], np.float32)
  x = np.array([-np.inf, -1.0, 0.0, 0.5, 1.0, 3.0, 4.0, 9.0, np.inf, np.nan], np.float32)
  f = jax.jit(pj.mask(lambda xp, fp, x: (jnp.searchsorted(xp, x),
                                         jnp.searchsorted(xp, x, side="right"),
                                         jnp.interp(x, xp, fp)), ["n", "n", None]))
  pad = lambda n: [_padded(xp[:n], 8, -np.inf), _padded(fp[:n], 8, np.nan), x]
  left, right, y = f(pad(4), {"n": 4})
  np.testing.assert_array_equal(left, [0, 0, 0, 1, 1, 3, 3, 4, 4, 4])
  np.testing.assert_array_equal(right, [0, 0, 1, 1, 2, 3, 4, 4, 4, 4])
  np.testing.assert_array_equal(y, [10, 10, 10, 15, 20, 2, 4, 4, 4, np.nan])
  # Shorter data: the end of the data moves with the logical size; one point.
  left, right, y = f(pad(2), {"n": 2})
  np.testing.assert_array_equal(left, [0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
  np.testing.assert_array_equal(y, [10, 10, 10, 15, 20, 20, 20, 20, 20, np.nan])
  left, right, y = f(pad(1), {"n": 1})
  np.testing.assert_array_equal(right, [0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
  np.testing.assert_array_equal(y, np.full_like(x, 10.0))   # one point: fp[0], even at NaN


def test_linspace_and_interp_match_jax_to_the_last_bits():
  """Up to the rounding XLA's fusion may change (a few ulp), at more sizes."""
  f = lambda x, v: (jnp.linspace(x[0], 3.0, x.shape[0], retstep=True),
                    jnp.linspace(0.1, x[-1], x.shape[0], endpoint=False),
                    jnp.interp(v, jnp.cumsum(jnp.abs(x)), jnp.sin(x)))
  masked = jax.jit(pj.mask(f, ["n", None]))
  rng = np.random.default_rng(2)
  v = rng.uniform(-1, 6, 9).astype(np.float32)
  for n in (2, 13):
    x = rng.standard_normal(n).astype(np.float32)
    got = masked([_padded(x, 16), v], {"n": n})
    want = jax.jit(f)(x, v)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(g)[tuple(slice(0, s) for s in w.shape)], w,
                                 rtol=3e-7, atol=1e-7)


# --- the patching ----------------------------------------------------------------------

def test_patch_targets_exist_in_this_jax():
  """A JAX that renames or moves one of these must fail here, not silently."""
  for module, attr in jc.SWAP_SITES:
    target = getattr(importlib.import_module(module), attr)
    assert callable(target), (module, attr)
    replacement = jc.replacement_of(target)  # keyed by the function object itself
    assert replacement in [getattr(m, replacement.__name__, None) for m in (
        _spellings, _data_dependent, _signal_spellings, _indices, _length, _scan_spellings,
        _along_axis, jc.compile_time)], (module, attr)
  # The private global is the function JAX's digitize and Array method call.
  from jax._src.numpy import lax_numpy
  assert lax_numpy.searchsorted is jnp.searchsorted
  # What the replacements themselves need from JAX's public API.
  assert callable(jax.core.max_dim) and callable(export.is_symbolic_dim)
  assert isinstance(jax.core.Tracer, type)


def test_a_missing_target_fails_loudly_and_installs_nothing(monkeypatch):
  before = jnp.searchsorted
  monkeypatch.setattr(jc.swaps, "SWAP_SITES",
                      jc.SWAP_SITES + (("jax.numpy", "no_such_function"),))
  jc.registry.forget()  # the probe of the swap sites runs again, and fails
  with pytest.raises(jc.JaxBoundaryError, match="no_such_function"):
    with jc.trace_spellings():
      pass
  assert jnp.searchsorted is before and not jc.spellings_active()


def test_originals_are_restored_and_nesting_is_counted():
  before = {(m, a): getattr(importlib.import_module(m), a) for m, a in jc.SWAP_SITES}
  with jc.trace_spellings():
    assert jnp.searchsorted is not before[("jax.numpy", "searchsorted")]
    with jc.trace_spellings():
      assert jc.spellings_active()
    assert jc.spellings_active() and jnp.linspace is not before[("jax.numpy", "linspace")]
  assert not jc.spellings_active()
  after = {(m, a): getattr(importlib.import_module(m), a) for m, a in jc.SWAP_SITES}
  assert after == before
  jax.jit(pj.mask(lambda a, v: jnp.searchsorted(a, v), ["n", None]))(
      [np.zeros(4, np.float32), np.zeros(2, np.float32)], {"n": 3})
  assert jnp.searchsorted is before[("jax.numpy", "searchsorted")]


def test_other_threads_and_concrete_sizes_get_jax_itself():
  n, = export.symbolic_shape("n")
  sym = jax.ShapeDtypeStruct((n,), jnp.float32)
  q = jax.ShapeDtypeStruct((3,), jnp.float32)
  errors = []

  def other_thread():
    try:
      jax.make_jaxpr(jnp.searchsorted)(sym, q)
    except Exception as e:  # JAX's own refusal: the replacement is not active here
      errors.append(e)

  concrete = jax.ShapeDtypeStruct((5,), jnp.float32)
  plain = str(jax.make_jaxpr(jnp.searchsorted)(concrete, q))
  with jc.trace_spellings():
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert str(jax.make_jaxpr(jnp.searchsorted)(concrete, q)) == plain
    jax.make_jaxpr(jnp.searchsorted)(sym, q)   # symbolic, in this thread: replaced
  assert len(errors) == 1


def test_traced_loop_bounds_keep_while_loop():
  """A bound that is a traced value is not a size: JAX's while_loop, forward only."""
  f = lambda x, k: lax.fori_loop(0, k, lambda i, c: c + x[i], 0.0)
  masked = jax.jit(pj.mask(f, ["n", None]))
  x = np.arange(6, dtype=np.float32)
  assert float(masked([x, np.int32(3)], {"n": 5})) == 3.0
