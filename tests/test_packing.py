"""Packing (`pj.Packing`, `PackedRagged`): the planner, and `pj.vmap` over packed rows.

Every op family is checked against each example run alone under `jax.jit`:
the per-example and per-token outputs, and the gradient with respect to the
shared parameters, with NaN and inf written into the unused tail of every
row. Supported families must run packed (no warning); the others must run
unpacked with a `pj.PerformanceWarning` and still be exact, or be refused.
"""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive

import polyjit as pj
from harness import reference_options
from polyjit._ragged.packing import plan_rows

LENGTHS = [5, 1, 9, 13]   # in rows of 16: 13 | 9 5 1; 9 and 13 longer than half a row
# with empty examples: 16 | 13 | 9 5 1, the empty ones placed at the end of the
# full row (their start the next row's first token)
WITH_EMPTY = [5, 0, 1, 9, 13, 16, 0]


def _ffd_reference(lengths, row_length, max_segments=None):
  """First-fit decreasing, one example at a time."""
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  fill, count = [], []
  rows, offsets = [0] * len(lengths), [0] * len(lengths)
  for i in order:
    for r in range(len(fill)):
      if fill[r] + lengths[i] <= row_length and (max_segments is None or count[r] < max_segments):
        break
    else:
      fill.append(0), count.append(0)
      r = len(fill) - 1
    rows[i], offsets[i] = r, fill[r]
    fill[r] += lengths[i]
    count[r] += 1
  return rows, offsets, len(fill)


@pytest.mark.parametrize("max_segments", [None, 1, 2, 3])
def test_planner_is_first_fit_decreasing(max_segments):
  rng = np.random.default_rng(0)
  for _ in range(60):
    row_length = int(rng.integers(1, 40))
    lengths = rng.integers(0, row_length + 1, int(rng.integers(1, 50)))
    rows, offsets, count = plan_rows(lengths, row_length, max_segments)
    want = _ffd_reference(list(lengths), row_length, max_segments)
    assert rows.tolist() == want[0] and offsets.tolist() == want[1] and count == want[2]


def test_planner_refuses_an_example_longer_than_a_row():
  with pytest.raises(pj.ShapeError, match="example 1 has length 9"):
    plan_rows([3, 9], 8)


def test_from_list_packs_and_round_trips():
  rng = np.random.default_rng(1)
  xs = [rng.normal(size=(n, 2)).astype(np.float32) for n in [*LENGTHS, 0]]
  packed = pj.Ragged.from_list(xs, packing=pj.Packing())
  assert isinstance(packed, pj.PackedRagged)
  assert packed.row_length == 16            # the bucket of the longest
  assert packed.num_examples == len(xs) and not packed.nonempty
  for got, want in zip(packed.to_list(), xs, strict=True):
    np.testing.assert_array_equal(got, want)
  real = sum(len(x) for x in xs)
  assert packed.efficiency == real / (packed.rows * 16)
  padded = pj.Ragged.from_list(xs)
  assert padded.efficiency == real / (len(xs) * 16)
  assert packed.efficiency > padded.efficiency
  # equal lengths, equal layout
  again = pj.Ragged.from_list([x + 1 for x in xs], packing=pj.Packing())
  for a, b in [(packed.starts, again.starts), (packed.segments, again.segments)]:
    np.testing.assert_array_equal(a, b)
  capped = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=32, max_segments=2))
  assert np.bincount(np.asarray(capped.starts) // 32).max() <= 2


def test_packing_arguments_are_checked():
  with pytest.raises(ValueError):
    pj.Packing(row_length=0)
  with pytest.raises(TypeError):
    pj.Ragged.from_list([np.zeros(3)], packing=pj.Packing(), batch_buckets=[8])


# --- pj.vmap over packed rows --------------------------------------------------------

def _examples(rng, lengths=LENGTHS):
  return [rng.normal(size=(n, 3)).astype(np.float32) for n in lengths]


def with_data(packed, data):
  """`packed`'s layout around other data: a poisoned copy, or a gradient with
  respect to `packed.data` to read per example with `.to_list()`."""
  return pj.PackedRagged(data, packed.lengths, packed.starts, packed.segments,
                         packed.positions, packed.nonempty)


def assert_each_example_as_alone(fun, w, xs, marked, row_length=16):
  """`pj.vmap(fun, in_axes=(None, 0))` over `xs` packed (several per row, NaN
  and inf in the tails): each example's value, and the gradient of the
  batch's total with respect to each example's tokens, as that example alone
  gives under `jax.jit` (NaN where it does: only the example `marked`). The
  tokens' gradients are where a leak between examples shows: with respect to
  a shared parameter the total's gradient is NaN once one example's is, with
  `jax.vmap` too."""
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=row_length)))
  assert packed.rows < len(xs)   # several examples share a row
  per_example = pj.vmap(fun, in_axes=(None, 0))
  values = jax.jit(lambda data: per_example(w, with_data(packed, data)))(packed.data)
  grad = jax.jit(jax.grad(lambda data: jnp.sum(per_example(w, with_data(packed, data)))))(
      packed.data)
  grads = with_data(packed, grad).to_list()
  alone = jax.jit(lambda w, xs: [(fun(w, x), jax.grad(fun, argnums=1)(w, x)) for x in xs])(
      w, xs)
  for i, (value, want) in enumerate(alone):
    np.testing.assert_allclose(values[i], value, rtol=2e-5, atol=2e-5, err_msg=str(i))
    np.testing.assert_allclose(grads[i], want, rtol=1e-4, atol=1e-4, err_msg=str(i))
  assert all(np.isfinite(v) and np.isfinite(g).all()
             for i, (v, g) in enumerate(alone) if i != marked)


