"""Windows: convolutions, pooling (reduce_window) and their gradients.

Every row runs eagerly, under jit, under vmap over different logical sizes and
under grad (see harness.py), with NaN/inf/huge values in the padding. The
geometry stresses what padding could get wrong: windows that straddle the
logical end (SAME, explicit high padding), low padding that depends on the
size (SAME with strides), strides that leave a remainder, dilations, groups,
and kernels of dynamic size (the weight gradient convolves with the output
cotangent, so every grad row exercises one), and inf, NaN and ties in the
valid region where padded taps or padded window entries could meet them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import Case, ints, make, normal, table_test

FORWARD = ("eager", "jit", "vmap")
SIZES = ({"n": 3}, {"n": 8})
SIZES_1 = ({"n": 1}, {"n": 6})
AT_LEAST_3 = ("n >= 3",)
HW = {"h": 7, "w": 6}
SIZES_HW = ({"h": 3, "w": 6}, {"h": 7, "w": 2})


def conv1d(*, strides=(1,), padding="SAME", **kw):
  """A 1-D convolution NCW x OIW, the kernel fixed."""
  def fun(x, w):
    return lax.conv_general_dilated(x, w, strides, padding, **kw)
  return fun


def conv_case(name, fun, *, x=(2, 3, "n"), w=(4, 3, 3), sizes=SIZES_1, **kw):
  spec = "(" + ", ".join(d if isinstance(d, str) else "_" for d in x) + ")"
  return Case(name, fun, [spec, None], make(normal(*x), normal(*w)), sizes=sizes, **kw)


def with_inf_at_end(*shape):
  """Normal data whose last valid entry along the last axis is inf."""
  base = normal(*shape)

  def gen(rng, sizes):
    x = base(rng, sizes)
    x[..., -1] = np.inf
    return x
  return gen


def specials(*shape):
  """Ties, NaN, and -inf (what max pooling's padding holds) in the valid region."""
  values = np.array([np.nan, -np.inf, np.inf, -1.0, 0.0, 0.0, 2.0, 2.0], np.float32)
  index = ints(*shape, low=0, high=len(values))
  return lambda rng, s: values[index(rng, s)]


def vec(name, fun, piece=normal, sizes=SIZES_1, **kw):
  """A case of a function of one vector of length n."""
  return Case(name, fun, ["n"], make(piece("n")), sizes=sizes, **kw)


def conv_full_symbolic(x, v):
  """numpy's 'full' convolution of two vectors, with the padding v.shape - 1.

  lax.conv_general_dilated refuses symbolic padding, so this binds the
  primitive, as the transposes of convolutions do.
  """
  k = v.shape[0]
  out = lax.conv_general_dilated_p.bind(
      x[None, None], v[::-1][None, None], window_strides=(1,), padding=((k - 1, k - 1),),
      lhs_dilation=(1,), rhs_dilation=(1,),
      dimension_numbers=lax.ConvDimensionNumbers((0, 1, 2), (0, 1, 2), (0, 1, 2)),
      feature_group_count=1, batch_group_count=1, precision=None,
      preferred_element_type=None, out_sharding=None)
  return out[0, 0]


def np_conv(a, v, mode, correlate=False):
  """jnp.convolve / jnp.correlate for len(a) >= len(v), written with lax.

  The computation jnp.convolve performs (test_np_conv_is_jnp_convolve), as the
  rows of the convolution rule; jnp.convolve itself is replaced while polyjit
  traces (tests/test_index_helpers_convolve_dynamic.py).
  """
  k = v.shape[0]
  v = jnp.conj(v) if correlate else v[::-1]
  padding = {"full": [(k - 1, k - 1)], "same": [(k // 2, k - k // 2 - 1)],
             "valid": [(0, 0)]}[mode]
  return lax.conv_general_dilated(a[None, None], v[None, None], (1,), padding)[0, 0]


def cnn_step(x, w1, w2):
  """The gradient of a small 1-D CNN's loss (a training step inside the mask)."""
  def loss(params):
    w1, w2 = params
    h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1,), "SAME"))
    h = max_pool(h, (1, 1, 2), (1, 1, 2), "SAME")
    h = lax.conv_general_dilated(h, w2, (2,), "SAME", rhs_dilation=(2,))
    return jnp.mean(h ** 2)
  return jax.grad(loss)((w1, w2))


def max_pool(x, window, strides, padding):
  return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)


def avg_pool_exclude_pad(x):
  """flax's avg_pool(count_include_pad=False): sums over counts of real entries."""
  sums = lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
  counts = lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1),
                             "SAME")
  return sums / counts


