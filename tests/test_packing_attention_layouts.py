"""Attention spelled in the common ways runs packed, exactly.

Scores (values with two axes along the example) are held per row,
`(rows, ..., row_length, row_length)`, valid on each example's block of the
row: a layout symmetric in the two axes. So a softmax, sum or max along
either axis, a contraction of either axis with the values, a transpose or
`jnp.swapaxes` of the scores, einsum orders of heads and tokens other than
Flax's `hqk`, a causal mask or a bias broadcast over the heads (`mask[None]`,
`jax.nn.dot_product_attention(..., is_causal=True)`, its `mask=` and `bias=`),
and a per-head bias from shared parameters, `(h, 1, 1)` or `(h, n, n)`, all
run on the packed rows with no `pj.PerformanceWarning` (they fell back to the
unpacked run, exact but slow). Checked against each example alone under
`jax.jit`, values and gradients, NaN and inf in the rows' tails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from test_packing import _check, _examples, _lengths_for, _shapes


def _heads(w, x):
  """Queries, keys and values of two heads of width 2: (n, heads, width)."""
  n = x.shape[0]
  return ((x @ w).reshape(n, 2, 2), jnp.tanh(x @ w).reshape(n, 2, 2),
          jnp.sin(x @ w).reshape(n, 2, 2))


def _scores(w, x):
  return (x @ w) @ jnp.tanh(x @ w).T / 2


def _causal(n):
  return jnp.tril(jnp.ones((n, n)))


def _einsum_attention(layout, axis):
  """Scores made with heads and tokens in `layout` (`qhk`: heads between the
  query and the key), the softmax over the key's `axis`, back through the
  same layout."""
  def attend(w, x):
    q, k, v = _heads(w, x)
    scores = jnp.einsum(f"qhd,khd->{layout}", q, k)
    return jnp.einsum(f"{layout},khd->qhd", jax.nn.softmax(scores, axis=axis), v).reshape(-1, 4)
  return attend


def _swapped(w, x):
  q, k, v = _heads(w, x)
  scores = jnp.swapaxes(jnp.einsum("qhd,khd->hkq", q, k), -1, -2)   # (h, q, k)
  return jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), v).reshape(-1, 4)


def _masked_heads(w, x):
  """A causal mask (n, n) broadcast over the heads, two spellings."""
  q, k, v = _heads(w, x)
  n = x.shape[0]
  scores = jnp.einsum("qhd,khd->hqk", q, k)
  by_tril = jnp.where(_causal(n)[None] > 0, scores, -jnp.inf)
  by_positions = jnp.where((jnp.arange(n)[:, None] >= jnp.arange(n)[None, :])[None],
                           scores, -1e9)
  return (jnp.einsum("hqk,khd->qhd", jax.nn.softmax(by_tril, axis=-1), v),
          jnp.einsum("hqk,khd->qhd", jax.nn.softmax(by_positions, axis=-1), q))


def _head_biases(w, x):
  """Per-head biases from shared parameters: `(h, 1, 1)`, ALiBi's slopes
  times relative positions `(h, n, n)`, a table looked up at clipped relative
  positions (T5's), and a mask `(n, n)` times a per-head scale."""
  q, k, v = _heads(w, x)
  n = x.shape[0]
  scores = jnp.einsum("qhd,khd->hqk", q, k)
  at = jnp.arange(n)
  relative = at[None, :] - at[:, None]
  slopes = w[0, :2][:, None, None]
  alibi = slopes * relative
  table = jnp.tanh(w[:2, :])                                   # (h, 4 buckets)
  t5 = table[:, jnp.clip(relative, -2, 1) + 2]                 # (h, n, n)
  scaled = _causal(n) * w[1, :2][:, None, None]
  out = []
  for bias in (slopes, alibi, t5, scaled):
    out.append(jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores + bias, axis=-1), v))
  return out


def _heads_taken_apart(w, x):
  """Scores `(h, n, n)` sliced, indexed and squeezed along the heads, and
  reshaped into groups of heads (as grouped-query attention does)."""
  q, k, v = _heads(w, x)
  scores = jnp.einsum("qhd,khd->hqk", q, k)
  first, second = scores[0], lax.squeeze(lax.slice_in_dim(scores, 1, 2, axis=0), (0,))
  grouped = scores.reshape(1, 2, 1, *scores.shape[1:]).sum(axis=(0, 2))
  return (jax.nn.softmax(first + scores[:1][0] * second, axis=-1) @ x,
          jnp.einsum("hqk,khd->qhd", jax.nn.softmax(grouped, axis=-1), v))


def _totals(w, x):
  """Sums over both axes of the scores (a mean, an attention entropy, per
  head), and an integer maximum along one axis."""
  q, k, v = _heads(w, x)
  n = x.shape[0]
  scores, heads = _scores(w, x), jnp.einsum("qhd,khd->hqk", q, k)
  weights = jax.nn.softmax(scores, axis=-1)
  return (jnp.mean(scores), -jnp.sum(weights * jax.nn.log_softmax(scores, axis=-1)),
          jnp.sum(heads, axis=(1, 2)), jnp.sum(jnp.tanh(heads)),
          jnp.max(jnp.tril(jnp.ones((n, n), jnp.int32)) * jnp.arange(n)[:, None], axis=0))


