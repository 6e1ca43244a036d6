"""Layout: pad, reshape, split, tile, repeat and roll on dynamic axes.

One row per primitive configuration and per jnp function covered; every row
runs eagerly, under jit, under vmap over different logical sizes, and under
grad, with NaN/inf/huge values in the padding (see harness.py). The tests at
the end check what is refused, and that it is refused with a MaskingError.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import Case, check, const, ints, make, normal, table_test

FORWARD = ("eager", "jit", "vmap")
NM = {"n": 8, "m": 6}
# Two logical sizes per row keep the file fast; with the rows that name their
# own, they cover a size of 1, sizes in between and the padded size.
SIZES_N = ({"n": 1}, {"n": 6})
SIZES_NM = ({"n": 1, "m": 6}, {"n": 7, "m": 2})


def vec(fun, name, **kw):
  """A case of a function of one float vector of length n."""
  return Case(name, fun, ["n"], make(normal("n")), **{"sizes": SIZES_N, **kw})


def mat(fun, name, shape, **kw):
  """A case of a function of one float matrix; int dims are fixed ("_")."""
  spec = "(" + ", ".join(d if isinstance(d, str) else "_" for d in shape) + ")"
  dims = {d for d in shape if isinstance(d, str)}
  kw = {"sizes": SIZES_NM, "padded": NM, **kw} if "m" in dims else {"sizes": SIZES_N, **kw}
  return Case(name, fun, [spec], make(normal(*shape)), **kw)


def two(fun, name, **kw):
  """A case of a function of two float vectors, of lengths n and m."""
  return Case(name, fun, ["n", "m"], make(normal("n"), normal("m")),
              sizes=SIZES_NM, padded=NM, **kw)


def ends_padder(row, pad_width, axis, kwargs):
  """A jnp.pad mode function: -1 before the data, +1 after it."""
  return row.at[:pad_width[0]].set(-1.0).at[row.shape[0] - pad_width[1]:].set(1.0)


CASES = [
    # lax.pad: static configurations on a dynamic axis
    vec(lambda x: lax.pad(x, 1.5, [(1, 2, 1)]), "pad_interior"),
    vec(lambda x: (lax.pad(x, 0.5, [(-1, -2, 0)]), lax.pad(x, 0.5, [(-1, -1, 2)])),
        "pad_negative", sizes=({"n": 3}, {"n": 7}), constraints=("n >= 3",)),
    Case("pad_value_argument", lambda x, c: lax.pad(x, c, [(2, 1, 1)]), ["n", None],
         make(normal("n"), normal()), sizes=({"n": 2}, {"n": 8})),
    # lax.pad: sizes that depend on a dimension
    vec(lambda x: (lax.pad(x, 2.0, [(x.shape[0], 1, 0)]),
                   lax.pad(x, 2.0, [(1, x.shape[0], 0)])), "pad_low_high_size"),
    vec(lambda x: (lax.pad(x, 2.0, [(-(x.shape[0] // 2), 1, 0)]),
                   lax.pad(x, 2.0, [(0, -(x.shape[0] // 2), 0)])), "pad_negative_size"),
    vec(lambda x: lax.pad(x, 2.0, [(1, 0, x.shape[0])]), "pad_interior_size",
        sizes=({"n": 2}, {"n": 5})),
    two(lambda x, y: lax.pad(x, 0.5, [(y.shape[0], 1, 1)]), "pad_low_other_dim"),
    two(lambda x, y: lax.pad(x, 0.5, [(y.shape[0], 1, x.shape[0] - 1)]),
        "pad_low_and_interior_size", modes=FORWARD),
    Case("pad_fixed_operand_low_size", lambda w, x: lax.pad(w, 1.0, [(x.shape[0], 2, 1)]),
         [None, "n"], make(normal(3), normal("n")), sizes=SIZES_N),
    mat(lambda x: lax.pad(x, 0.5, [(1, -1, 1), (x.shape[0], 2, 0)]), "pad_2d", ("n", "m")),
    # jnp.pad modes
    vec(lambda x: (jnp.pad(x, (2, 3), constant_values=(1.0, -1.0)),
                   jnp.pad(x, (x.shape[0], 1))), "jnp_pad_constant"),
    vec(lambda x: jnp.pad(x, (2, 3), mode="edge"), "jnp_pad_edge"),
    vec(lambda x: (jnp.pad(x, (2, 1), mode="reflect"),
                   jnp.pad(x, (1, 2), mode="reflect", reflect_type="odd")),
        "jnp_pad_reflect", sizes=({"n": 3}, {"n": 8}), constraints=("n >= 3",)),
    vec(lambda x: jnp.pad(x, (2, 3), mode="symmetric"), "jnp_pad_symmetric",
        sizes=({"n": 3}, {"n": 8}), constraints=("n >= 3",)),
    vec(lambda x: (jnp.pad(x, (2, 1), mode="linear_ramp", end_values=(1.0, -1.0)),
                   jnp.pad(x, (2, 1), mode="empty")[2:-1]), "jnp_pad_linear_ramp_empty"),
    vec(lambda x: (jnp.pad(x, (2, 1), mode="maximum"), jnp.pad(x, 1, mode="mean")),
        "jnp_pad_stats"),
    vec(lambda x: jnp.pad(x, (2, 1), mode=ends_padder), "jnp_pad_callable"),
    vec(lambda x: jnp.pad(x, (1, 2), mode="minimum", stat_length=2), "jnp_pad_stat_length",
        sizes=({"n": 2}, {"n": 5}), constraints=("n >= 2",)),
    # reshapes that merge or split a dynamic axis behind another one
    Case("reshape_2n_3n", lambda x, y: (x.reshape(-1), y.reshape(-1)), ["(_, n)", "(_, n)"],
         make(normal(2, "n"), normal(3, "n")), sizes=SIZES_N),
    mat(lambda x: x.reshape(-1), "reshape_nm", ("n", "m")),
    mat(lambda x: x.reshape(x.shape[1], x.shape[0]), "reshape_transposing", ("n", "m")),
    mat(lambda x: (x.reshape(-1) * 2).reshape(x.shape), "reshape_round_trip", ("n", "m")),
    Case("reshape_batch_3n", lambda x: x.reshape(x.shape[0], -1), ["(b, _, n)"],
         make(normal("b", 3, "n")), sizes=({"b": 1, "n": 2}, {"b": 3, "n": 5}),
         padded={"b": 4, "n": 6}),
    Case("reshape_split_2_n", lambda x: x.reshape(2, -1), ["2*n"], make(normal("2*n")),
         sizes=SIZES_N),
    Case("reshape_split_n_2", lambda x: x.reshape(-1, 2).sum(1), ["2*n"],
         make(normal("2*n")), sizes=SIZES_N),
    mat(lambda x: lax.reshape(x, (3 * x.shape[0],), dimensions=(1, 0)),
        "reshape_dimensions", ("n", 3)),
    # split
    Case("split_even", lambda x: jnp.split(x, 2), ["2*n"], make(normal("2*n")),
         sizes=SIZES_N),
    vec(lambda x: jnp.split(x, [2, 5]), "split_indices",
        sizes=({"n": 5}, {"n": 8}), constraints=("n >= 5",)),
    vec(lambda x: jnp.array_split(x, [x.shape[0] // 2]), "array_split_half"),
    two(lambda x, y: jnp.split(jnp.concatenate([x, y]) * 2, [x.shape[0]]), "split_two_dims"),
    mat(lambda x: jnp.split(x, [2], axis=1), "split_axis1", (3, "n"),
        sizes=({"n": 2}, {"n": 6}), constraints=("n >= 2",)),
    # tile and repeat
    vec(lambda x: (jnp.tile(x, 3), jnp.repeat(x, 3)), "tile_repeat"),
    mat(lambda x: jnp.tile(x, (2, 3)), "tile_2d", ("n", 2)),
    Case("tile_by_size", lambda w, x: jnp.tile(w, x.shape[0]), [None, "n"],
         make(normal(3), normal("n")), sizes=SIZES_N),
    mat(lambda x: jnp.repeat(x, 2, axis=1), "repeat_axis1", (3, "n")),
    vec(lambda x: jnp.repeat(x, x.shape[0]), "repeat_by_size"),
    Case("repeat_array", lambda x, r: jnp.repeat(x, r, total_repeat_length=10),
         ["n", "n"], make(normal("n"), ints("n", low=0, high=4)), sizes=SIZES_N),
    # roll
    vec(lambda x: (jnp.roll(x, 2), jnp.roll(x, -3), jnp.roll(x, 11)), "roll"),
    mat(lambda x: jnp.roll(x, (1, -2), axis=(0, 1)), "roll_2d", ("n", "m")),
    mat(lambda x: jnp.roll(x, 4), "roll_flattened", (3, "n")),
    # An axis of size n - 2 (found by tests/test_fuzz.py): the shift is taken
    # mod (n - 2), a size that needs the bound on a mod with a shrinking divisor.
    Case("roll_of_a_shrunk_axis", lambda x: (jnp.roll(x[2:], 1), jnp.roll(x[2:], -3)), ["n"],
         make(normal("n")), sizes=({"n": 3}, {"n": 5}, {"n": 8}), constraints=("n >= 3",)),
    # A piece whose size can shrink as n grows (n - mod(-2, n)), reduced: its
    # buffer is an upper bound (MaskEnv.padded), its mask the logical size.
    vec(lambda x: x[(-2) % x.shape[0]:].max() + x[:(-3) % x.shape[0]].sum(), "shrinking_piece"),
    Case("roll_traced", lambda x, s: jnp.roll(x, s), ["n", None],
         make(normal("n"), const(np.int32(-3))), sizes=SIZES_N),
    Case("roll_traced_axis1", lambda x, s: jnp.roll(x, s, axis=1), ["(_, n)", None],
         make(normal(2, "n"), const(np.int32(5))), sizes=SIZES_N),
]

CASES_BY_NAME, test_rule = table_test(CASES)


# --- what is refused ---------------------------------------------------------

def test_gradient_of_a_pad_whose_interior_and_low_depend_on_sizes():
  # JAX's own transpose of such a pad fails at symbolic shapes (it cannot show
  # that the strided slice it emits has the operand's size): the symbolic
  # gradient path refuses it. JAX differentiates the masked evaluation (at
  # padded shapes) on the native path (issue 32), which computes it exactly.
  f = lambda x, y: jnp.sin(lax.pad(x, 0.0, [(y.shape[0], 0, x.shape[0] - 1)])).sum()
  masked = pj.mask(f, ["n", "m"])
  x = np.full(8, np.nan, np.float32)
  x[:3] = [1.0, 2.0, 3.0]
  y = np.full(6, np.inf, np.float32)
  got = jax.grad(lambda x: masked([x, y], {"n": 3, "m": 2}))(x)
  np.testing.assert_allclose(got[:3], jax.grad(f)(x[:3], y[:2]), rtol=1e-6)
  assert np.all(got[3:] == 0)


def test_reshape_beyond_int32_indices():
  masked = pj.mask(lambda x: x.reshape(-1), ["(n, m)"])
  big = jax.ShapeDtypeStruct((2 ** 16, 2 ** 15), jnp.float32)
  with pytest.raises(pj.MaskingError, match="gather over 2147483648 padded entries"):
    jax.eval_shape(lambda x: masked([x], {"n": 3, "m": 2}), big)
