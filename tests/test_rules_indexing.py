"""Gather, scatter and slices with index arrays: one row per indexing pattern.

Every row runs eagerly, under jit, under vmap over different logical sizes,
and under grad (see harness.py), with NaN/inf/huge values in the padding and
garbage in the padding of index arrays. Index generators draw from ranges
that depend on the logical sizes, past the logical end and below -n included,
so a rule that bounds by the padded size reads or writes padding and fails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import Case, ints, make, normal, table_test

FORWARD = ("eager", "jit", "vmap")
NM = {"n": 7, "m": 5}
SIZES_NM = ({"n": 1, "m": 2}, {"n": 5, "m": 4})
SIZES_UNIQUE = ({"n": 2, "m": 1}, {"n": 6, "m": 4})   # m <= n
SIZES_NMK = ({"n": 1, "m": 2, "k": 3}, {"n": 5, "m": 4, "k": 1})
NMK = {"n": 7, "m": 5, "k": 4}
SIZES_NK = ({"n": 1, "k": 3}, {"n": 5, "k": 1})
NK = {"n": 7, "k": 4}


def _size(expr, sizes):
  return eval(expr, {}, dict(sizes)) if isinstance(expr, str) else expr


def index(*shape, low="-n", high="n"):
  """Int32 indices in [low, high), bounds given as expressions of the sizes."""
  def gen(rng, sizes):
    dims = tuple(_size(d, sizes) for d in shape)
    return rng.integers(_size(low, sizes), _size(high, sizes), dims).astype(np.int32)
  return gen


def distinct(m, high="n"):
  """`m` distinct indices in [0, high)."""
  return lambda rng, sizes: rng.permutation(_size(high, sizes))[:sizes[m]].astype(np.int32)


def scalar(value):
  return lambda rng, sizes: np.int32(value)


def case(name, fun, specs, *pieces, sizes=SIZES_NM, padded=NM, **kw):
  return Case(name, fun, specs, make(*pieces), sizes=sizes, padded=padded, compiled=True, **kw)


def scatter_windows(x, u, starts, mode):
  """Set and add windows of u's row length at `starts` (shape (rows, 1)) of x."""
  dn = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(),
                                   scatter_dims_to_operand_dims=(0,))
  return (lax.scatter(x, starts, u, dn, mode=mode),
          lax.scatter_add(x, starts, u, dn, mode=mode))