def _per_example_values(w, x):
  """Scores scaled by the length, shifted by a per-example mean, and a bias
  per head computed from the example `(h, 1, 1)`."""
  q, k, v = _heads(w, x)
  n = x.shape[0]
  heads = jnp.einsum("qhd,khd->hqk", q, k) + jnp.mean(x @ w, axis=0)[:2][:, None, None]
  return (jax.nn.softmax(_scores(w, x) / n, axis=-1) @ x,
          jax.nn.softmax(_scores(w, x) * jnp.sqrt(jnp.float32(n)) - jnp.mean(x), axis=0).T @ x,
          jnp.einsum("hqk,khd->qhd", jax.nn.softmax(heads, axis=-1), v))


def _dot_product_attention(w, x):
  """`jax.nn.dot_product_attention`: causal, with a mask, with a bias."""
  q, k, v = _heads(w, x)
  n = x.shape[0]
  mask = (jnp.arange(n)[:, None] >= jnp.arange(n)[None, :] - 1)[None]   # (1, n, n)
  bias = w[0, :2][:, None, None] * _causal(n)                          # (h, n, n)
  return (jax.nn.dot_product_attention(q, k, v, is_causal=True),
          jax.nn.dot_product_attention(q, k, v, mask=mask),
          jax.nn.dot_product_attention(q, k, v, bias=bias),
          jax.nn.dot_product_attention(q, k, v, bias=bias[0], mask=mask, is_causal=True))


def _flax_attention(w, x):
  """Flax's `nn.dot_product_attention` with its masks: `make_causal_mask`,
  `make_attention_mask` of per-token flags, `combine_masks` (all `(1, n, n)`,
  broadcast over the heads)."""
  nn = pytest.importorskip("flax.linen")
  q, k, v = _heads(w, x)
  causal = nn.make_causal_mask(jnp.ones(x.shape[0]))
  flags = nn.make_attention_mask(x[:, 0] > -1, x[:, 1] > -1)
  return (nn.dot_product_attention(q, k, v, mask=causal),
          nn.dot_product_attention(q, k, v, mask=nn.combine_masks(causal, flags)))


CASES = {
    # along the first axis of the scores: softmax, sum, max, min, the
    # contraction of that axis with the values
    "softmax_over_the_first_axis": lambda w, x: jnp.einsum(
        "qk,qd->kd", jax.nn.softmax(_scores(w, x), axis=0), x),
    "reductions_over_the_first_axis": lambda w, x: (
        jnp.sum(_scores(w, x), axis=0), jnp.max(_scores(w, x), axis=0),
        jnp.min(jnp.tanh(_scores(w, x)), axis=0), jax.nn.logsumexp(_scores(w, x), axis=0)),
    "transposed_scores": lambda w, x: (
        jax.nn.softmax(_scores(w, x).T, axis=-1) @ x,
        jax.nn.softmax(_scores(w, x), axis=-1).T @ (x @ w),
        jnp.tanh(_scores(w, x) + _scores(w, x).T) @ x,
        # the values on the left: the scores the right operand
        ((x @ w).T @ jax.nn.softmax(_scores(w, x), axis=0)).T),
    "swapaxes": _swapped,
    "einsum_qhk": _einsum_attention("qhk", -1),
    "einsum_qkh": _einsum_attention("qkh", 1),
    "einsum_hkq": _einsum_attention("hkq", 1),
    "einsum_khq": _einsum_attention("khq", 0),
    "mask_broadcast_over_heads": _masked_heads,
    "per_head_biases": _head_biases,
    "heads_taken_apart": _heads_taken_apart,
    "totals_over_the_scores": _totals,
    "per_example_values": _per_example_values,
    "dot_product_attention": _dot_product_attention,
    "flax_attention": _flax_attention,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_layout_runs_packed_and_exact(name):
  rng = np.random.default_rng(31)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  fun = CASES[name]
  _check(fun, w, _examples(rng, _lengths_for(fun, w)))


def test_transposed_scores_stay_per_row():
  """Scores transposed (`scores.T`, `jnp.swapaxes`, einsum's `hkq`) stay
  `(rows, ..., row_length, row_length)`: never one padded row per example."""
  import polyjit as pj
  rng = np.random.default_rng(32)
  xs = _examples(rng, [5, 1, 9, 13, 3, 2, 7])
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16))
  assert packed.rows != len(xs)
  for name in ("transposed_scores", "swapaxes", "einsum_hkq", "mask_broadcast_over_heads",
               "dot_product_attention"):
    attend = pj.vmap(CASES[name], in_axes=(None, 0))
    loss = lambda w: sum(jnp.sum(o) for o in jax.tree.leaves(attend(w, packed)))
    shapes = _shapes(jax.make_jaxpr(jax.grad(loss))(w).jaxpr)
    assert not [s for s in shapes if s[:1] == (len(xs),) and s.count(16) >= 2], name
    assert [s for s in shapes if s[:1] == (packed.rows,) and s.count(16) >= 2], name