def _poison(packed):
  """The packed batch with NaN and inf in the unused tail of every row."""
  valid = np.asarray(packed.valid())
  def fill(x):
    x = np.array(x)
    bad = np.where(np.arange(x[~valid].size).reshape(x[~valid].shape) % 2, np.nan, np.inf)
    x[~valid] = bad.astype(x.dtype) if np.issubdtype(x.dtype, np.floating) else 7
    return jnp.asarray(x)
  return with_data(packed, jax.tree.map(fill, packed.data))


def _loss(out):
  """A scalar of every output, with cotangents that differ per entry."""
  total = 0.0
  for leaf in jax.tree.leaves(out, is_leaf=lambda x: isinstance(x, (pj.PackedRagged, pj.Ragged))):
    if isinstance(leaf, (pj.PackedRagged, pj.Ragged)):
      data = jnp.sin(leaf.data.astype(jnp.float32))
      total = total + jnp.sum(jnp.where(leaf._mask_like(data), data, 0))
    else:
      total = total + jnp.sum(jnp.sin(jnp.asarray(leaf, jnp.float32)))
  return total


def _example_loss(out):
  return sum(jnp.sum(jnp.sin(jnp.asarray(o, jnp.float32))) for o in jax.tree.leaves(out))


def _per_example(out, i):
  return [o.to_list()[i] if isinstance(o, (pj.PackedRagged, pj.Ragged)) else np.asarray(o)[i]
          for o in jax.tree.leaves(out, is_leaf=lambda x: isinstance(x, (pj.PackedRagged,
                                                                           pj.Ragged)))]


def _check(fun, w, xs, row_length=16, expect_warning=False, tol=2e-5):
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=row_length)))
  vmapped = pj.vmap(fun, in_axes=(None, 0))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    # one program for the outputs and the gradient (the tests' time is compiling)
    (value, out), grad = jax.jit(jax.value_and_grad(
        lambda w: (lambda out: (_loss(out), out))(vmapped(w, packed)), has_aux=True))(w)
  warned = [c for c in caught if issubclass(c.category, pj.PerformanceWarning)]
  assert bool(warned) == expect_warning, [str(c.message) for c in warned]

  def one(w, x):   # each example alone, at its own shape: its value, loss and gradient
    return fun(w, x), *jax.value_and_grad(lambda w: _example_loss(fun(w, x)))(w)

  # under one jax.jit: one program holding each example's computation apart
  # (its loss too: op by op, each output's sin and sum compiled at each shape),
  # compiled with the references' options (tests/harness.py)
  refs = jax.jit(lambda w, xs: [one(w, x) for x in xs],
                 compiler_options=reference_options())(w, list(xs))
  for i, (want, _, _) in enumerate(refs):
    for g, r in zip(_per_example(out, i), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(g, r, rtol=tol, atol=tol)
  want_grad = sum(r[2] for r in refs)
  # finite where each example's own is (an empty example's mean is NaN, and
  # so is its gradient through a shared parameter, under jax.jit too)
  np.testing.assert_array_equal(np.isfinite(grad), np.isfinite(want_grad))
  assert np.any(np.isfinite(grad))
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(value, sum(r[1] for r in refs), rtol=1e-4)
  return out


def _positions(n, width=4):
  pos = jnp.arange(n, dtype=jnp.float32)[:, None]
  freq = jnp.exp(-np.log(100.0) * jnp.arange(0, width, 2, dtype=jnp.float32) / width)
  return jnp.concatenate([jnp.sin(pos * freq), jnp.cos(pos * freq)], -1)


def _layer_norm(h, scale, bias):
  mean = jnp.mean(h, axis=-1, keepdims=True)
  var = jnp.maximum(jnp.mean(jnp.square(h), axis=-1, keepdims=True) - mean ** 2, 0.0)
  return (h - mean) * lax.rsqrt(var + 1e-6) * scale + bias


def _multihead(w, x):
  """Two heads of width 2, as Flax's attention lays them out: scores (heads, n, n)."""
  q = (x @ w).reshape(x.shape[0], 2, 2)
  k = jnp.tanh(x @ w).reshape(x.shape[0], 2, 2)
  scores = jnp.einsum("qhd,khd->hqk", q, k)
  return jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), q).reshape(-1, 4)