def argmax_pool(x):
  """A two-operand lax.reduce_window: (max, its index) per window."""
  def select(a, b):
    take_a = a[0] >= b[0]
    return lax.select(take_a, a[0], b[0]), lax.select(take_a, a[1], b[1])
  index = lax.iota(jnp.int32, x.shape[0])
  return lax.reduce_window((x, index), (-jnp.inf, jnp.int32(0)), select, (3,), (2,), "SAME")


CASES = [
    # convolution, 1-D
    Case("conv_valid_inf_in_data", conv1d(padding="VALID"), ["(_, _, n)", None],
         make(with_inf_at_end(1, 2, "n"), normal(2, 2, 3)), constraints=AT_LEAST_3, sizes=SIZES),
    conv_case("conv_same_stride2_dilated_even_kernel", conv1d(strides=(2,), rhs_dilation=(2,)),
              w=(2, 3, 4)),
    # Two input channels: with three, XLA's CPU convolution itself is wrong for this
    # padding at odd lengths (the unpadded reference, not the masked result).
    conv_case("conv_explicit_padding_stride2", conv1d(strides=(2,), padding=[(-1, 2)]),
              x=(2, 2, "n"), w=(4, 2, 3), constraints=("n >= 2",), sizes=({"n": 2}, {"n": 7})),
    conv_case("conv_transpose_same_stride2", lambda x, w: lax.conv_transpose(
        x, w, (2,), "SAME", dimension_numbers=("NCH", "OIH", "NCH"))),
    conv_case("conv_feature_groups", conv1d(strides=(2,), feature_group_count=3), w=(6, 1, 3)),
    Case("conv_dynamic_channels", conv1d(), ["(_, n, _)", "(_, n, _)"],
         make(normal(2, "n", 5), normal(4, "n", 3)), sizes=SIZES),
    Case("conv_dynamic_kernel_inf_in_data", conv1d(), ["(_, _, n)", "(_, _, m)"],
         make(with_inf_at_end(1, 2, "n"), normal(3, 2, "m")),
         sizes=({"n": 3, "m": 1}, {"n": 8, "m": 4}), padded={"n": 8, "m": 5}),
    Case("conv_full_dynamic_kernel", conv_full_symbolic, ["n", "m"],
         make(normal("n"), normal("m")),
         sizes=({"n": 3, "m": 1}, {"n": 6, "m": 5}), padded={"n": 6, "m": 5}),
    # a training step, the gradient inside the mask (its rules are checked above)
    Case("cnn_training_step", cnn_step, ["(_, _, n)", None, None],
         make(normal(2, 2, "n"), normal(3, 2, 3), normal(2, 3, 3)), sizes=SIZES_1,
         modes=("jit",)),
    # convolution, 2-D
    Case("conv2d_nhwc_same_strides", conv1d(strides=(2, 1), padding="SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC")),
         ["(_, h, w, _)", None], make(normal(1, "h", "w", 2), normal(3, 3, 2, 3)),
         sizes=SIZES_HW, padded=HW),
    # numpy-style 1-D convolution (what jnp.convolve / jnp.correlate compute)
    *[Case(f"np_{op}_{mode}", functools.partial(np_conv, mode=mode, correlate=op == "correlate"),
           ["n", None], make(normal("n"), normal(3)), constraints=AT_LEAST_3, sizes=SIZES)
      for op, mode in (("convolve", "full"), ("correlate", "same"))],
    # pooling
    vec("max_pool_explicit_padding", lambda x: max_pool(x, (3,), (2,), [(1, 2)]),
        sizes=({"n": 3}, {"n": 6})),
    vec("max_pool_specials", lambda x: max_pool(x, (3,), (1,), [(0, 2)]), specials,
        sizes=({"n": 4}, {"n": 7})),
    vec("min_pool_explicit_padding",
        lambda x: lax.reduce_window(x, jnp.inf, lax.min, (2,), (3,), [(1, 2)])),
    vec("sum_pool_same_stride2", lambda x: lax.reduce_window(x, 0.0, lax.add, (3,), (2,), "SAME")),
    vec("sum_pool_dilations", lambda x: lax.reduce_window(
        x, 0.0, lax.add, (2,), (1,), [(1, 3)], base_dilation=(2,), window_dilation=(2,))),
    Case("avg_pool_2d_exclude_padding", avg_pool_exclude_pad, ["(_, h, w, _)"],
         make(normal(1, "h", "w", 2)), sizes=SIZES_HW, padded=HW),
    Case("max_pool_2d_same", lambda x: max_pool(x, (1, 3, 2), (1, 2, 2), "SAME"),
         ["(_, h, w)"], make(normal(2, "h", "w")), sizes=SIZES_HW, padded=HW),
    Case("max_pool_jvp",
         lambda x, t: jax.jvp(lambda x: max_pool(x, (3,), (2,), "SAME"), (x,), (t,)),
         ["n", "n"], make(normal("n"), normal("n")), sizes=SIZES_1),
    vec("max_pool_grad_inside",
        jax.grad(lambda x: jnp.sum(max_pool(x, (3,), (2,), [(1, 2)]) ** 2))),
    vec("prod_pool_generic", lambda x: lax.reduce_window(x, 1.0, lax.mul, (2,), (1,), "SAME"),
        modes=FORWARD),  # JAX cannot differentiate the generic lax.reduce_window
    vec("argmax_pool_two_operands", argmax_pool, modes=FORWARD),
    # pad with interior padding (pad's rule lives in layout.py)
    vec("pad_interior", lambda x: lax.pad(x, 0.5, [(-1, 2, 2)])),
]