def windows(x, u, v):
  """Dynamic windows at starts 1 and 6; fixed windows straddling the logical end."""
  fixed = jnp.stack([x.shape[0] - 1, x.shape[0] // 2])[:, None]
  return (*scatter_windows(x, u, jnp.array([[1], [6]]), "fill"),
          *scatter_windows(x, u, jnp.array([[1], [6]]), "clip"),
          *scatter_windows(x, v, fixed, "fill"), *scatter_windows(x, v, fixed, "clip"))


def segments(x, rows, ids, k):
  """Static and dynamic (k's length) numbers of segments."""
  static = [op(d, ids, num_segments=4) for d in (x, rows)
            for op in (jax.ops.segment_sum, jax.ops.segment_max, jax.ops.segment_min)]
  return (*static, jax.ops.segment_sum(x, ids, num_segments=k.shape[0]),
          jax.ops.segment_max(x, ids, num_segments=k.shape[0]),
          jax.ops.segment_sum(x, ids % x.shape[0], num_segments=x.shape[0]))


CASES = [
    # gather: x[idx], in range and past the logical end (clamped to it)
    case("gather_vector", lambda x, i, j: (x[i], x[j]), ["n", "m", "m"], normal("n"),
         index("m"), index("m", low="-2*n - 1", high="2*n + 1")),
    case("gather_pairs", lambda x, i, j: x[i, j], ["(n, n)", "m", "m"], normal("n", "n"),
         index("m"), index("m")),
    case("gather_rows_dynamic_width", lambda x, i: x[i], ["(n, k)", "m"], normal("n", "k"),
         index("m"), sizes=SIZES_NMK, padded=NMK),
    case("take_along_axis",
         lambda a, b, i, j: (jnp.take_along_axis(a, i, axis=1), jnp.take_along_axis(b, j, axis=1),
                             jnp.take_along_axis(b.T, j.T, axis=0)),
         ["(_, n)", "(n, _)", "(_, m)", "(n, _)"], normal(3, "n"), normal("n", 4),
         index(3, "m", high="n + 1"), index("n", 2, low=-4, high=5)),
    case("get_and_take_modes",
         lambda x, xi, i, ok: (x.at[i].get(mode="fill", fill_value=-7.0), x.at[i].get(mode="fill"),
                               xi.at[i].get(mode="fill"), x.at[i].get(mode="clip"),
                               x.at[ok].get(mode="promise_in_bounds"),
                               jnp.take(x, i % x.shape[0]), jnp.take(x, i, mode="clip"),
                               jnp.take(x, i, mode="fill", fill_value=3.0)),
         ["n", "n", "m", "m"], normal("n"), ints("n"), index("m", low="-3*n", high="3*n"),
         index("m", low=0)),
    case("vmap_inside",
         lambda x, i, u: (jax.vmap(lambda r, j: r[j])(x, i),
                          jax.vmap(lambda r, j, v: r.at[j].add(v))(x, i, u)),
         ["(n, k)", "n", "n"], normal("n", "k"), index("n", low="-k", high="k + 2"),
         normal("n"), sizes=SIZES_NK, padded=NK),
    # dynamic slices with dynamic sizes, and at many starts (gathers)
    case("dynamic_slices",
         lambda x, u, a, b, s: (lax.dynamic_slice(x, (s,), (u.shape[0],)) * u,
                                jax.vmap(lambda t: lax.dynamic_slice(x, (t,), (2,)))(
                                    jnp.arange(-1, 5) * s),
                                jax.vmap(lambda t: lax.dynamic_slice(x, (t,), u.shape) * u)(
                                    jnp.arange(-1, 5) * s),
                                lax.dynamic_update_slice(x, u, (s,)),
                                lax.dynamic_update_slice(a, b, (s, 1))),
         ["n", "m", "(n, n)", "(m, m)", None], normal("n"), normal("m"), normal("n", "n"),
         normal("m", "m"), scalar(3),
         sizes=({"n": 2, "m": 1}, {"n": 6, "m": 1}, {"n": 6, "m": 4}),
         constraints=("n >= m", "n >= 2")),
    # scatter: .at[idx] with every combiner and mode
    case("at_set_distinct",
         lambda x, i, u: (x.at[i].set(u), x.at[i - x.shape[0]].set(2 * u),
                          x.at[i % x.shape[0]].set(3 * u),  # garbage in range too
                          x.at[i].multiply(u, unique_indices=True),
                          x.at[-1].set(5.0), x.at[jnp.asarray(x.shape[0])].set(5.0, mode="drop"),
                          x.at[jnp.asarray(-x.shape[0])].add(1.0)),
         ["n", "m", "m"], normal("n"), distinct("m"), normal("m"), sizes=SIZES_UNIQUE),
    case("at_combine",
         lambda x, i, u: (x.at[i].add(u), x.at[i].min(u), x.at[i].max(u),
                          x.at[i].subtract(u)),
         ["n", "m", "m"], normal("n"), index("m"), normal("m")),
    case("at_multiply_apply_duplicates",
         lambda x, i, u: (x.at[i].multiply(u), x.at[i].apply(jnp.sin)), ["n", "m", "m"],
         normal("n"), index("m"), normal("m"), modes=FORWARD),
    case("at_modes",
         lambda x, i, d, u: (x.at[i].add(u, mode="drop"), x.at[i].add(u, mode="clip"),
                             x.at[d].set(u, mode="drop"), x.at[d].max(u, mode="fill"),
                             x.at[d % x.shape[0]].add(u, mode="promise_in_bounds")),
         ["n", "m", "m", "m"], normal("n"), index("m", low="-2*n", high="2*n"),
         distinct("m", high="2*n"), normal("m"), sizes=SIZES_UNIQUE),
    case("scatter_rows",
         lambda x, i, u: (x.at[i].set(u), x.at[i].add(u)),
         ["(n, k)", "m", "(m, k)"], normal("n", "k"), distinct("m"), normal("m", "k"),
         sizes=({"n": 2, "m": 1, "k": 3}, {"n": 6, "m": 4, "k": 1}), padded=NMK),
    case("scatter_windows", windows, ["n", "(_, m)", None], normal("n"), normal(2, "m"),
         normal(2, 2), sizes=({"n": 5, "m": 2}, {"n": 7, "m": 1}, {"n": 7, "m": 3}),
         padded={"n": 8, "m": 3}, constraints=("n >= m", "n >= 2")),
    # segments, one_hot, bincount
    case("segment_ops", segments, ["n", "(n, _)", "n", "m"], normal("n"), normal("n", 2),
         index("n", low=-1, high="m + 2"), normal("m")),
    case("one_hot_bincount",
         lambda x, ids, k: (jax.nn.one_hot(ids, 5) * x[:, None],
                            jax.nn.one_hot(ids, k.shape[0]) * x[:, None],
                            jnp.bincount(ids, length=5), jnp.bincount(ids, weights=x, length=5),
                            jnp.bincount(ids, weights=x, length=k.shape[0])),
         ["n", "n", "m"], normal("n"), index("n", low=-1, high="m + 2"), normal("m")),
]

CASES_BY_NAME, test_rule = table_test(CASES)


def test_set_into_a_scalar_from_padded_updates_raises():
  dn = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(),
                                   scatter_dims_to_operand_dims=())

  def fun(u):
    return lax.scatter(jnp.float32(0), jnp.zeros((u.shape[0], 0), jnp.int32), u, dn)

  with pytest.raises(pj.MaskingError, match="no index to drop it by"):
    pj.mask(fun, ["n"])([np.ones(4, np.float32)], {"n": 2})
