"""One row per primitive family and per jnp/lax/nn function covered.

Every row runs eagerly, under jit, under vmap over different logical sizes,
and under grad (see harness.py), with NaN/inf/huge values in the padding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from harness import Case, bools, const, ints, make, normal, positive, table_test

# JAX cannot reverse-differentiate a while_loop (see test_errors.py).
FORWARD = ("eager", "jit", "vmap")
N = {"n": 8}
NM = {"n": 8, "m": 6}
SIZES_NM = ({"n": 1, "m": 2}, {"n": 3, "m": 6}, {"n": 8, "m": 4})


def vec(fun, *extra, name=None, **kw):
  """A case of a function of one float vector of length n."""
  return Case(name or fun.__name__, fun, ["n"] + [None] * len(extra),
              make(normal("n"), *extra), **kw)


def mat(fun, name, shape=("n", 3), **kw):
  """A case of a function of one float matrix; int dims are fixed ("_")."""
  spec = "(" + ", ".join(d if isinstance(d, str) else "_" for d in shape) + ")"
  return Case(name, fun, [spec], make(normal(*shape)), **kw)


@jax.custom_vjp
def clip_grad(x):
  return jnp.sin(x)


clip_grad.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)),
                 lambda c, g: (jnp.clip(g * c, -0.5, 0.5),))


def rnn(x, w):
  def step(h, xt):
    h = jnp.tanh(w @ h + xt)
    return h, h.sum()
  return lax.scan(step, jnp.zeros(3), x)


def rnn_reverse(x, w):
  def step(h, xt):
    h = jnp.tanh(w @ h + xt)
    return h, h[0]
  return lax.scan(step, jnp.ones(3), x, reverse=True)


def fori_sum(x):
  return lax.fori_loop(0, x.shape[0], lambda i, c: c + x[i] * i, 0.0)


def attention(x, wq, wk, wv):
  q, k, v = x @ wq, x @ wk, x @ wv
  return jax.nn.softmax(q @ k.T / 2.0, axis=-1) @ v


CASES = [
    # elementwise
    vec(jnp.sin), vec(jnp.exp), vec(jnp.tanh), vec(jax.nn.sigmoid, name="logistic"),
    vec(lambda x: jnp.log(jnp.abs(x)), name="log_abs"),
    vec(lambda x: x ** 3, name="integer_pow"),
    vec(lambda x: jnp.clip(x, -0.5, 0.5), name="clamp"),
    vec(lambda x: jnp.where(x > 0, x, 2 * x), name="select_n"),
    vec(lambda x: (x * 3).astype(jnp.int32), name="convert_element_type"),
    vec(jax.scipy.special.erf, name="erf"),
    Case("binary_ops", lambda x, y: (x + y, x * y, x - y, x / y, jnp.maximum(x, y), x ** 2 / y),
         ["n", "n"], make(normal("n"), positive("n"))),
    Case("comparisons", lambda x, y: (x < y, x == y, x >= y), ["n", "n"],
         make(ints("n"), ints("n"))),
    Case("int_arith", lambda x, y: (x // y, x % y, x * y, x ^ y, x >> 1),
         ["n", "n"], make(ints("n"), ints("n", low=1, high=4))),
    Case("bool_logic", lambda a, b: (a & b, a | ~b), ["n", "n"], make(bools("n"), bools("n"))),
    # structural
    Case("broadcast_outer", lambda x, y: x[:, None] * y[None, :], ["n", "m"],
         make(normal("n"), normal("m")), sizes=SIZES_NM, padded=NM),
    vec(lambda x: x * jnp.arange(x.shape[0]), name="iota"),
    vec(lambda x: x * x.shape[0] + x.shape[0] ** 2, name="dim_as_value"),
    mat(lambda x: x.T, "transpose"),
    mat(lambda x: jnp.expand_dims(x, 1)[:, 0, :] * 2, "expand_squeeze"),
    mat(lambda x: x.reshape(-1) * 2, "reshape_merge"),
    vec(lambda x: jnp.stack([x, -x], axis=1).reshape(-1), name="reshape_interleave"),
    Case("reshape_split", lambda x: x.reshape(-1, 3).sum(1), ["3*n"], make(normal("3*n"))),
    vec(lambda x: jnp.stack([x, x * 2]), name="stack_axis0"),
    vec(lambda x: jnp.stack([x, x * 2], axis=1), name="stack_axis1"),
    # reductions
    vec(jnp.sum), vec(jnp.prod), vec(jnp.max), vec(jnp.min), vec(jnp.mean), vec(jnp.var),
    vec(jnp.std), vec(jnp.argmax), vec(jnp.argmin), vec(jnp.linalg.norm, name="norm"),
    vec(jax.nn.logsumexp, name="logsumexp"), vec(jax.nn.softmax, name="softmax"),
    vec(lambda x: jnp.argmax(jnp.floor(x)), name="argmax_ties"),
    Case("int_reductions", lambda x: (x.sum(), x.max(), x.min(), x.prod(), jnp.argmax(x)),
         ["n"], make(ints("n"))),
    Case("bool_reductions", lambda a: (a.all(), a.any(), a.sum()), ["n"], make(bools("n"))),
    Case("reduce_xor", lambda x: lax.reduce(x, np.int32(0), lax.bitwise_xor, (0,)), ["n"],
         make(ints("n", low=0, high=100))),
    mat(lambda x: (x.sum(0), x.max(1), x.mean()), "reduce_axes"),
    mat(lambda x: (x.sum(1), x.max(0)), "reduce_axes_minor", shape=(3, "n")),
    # contractions
    Case("matvec", lambda x, w: x @ w, ["(n, _)", None], make(normal("n", 3), normal(3, 4))),
    Case("gram", lambda x: x.T @ x, ["(n, _)"], make(normal("n", 3))),
    Case("dot_vectors", jnp.dot, ["n", "n"], make(normal("n"), normal("n"))),
    Case("einsum_batch", lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
         ["(b, n, _)", "(b, _, n)"], make(normal("b", "n", 2), normal("b", 2, "n")),
         sizes=({"b": 1, "n": 2}, {"b": 3, "n": 5}), padded={"b": 4, "n": 6}),
    Case("attention", attention, ["(n, _)", None, None, None],
         make(normal("n", 4), normal(4, 4), normal(4, 4), normal(4, 4))),
    # cumulative
    vec(jnp.cumsum), vec(jnp.cumprod),
    vec(lambda x: lax.cumsum(x, reverse=True), name="cumsum_reverse"),
    vec(lambda x: lax.cumprod(x, reverse=True), name="cumprod_reverse"),
    vec(lambda x: (lax.cummax(x), lax.cummax(x, reverse=True)), name="cummax"),
    vec(lambda x: (lax.cummin(x), lax.cummin(x, reverse=True)), name="cummin"),
    vec(lambda x: (lax.cumlogsumexp(x), lax.cumlogsumexp(x, reverse=True)), name="cumlogsumexp"),
    mat(lambda x: lax.cumsum(x, axis=0, reverse=True), "cumsum_reverse_2d"),
    # indexing
    vec(lambda x: x[0], name="index_first"), vec(lambda x: x[-1], name="index_last"),
    vec(lambda x, i: x[i], const(np.int32(2)), name="index_traced",
        sizes=({"n": 3}, {"n": 6})),
    vec(lambda x, i: x[i], const(np.int32(-2)), name="index_negative",
        sizes=({"n": 2}, {"n": 6})),
    vec(lambda x, i: x[i], const(np.int32(5)), name="index_past_end_clamps",
        sizes=({"n": 2}, {"n": 4})),
    vec(lambda x: x[1:], name="slice_tail", sizes=({"n": 2}, {"n": 6})),
    vec(lambda x: x[:-1], name="slice_head", sizes=({"n": 2}, {"n": 6})),
    vec(lambda x: x[::-1], name="reverse_slice"), vec(jnp.flip, name="flip"),
    vec(lambda x: x[x.shape[0] // 2:], name="slice_half", sizes=({"n": 2}, {"n": 5})),
    vec(lambda x: x[::2], name="slice_stride"),
    Case("slice_from_other_dim", lambda x, y: x[y.shape[0]:] * 2, ["n", "m"],
         make(normal("n"), normal("m")), constraints=("n >= m",),
         sizes=({"n": 3, "m": 1}, {"n": 6, "m": 4}, {"n": 8, "m": 6}), padded=NM),
    vec(jnp.diff, name="diff", sizes=({"n": 2}, {"n": 6})),
    mat(lambda x: x[-1] + x[0], "index_rows"),
    mat(lambda x: x[::-1, ::-1], "reverse_2d", shape=("n", 3)),
    vec(lambda x, i: lax.dynamic_slice(x, (i,), (2,)), const(np.int32(4)), name="dynamic_slice",
        sizes=({"n": 2}, {"n": 5}, {"n": 8}), constraints=("n >= 2",)),
    vec(lambda x, i: lax.dynamic_update_slice(x, jnp.ones(2), (i,)), const(np.int32(5)),
        name="dynamic_update_slice", sizes=({"n": 2}, {"n": 6}), constraints=("n >= 2",)),
    vec(lambda x, idx: x[idx], const(np.array([0, 2, -1, 7], np.int32)), name="gather_indices",
        sizes=({"n": 3}, {"n": 8})),
    vec(lambda x, idx: jnp.take(x, idx, mode="fill", fill_value=-1.0),
        const(np.array([0, 2, 5, -1], np.int32)), name="take_fill", sizes=({"n": 3}, {"n": 7})),
    vec(lambda x, idx: jnp.take(x, idx, mode="clip"),
        const(np.array([0, 2, 9, -3], np.int32)), name="take_clip", sizes=({"n": 3}, {"n": 7})),
    Case("gather_by_padded_indices", lambda x, idx: x[idx], [None, "m"],
         make(normal(5), ints("m", low=0, high=5)),
         sizes=({"m": 1}, {"m": 4}), padded={"m": 6}),
    vec(lambda x: x.at[1].add(5.0), name="scatter_add_index"),
    vec(lambda x: x.at[-1].set(5.0), name="scatter_set_last"),
    vec(lambda x, idx: x.at[idx].add(1.0), const(np.array([0, 2, 9], np.int32)),
        name="scatter_add_oob_dropped", sizes=({"n": 3}, {"n": 8})),
    vec(lambda x: jnp.concatenate([x, 2 * x]), name="concatenate_self"),
    Case("concatenate_two", lambda x, y: jnp.concatenate([x, y, x[:1]]), ["n", "m"],
         make(normal("n"), normal("m")), sizes=SIZES_NM, padded=NM),
    Case("concatenate_2d", lambda x, y: jnp.concatenate([x, y], axis=0), ["(n, _)", "(m, _)"],
         make(normal("n", 2), normal("m", 2)), sizes=SIZES_NM, padded=NM),
    vec(lambda x: jnp.pad(x, (2, 3), constant_values=7.0), name="pad_constant"),
    # control flow
    vec(jax.jit(lambda x: jnp.sin(x).sum()), name="jit_inside"),
    vec(jax.nn.relu, name="custom_jvp_relu"), vec(jax.nn.softplus, name="softplus"),
    vec(jax.nn.gelu, name="gelu"),
    vec(clip_grad, name="custom_vjp"),
    vec(jax.checkpoint(lambda x: jnp.sin(x).cumsum()), name="remat"),
    vec(lambda x: lax.cond(x[0] > 0, lambda y: y.sum(), lambda y: y.max(), x), name="cond"),
    vec(fori_sum, name="fori_loop_to_n", modes=FORWARD),
    vec(lambda x: lax.while_loop(lambda c: c[0] < x.shape[0],
                                 lambda c: (c[0] + 1, c[1] + x[c[0]] ** 2), (0, 0.0))[1],
        name="while_to_n", modes=FORWARD),
    Case("scan_rnn", rnn, ["(n, _)", None], make(normal("n", 3), normal(3, 3))),
    Case("scan_rnn_reverse", rnn_reverse, ["(n, _)", None], make(normal("n", 3), normal(3, 3))),
    vec(lambda x: lax.scan(lambda c, a: (c * 0.9 + a, c), 0.0, x), name="scan_carry_and_ys"),
    vec(lambda x: lax.scan(lambda c, _: (c + x.sum(), None), 0.0, None, length=3)[0],
        name="scan_static_length"),
    vec(lambda x: jax.grad(lambda x: jnp.var(x) + jnp.sum(jnp.sin(x)))(x), name="grad_inside"),
    vec(lambda x: jax.vmap(lambda r: r * x)(x).sum(0), name="vmap_inside"),
]

# The vmap check runs jax.vmap eagerly for the first row of each section (the
# others under jax.jit: harness.py).
EAGER_VMAP = ("sin", "broadcast_outer", "sum", "matvec", "cumsum", "index_first", "jit_inside")
CASES_BY_NAME, test_rule = table_test(CASES, eager_vmap=EAGER_VMAP)