def _scan(w, x):
  def step(c, xt):
    c = jnp.tanh(c + xt @ w)
    return c, c
  final, hs = lax.scan(step, jnp.zeros(4) + jnp.mean(x), x)
  return final, hs


def _reverse_scan(w, x):
  step = lambda c, xt: (jnp.tanh(c * 0.5 + xt @ w), jnp.log1p(c ** 2))
  return lax.scan(step, jnp.ones(4), x, reverse=True)[1]


def _reads_x_i(w, x):
  """Loops over the example whose step reads `x[i]` (and the length): the
  token at the counter, backwards, at half the counter, clamped past the end."""
  n = x.shape[0]
  forward = lax.fori_loop(0, n, lambda i, c: jnp.tanh(c + x[i] @ w), jnp.zeros(4))
  backward = lax.fori_loop(0, n, lambda i, c: jnp.tanh(c * 0.5 + x[n - 1 - i] @ w / n),
                           jnp.ones(4) * jnp.mean(x))
  def step(c, xt):
    i, h = c
    h = jnp.tanh(h + (x[i // 2] + x[i + 3] * xt[0]) @ w)
    return (i + 1, h), h[:2]
  (_, final), hs = lax.scan(step, (0, jnp.zeros(4)), x)
  return forward, backward, final, hs


# One row per op family the packed layout runs, each written for one example
# `x` (n, 3) with shared parameters `w` (3, 4).
PACKED = {
    "elementwise": lambda w, x: jnp.tanh(x) * 2 + jnp.log1p(x ** 2) - jnp.exp(-jnp.abs(x)),
    "broadcast_example_values": lambda w, x: (x - jnp.mean(x, axis=0)) / jnp.linalg.norm(x),
    "sum_mean": lambda w, x: (jnp.sum(x * w[:, 0]), jnp.mean(x, axis=0), jnp.mean(x)),
    "max_min": lambda w, x: (jnp.max(x, axis=0) * w[0, :3], jnp.min(x), jnp.max(jnp.round(x))),
    "argmax": lambda w, x: (jnp.argmax(x, axis=0), jnp.argmin(x[:, 1]), jnp.sum(x @ w),
                            jnp.max(jnp.floor(x * 3).astype(jnp.int32), axis=0)),
    "logsumexp_softmax": lambda w, x: (jax.nn.logsumexp(x @ w, axis=0),
                                       jax.nn.softmax(x @ w, axis=0)),
    "norms_var": lambda w, x: (jnp.linalg.norm(x @ w, axis=0), jnp.var(x, axis=0),
                               jnp.std(x @ w)),
    "contraction_free_axis": lambda w, x: jax.nn.relu(x @ w + 0.1) @ w.T,
    "pooling_head": lambda w, x: jnp.tanh(jnp.mean(jax.nn.gelu(x @ w), axis=0)) @ w[0],
    "positions": lambda w, x: (x * jnp.arange(x.shape[0])[:, None], x.shape[0] * jnp.sum(w),
                               (x @ w) + _positions(x.shape[0])),
    "attention_pooling": lambda w, x: jax.nn.softmax(jnp.tanh(x @ w)[:, 0]) @ x,
    # shared biases and scales next to ops with no finite derivative at 0 (the
    # selects each op takes, and which it may leave to the one before)
    "biases_and_norms": lambda w, x: (
        _layer_norm(x @ w, w[0], w[1]),
        jnp.sqrt(jnp.abs(x @ w) + jnp.abs(w[2])) - jnp.maximum(x @ w, -jnp.inf),
        x / (x @ w)[:, :3] + jax.lax.rsqrt(jnp.square(x) + w[0, :3] ** 2),
        jnp.sqrt(jnp.square(x @ w)),   # an operand no select guards yet
        # ops that are 0 at a value: their operand filled with it on the tail
        jnp.sum((jnp.square(x @ w) + 1.0) ** -2 - jnp.exp(x @ w - 1.0), axis=0),
        jnp.sum(jnp.arctan2(x, (x @ w)[:, :3]), axis=0),
        jnp.mean(jax.scipy.special.gammaln(jnp.abs(x @ w) + 1.5)
                 + jnp.log(jnp.square(x @ w) + 0.5)),
        jnp.log(jnp.exp(x @ w) + jnp.abs(w[1])) * jnp.float32(16.0) ** 0.5),
    # sizes as values: on an empty example `x[1:]`'s is -1 in the trace for
    # sizes >= 1, 0 at size 0 (a shared parameter over it: no NaN gradient)
    "sizes_as_values": lambda w, x: (jnp.sum(x[1:] @ w) + w / (x[1:].shape[0] + 1),
                                     x.shape[0] * w[0] + jnp.sum(x)),
    "loops_reading_x_i": _reads_x_i,
    # loops of a fixed length over every token at once (jnp.histogram's
    # bisection, Newton steps), a carry made per example by a step, and the
    # scatter-adds of histograms and bincount
    "histograms_and_fixed_loops": lambda w, x: (
        jnp.histogram(x[:, 0], bins=4, range=(-2.0, 2.0), weights=jnp.tanh(x @ w)[:, 0])[0],
        jnp.bincount(jnp.clip(jnp.round(x[:, 1] * 2 + 3), 0, 5).astype(jnp.int32), length=6),
        lax.fori_loop(0, 3, lambda i, y: y - (y ** 3 + y - (x @ w)[:, 1]) / (3 * y ** 2 + 1),
                      jnp.tanh(x[:, 0])),
        lax.fori_loop(0, 3, lambda i, c: c * 0.5 + jnp.sum(x @ w, axis=0), jnp.zeros(4))),
    # the carry restarted per example, each one's final carry, both directions
    "scans": lambda w, x: (_scan(w, x), jnp.concatenate(
        [_scan(w, x[::-1])[1][::-1], _reverse_scan(w, x)], axis=1)),
}

def _conv(w, x):
  """`lax.conv` along the tokens, SAME padding, a kernel of width 2 (uneven)."""
  kernel = jnp.stack([w.T, jnp.tanh(w.T)], -1)                   # (4, 3, 2)
  return lax.conv_general_dilated(x.T[None], kernel, (1,), "SAME")[0].T


# Position-mixing ops that run through their masking rule, one example per row.
THROUGH_MASKING_RULES = {
    "cumulative": lambda w, x: (jnp.cumsum(x @ w, axis=0), jnp.cumprod(1 + 0.1 * x, axis=0),
                                lax.cummax(x @ w, axis=0)),
    "shifts_and_rolls": lambda w, x: ((x[1:] - x[:-1]) @ w, jnp.roll(x, 1, axis=0) @ w,
                                      jnp.pad(x, ((1, 0), (0, 0)))[:-1] @ w),
    "reverse": lambda w, x: x[::-1] * jnp.arange(x.shape[0])[:, None],
    "contract_ragged_axis": lambda w, x: x.T @ (x @ w),
    "sorting": lambda w, x: (jnp.sort(x @ w, axis=0), jnp.argsort(x[:, 1]),
                             lax.top_k((x @ w)[:, 0], 1)[0], jnp.median(x @ w, axis=0)),
    # never reading across an example's boundary (NaN/inf past it in the row)
    "convolutions": lambda w, x: (jnp.convolve(x[:, 0], w[:, 0], mode="same"),
                                  jnp.convolve(x[:, 1], w[:2, 1], mode="valid"), _conv(w, x)),
    "gathers_at_per_example_indices": lambda w, x: (
        x[jnp.argmax(x[:, 0])] @ w, x[-1] @ w + x[x.shape[0] // 2] @ w,
        jnp.take_along_axis(x, jnp.argsort(x[:, :1], axis=0), axis=0) @ w),
    # FFTs along the example (Bluestein's at the padded size, linear: exact
    # in JAX's derivative), complex values, forward and inverse, real input
    "fourier_transforms": lambda w, x: (
        lambda f: (f.real, f.imag, jnp.abs(jnp.fft.rfft(x[:, 2] * w[0, 0])),
                   jnp.fft.ifft(jnp.fft.fft(jnp.tanh(x @ w), axis=0) * 2.0, axis=0).real))(
        jnp.fft.fft((x @ w)[:, 0] + 1j * x[:, 1])),
    # values longer than the example (no slot in the row holds them)
    "longer_than_the_example": lambda w, x: (jnp.pad(x @ w, ((2, 1), (0, 0))),
                                             jnp.concatenate([x, x[:2] * 2]) @ w),
    # scores (n, n) stay one padded row per example; the rest runs packed
    "attention": lambda w, x: jax.nn.softmax((x @ w) @ (x @ w).T / 2, axis=-1) @ x,
    "multihead_attention": lambda w, x: _multihead(w, x),
    "attention_with_biases": lambda w, x: jax.nn.softmax(
        (x @ w) @ (x @ w + w[0]).T / jnp.sqrt(jnp.float32(4.0)) + w[1, 0]
        - jnp.max(x, axis=1)[None, :] + jnp.sqrt(jnp.square((x @ w) @ (x @ w).T)), axis=-1)
    @ (x / jnp.sum(jnp.abs(x), axis=1)[:, None] + (jnp.square(x) + 1.0) ** -2),
    "causal_attention": lambda w, x: jax.nn.softmax(
        jnp.where(jnp.tril(jnp.ones((x.shape[0],) * 2)) > 0, (x @ w) @ (x @ w).T, -1e9),
        axis=-1) @ x + _positions(x.shape[0])[:, :3],
    # pairs of shifted tokens (sizes n - 1): one padded row per example
    "shifted_scores": lambda w, x: jax.nn.softmax((x[1:] @ w) @ (x[:-1] @ w).T, axis=-1)
    @ x[1:],
    "pairwise_output": lambda w, x: jnp.sum(jnp.abs(x[:, None, :] - x[None, :, :]) @ w, axis=1),
}


UNPACKED_FREE = {**PACKED, **THROUGH_MASKING_RULES}


def _defined_at_size_0(fun, w):
  """Whether jax.jit takes `fun` and its gradient on an empty example."""
  def loss(w, x):
    return jax.value_and_grad(lambda w: _example_loss(fun(w, x)))(w)
  try:
    jax.jit(loss).lower(w, jnp.zeros((0, 3), jnp.float32))
  except (ValueError, IndexError, TypeError):
    return False
  return True


def _lengths_for(fun, w):
  """With empty examples where jax.jit defines `fun` on one (the others:
  `test_empty_examples_where_jax_refuses_the_function`)."""
  return WITH_EMPTY if _defined_at_size_0(fun, w) else LENGTHS


@pytest.mark.parametrize("name", sorted(PACKED))
def test_packed_family_is_exact(name):
  rng = np.random.default_rng(2)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(PACKED[name], w, _examples(rng, _lengths_for(PACKED[name], w)),
         expect_warning=name == "histograms_and_fixed_loops" and _searchsorted_is_opaque())


def _searchsorted_is_opaque():
  """Newer JAX (0.12) writes `jnp.searchsorted` as a `call_hi_primitive`,
  which the packed layout cannot look into: `jnp.histogram` then runs
  unpacked (exact, with a warning)."""
  def names(jaxpr):
    for eqn in jaxpr.eqns:
      yield eqn.primitive.name
      for p in eqn.params.values():
        inner = getattr(p, "jaxpr", p)
        if hasattr(inner, "eqns"):
          yield from names(inner)
  probe = jax.make_jaxpr(lambda x: jnp.searchsorted(x, x))(jnp.zeros(3))
  return "call_hi_primitive" in set(names(probe.jaxpr))


@pytest.mark.parametrize("name", sorted(THROUGH_MASKING_RULES))
def test_position_mixing_family_is_exact(name):
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  fun = THROUGH_MASKING_RULES[name]
  _check(fun, w, _examples(rng, _lengths_for(fun, w)))


def test_outputs_are_what_the_unpacked_batch_gives():
  """Length-dependent outputs come back as a pj.Ragged (shorter, equal and
  longer than the example), as over the padded batch: type, lengths, padded
  shape, to_list; the others stacked; under jax.jit too."""
  rng = np.random.default_rng(4)
  xs = _examples(rng)
  packed_batch = pj.Ragged.from_list(xs, packing=pj.Packing())
  for f in (lambda x: (x[1:] - x[:-1], jnp.tanh(x), jnp.sum(x)),
            lambda x: (jnp.pad(x, ((1, 1), (0, 0))), jnp.max(x))):
    unpacked = pj.vmap(f)(pj.Ragged.from_list(xs))
    with warnings.catch_warnings():
      warnings.simplefilter("error", pj.PerformanceWarning)   # packed, not the fallback
      outs = pj.vmap(f)(packed_batch), jax.jit(pj.vmap(f))(packed_batch)
    _same_as_unpacked(outs, unpacked)


def _same_as_unpacked(outs, unpacked):
  for out in outs:
    assert jax.tree.structure(out) == jax.tree.structure(unpacked)
    for got, want in zip(out, unpacked, strict=True):
      assert type(got) is type(want)
      if isinstance(want, pj.Ragged):
        np.testing.assert_array_equal(got.lengths, want.lengths)
        assert got.data.shape == want.data.shape and got.ragged_axes == want.ragged_axes
        for a, b in zip(got.to_list(), want.to_list(), strict=True):
          np.testing.assert_allclose(a, b, rtol=1e-6)
      else:
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_row_counts_share_programs():
  """Batches of 12 examples whose plans need 9 to 12 rows of 16 run 2 programs under one
  jax.jit (row counts bucketed: 10, 12), not one per count."""
  rng = np.random.default_rng(12)
  batches = [[16] * (rows - 1) + [1] * (13 - rows) for rows in (9, 10, 11, 12)]
  step = jax.jit(pj.vmap(lambda x: jnp.sum(jnp.tanh(x))))
  for packing, want in ((pj.Packing(row_length=16), 2),
                        (pj.Packing(row_length=16, row_buckets=1), 4)):
    with pj.diagnostics.count_compiles() as events:
      for lengths in batches:
        batch = pj.Ragged.from_list([rng.normal(size=n).astype(np.float32)
                                     for n in lengths], packing=packing)
        got = step(batch)
        np.testing.assert_allclose(got, [np.tanh(x).sum() for x in batch.to_list()],
                                   rtol=1e-5)
    assert len(events) == want
    step = jax.jit(pj.vmap(lambda x: jnp.sum(jnp.tanh(x))))   # a fresh cache


def test_rows_added_by_the_row_bucket_stay_exact():
  """3 rows bucketed to 4: a row all tail, whose scan steps must keep the
  gradient finite too (they filled the carry with NaN)."""
  rng = np.random.default_rng(13)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  lengths = [16, 5, 16, 9]
  assert pj.Ragged.from_list(_examples(rng, lengths), packing=pj.Packing(16)).rows == 4
  _check(PACKED["scans"], w, _examples(rng, lengths))


def test_training_step_with_tokens_targets_and_labels():
  """A pytree per example (int tokens, per-token targets), a per-example label,
  an embedding lookup: the mean loss and its gradient."""
  rng = np.random.default_rng(5)
  vocab, width = 11, 4
  params = {"emb": jnp.asarray(rng.normal(size=(vocab, width)).astype(np.float32)),
            "w": jnp.asarray(rng.normal(size=(width, 1)).astype(np.float32))}
  examples = [(rng.integers(0, vocab, n).astype(np.int32), rng.normal(size=n).astype(np.float32))
              for n in LENGTHS]
  labels = jnp.asarray(rng.integers(0, 2, len(LENGTHS)).astype(np.float32))

  def loss(params, example, label):
    tokens, targets = example
    h = jnp.tanh(params["emb"][tokens]) @ params["w"]
    token_loss = jnp.mean((h[:, 0] - targets) ** 2)
    logit = jnp.max(h)
    return token_loss + jnp.log1p(jnp.exp(-logit * label))

  packed = _poison(pj.Ragged.from_list(examples, packing=pj.Packing()))
  step = jax.jit(jax.value_and_grad(
      lambda p: pj.vmap(loss, in_axes=(None, 0, 0))(p, packed, labels).mean()))
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)
    value, grads = step(params)
  one = jax.jit(jax.value_and_grad(loss))
  refs = [one(params, (jnp.asarray(t), jnp.asarray(y)), l)
          for (t, y), l in zip(examples, labels, strict=True)]
  np.testing.assert_allclose(value, np.mean([r[0] for r in refs]), rtol=1e-5)
  for key in params:
    np.testing.assert_allclose(grads[key], sum(r[1][key] for r in refs) / len(refs),
                               rtol=1e-4, atol=1e-6)


# --- what runs unpacked, and what is refused -----------------------------------------

@jax.custom_vjp
def _clip_gradient(x):
  return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))

def _fori(w, x):   # a step that reads the whole sequence (its max), not one token
  return lax.fori_loop(0, x.shape[0], lambda i, c: jnp.tanh(c + jnp.max(x) * x[i] @ w),
                       jnp.zeros(4))


UNPACKED = {
    "fori_loop_reading_the_whole_sequence": _fori,
    "custom_vjp": lambda w, x: jnp.sum(_clip_gradient(x @ w)),
}


@pytest.mark.parametrize("name", sorted(UNPACKED))
def test_unpackable_runs_unpacked_with_a_warning(name):
  rng = np.random.default_rng(6)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(UNPACKED[name], w, _examples(rng), expect_warning=True)


def test_the_warning_names_the_op_and_the_line():
  rng = np.random.default_rng(7)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(_examples(rng), packing=pj.Packing())
  with pytest.warns(pj.PerformanceWarning) as caught:   # (a new function: traced anew)
    pj.vmap(lambda w, x: _fori(w, x), in_axes=(None, 0))(w, packed)
  line = inspect.getsourcelines(_fori)[1] + 1
  assert "'reduce_max'" in str(caught[0].message)   # (in the loop's step)
  assert f"test_packing.py:{line}" in str(caught[0].message)

  def decomposed(x):   # an op inside a library's jax.jit, where JAX keeps no user frame
    return jnp.linalg.qr(x)[1]

  with pytest.warns(pj.PerformanceWarning) as caught:
    pj.vmap(decomposed)(packed)
  line = inspect.getsourcelines(decomposed)[1] + 1
  assert "'qr'" in str(caught[0].message)
  assert f"test_packing.py:{line}" in str(caught[0].message)


@pytest.mark.parametrize("name", ["sizes_as_values", "scans", "attention"])
def test_a_batch_of_empty_examples_only(name):
  rng = np.random.default_rng(15)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(UNPACKED_FREE[name], w, _examples(rng, [0, 0, 0]))


@pytest.mark.parametrize("name", ["max_min", "argmax", "gathers_at_per_example_indices",
                                  "loops_reading_x_i"])
def test_empty_examples_where_jax_refuses_the_function(name):
  """`jnp.max`, `jnp.argmax` and `x[-1]` of an empty example: jax.jit raises,
  and the padded batch poisons that example's outputs (NaN, the int poison)
  and their gradient: the packed batch gives exactly that, packed."""
  rng = np.random.default_rng(8)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  fun = UNPACKED_FREE[name]
  assert not _defined_at_size_0(fun, w)
  xs = _examples(rng, WITH_EMPTY)
  runs = []
  for packing in (pj.Packing(row_length=16), None):
    batch = pj.Ragged.from_list(xs, packing=packing)
    batch = _poison(batch) if packing else batch
    vmapped = pj.vmap(fun, in_axes=(None, 0))
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      runs.append(jax.jit(jax.value_and_grad(
          lambda w: (lambda out: (_loss(out), out))(vmapped(w, batch)), has_aux=True))(w))
    if packing:
      assert not [c for c in caught if issubclass(c.category, pj.PerformanceWarning)]
  ((value, out), grad), ((want_value, want_out), want_grad) = runs
  assert np.isnan(want_value) and np.all(np.isnan(want_grad))   # (poisoned)
  np.testing.assert_array_equal(value, want_value)
  np.testing.assert_array_equal(grad, want_grad)
  # each nonempty example alone, in one program (one jax.jit per length compiled each)
  alone = jax.jit(lambda w, xs: [fun(w, x) for x in xs], compiler_options=reference_options())(
      w, [x for x in xs if len(x)])
  alone = iter(alone)
  for i, x in enumerate(xs):
    for g, r in zip(_per_example(out, i), _per_example(want_out, i), strict=True):
      np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)
    if len(x):
      for g, r in zip(_per_example(out, i), jax.tree.leaves(next(alone)), strict=True):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)