CASES_BY_NAME, test_rule = table_test(CASES)


# --- jnp.convolve ------------------------------------------------------------

@pytest.mark.parametrize("correlate", [False, True])
@pytest.mark.parametrize("mode", ["full", "same", "valid"])
def test_np_conv_is_jnp_convolve(mode, correlate):
  """The np_* rows compute exactly what jnp.convolve / jnp.correlate compute."""
  rng = np.random.default_rng(0)
  a, v = rng.standard_normal(7).astype(np.float32), rng.standard_normal(3).astype(np.float32)
  expected = (jnp.correlate if correlate else jnp.convolve)(a, v, mode=mode)
  np.testing.assert_allclose(np_conv(jnp.asarray(a), jnp.asarray(v), mode, correlate),
                             expected, rtol=1e-6, atol=1e-6)


# --- refused -------------------------------------------------------------------

def test_pooling_window_of_dynamic_size():
  f = lambda x, y: lax.reduce_window(x, 0.0, lax.add, (y.shape[0],), (1,), "VALID")
  with pytest.raises(pj.MaskingError, match=r"window size along axis 0 \(m\) depends"):
    pj.mask(f, ["n", "m"], constraints=["n >= m"])(
        [np.zeros(8, np.float32), np.zeros(4, np.float32)], {"n": 5, "m": 2})


def test_conv_with_dynamic_grouped_features():
  f = conv1d(feature_group_count=2)
  with pytest.raises(pj.MaskingError, match=r"input feature dimension \(2\*n\) is dynamic"):
    pj.mask(f, ["(_, 2*n, _)", "(_, n, _)"])(
        [np.zeros((1, 8, 5), np.float32), np.zeros((4, 4, 3), np.float32)], {"n": 3})


# --- the transposes supplied at symbolic sizes, checked at fixed sizes ----------

CONV_VJPS = {
    "same_stride2": ((2, 4, 9), (6, 4, 3), dict(window_strides=(2,), padding="SAME")),
    "feature_groups_dilated": ((2, 4, 9), (6, 2, 3), dict(
        window_strides=(2,), padding=[(2, 1)], feature_group_count=2, rhs_dilation=(2,))),
    "batch_groups_lhs_dilated": ((4, 3, 9), (6, 3, 3), dict(
        window_strides=(1,), padding=[(1, 3)], batch_group_count=2, lhs_dilation=(2,))),
    "nhwc_negative_padding": ((2, 9, 7, 4), (3, 3, 2, 6), dict(
        window_strides=(3, 2), padding=[(0, -1), (2, 2)], feature_group_count=2,
        dimension_numbers=("NHWC", "HWIO", "NCHW"))),
}


@pytest.mark.parametrize("name", list(CONV_VJPS))
def test_conv_transposes_match_jax_at_fixed_sizes(name):
  """polyjit's conv transposes (used at symbolic sizes) equal JAX's own."""
  from polyjit._masking.rules import windows
  lhs_shape, rhs_shape, kw = CONV_VJPS[name]
  rng = np.random.default_rng(0)
  x, w = (rng.standard_normal(s).astype(np.float32) for s in (lhs_shape, rhs_shape))
  f = lambda x, w: lax.conv_general_dilated(x, w, **kw)
  y, pullback = jax.vjp(f, x, w)
  ct = rng.standard_normal(y.shape).astype(np.float32)
  dx, dw = pullback(ct)
  params = jax.make_jaxpr(f)(x, w).eqns[0].params
  np.testing.assert_array_equal(windows._conv_transpose_lhs(ct, jax.typeof(x), w, **params), dx)
  np.testing.assert_array_equal(windows._conv_transpose_rhs(ct, x, jax.typeof(w), **params), dw)