def test_empty_examples_with_per_example_arguments():
  """A per-example label next to the packed tokens: an empty example's path
  runs on its own label; the others' labels get their gradient from the
  packed evaluation alone (the empty path's run for them is discarded)."""
  rng = np.random.default_rng(14)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = _examples(rng, WITH_EMPTY)
  labels = jnp.asarray(rng.normal(size=(len(xs), 4)).astype(np.float32))

  def fun(w, x, label):
    pooled = jnp.mean(x @ w, axis=0)   # NaN on an empty example
    return jnp.sum(jnp.log1p(jnp.square(pooled - label)) + label * w[0]), jnp.tanh(x @ w) * label

  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  vmapped = pj.vmap(fun, in_axes=(None, 0, 0))
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)
    (value, out), grads = jax.jit(jax.value_and_grad(
        lambda w, labels: (lambda out: (_loss(out), out))(vmapped(w, packed, labels)),
        argnums=(0, 1), has_aux=True))(w, labels)
  def one(w, x, label):   # each example alone: its outputs, its loss and gradients
    return fun(w, x, label), jax.value_and_grad(lambda w, l: _example_loss(fun(w, x, l)),
                                                argnums=(0, 1))(w, label)

  # under one jax.jit (a program per example and per length were compiled each)
  alone = jax.jit(lambda w, xs, labels: [one(w, x, labels[i]) for i, x in enumerate(xs)],
                  compiler_options=reference_options())(w, xs, labels)
  refs = [r for _, r in alone]
  for i, x in enumerate(xs):
    for g, r in zip(_per_example(out, i), jax.tree.leaves(alone[i][0]), strict=True):
      np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(value, sum(r[0] for r in refs), rtol=1e-4)
  np.testing.assert_allclose(grads[0], sum(r[1][0] for r in refs), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(grads[1], jnp.stack([r[1][1] for r in refs]), rtol=1e-4,
                             atol=1e-4)


mystery_p = Primitive("mystery_packed")
mystery_p.def_abstract_eval(lambda x: x)
mystery_p.def_impl(lambda x: x)


def test_a_primitive_without_any_rule_is_refused():
  def f(x):
    return mystery_p.bind(x * 2).sum()   # the line the error must point to

  packed = pj.Ragged.from_list(_examples(np.random.default_rng(9)), packing=pj.Packing())
  with pytest.raises(pj.MaskingError) as e:
    pj.vmap(f)(packed)
  assert e.value.primitive == "mystery_packed"
  assert f"test_packing.py:{inspect.getsourcelines(f)[1] + 1}" in e.value.source


def _shapes(jaxpr, out=None):
  out = set() if out is None else out
  for eqn in jaxpr.eqns:
    out.update(tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars)
    for p in eqn.params.values():
      inner = getattr(p, "jaxpr", p)
      if hasattr(inner, "eqns"):
        _shapes(inner, out)
  return out


def _eqns(jaxpr):
  for eqn in jaxpr.eqns:
    yield eqn
    for p in eqn.params.values():
      inner = getattr(p, "jaxpr", p)
      if hasattr(inner, "eqns"):
        yield from _eqns(inner)


def test_contractions_over_the_tokens_are_summed_per_example():
  """`softmax(scores) @ h` (attention pooling) and a narrow `x.T @ y` sum
  each token's product per example: no value goes one padded row per example."""
  rng = np.random.default_rng(11)
  xs = _examples(rng, [5, 1, 9, 13, 3, 2, 7])
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16))
  for name in ("attention_pooling", "contract_ragged_axis"):
    pooled = pj.vmap(UNPACKED_FREE[name], in_axes=(None, 0))
    jaxpr = jax.make_jaxpr(jax.grad(lambda w: pooled(w, packed).sum()))(w)
    assert not [s for s in _shapes(jaxpr.jaxpr) if s[:2] == (len(xs), 16)], name


def test_attention_scores_are_held_per_row():
  """Scores are (rows, row_length, row_length), never one padded row per
  example (examples, row_length, row_length), nor dense over every token, and
  never transposed (the rows lead the contractions that make and use them)."""
  rng = np.random.default_rng(10)
  xs = _examples(rng, [5, 1, 9, 13, 3, 2, 7])
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16))
  attend = pj.vmap(UNPACKED_FREE["multihead_attention"], in_axes=(None, 0))
  jaxpr = jax.make_jaxpr(jax.grad(lambda w: attend(w, packed).sum()))(w)
  shapes = _shapes(jaxpr.jaxpr)
  tokens = packed.rows * 16
  assert (packed.rows, 2, 16, 16) in shapes and packed.rows != len(xs)
  assert (len(xs), 2, 16, 16) not in shapes and (2, tokens, tokens) not in shapes
  moved = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "transpose"
           and np.prod(e.outvars[0].aval.shape) >= packed.rows * 2 * 16 * 16]
  assert not moved, moved
