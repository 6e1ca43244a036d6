"""pj.Ragged and pj.vmap: ragged batching against the unpadded computation.

Every check runs `fun` on each unpadded example and compares it with
`pj.vmap(fun)` over a `pj.Ragged` whose padding (and padded-out rows) holds
NaN, inf and huge values. Compile counts are measured, never assumed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import garbage_like

RTOL = ATOL = 2e-5


def normal(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


def garbage_ragged(examples, padded, batch=None, ragged_axes=1, seed=0):
  """A Ragged built from parts: garbage in the padding, in the padded-out rows
  (whose lengths are garbage too) and no help from from_list."""
  rng = np.random.default_rng(seed)
  n = len(examples)
  batch = batch or n
  rest = examples[0].shape[ragged_axes:]
  data = garbage_like(np.zeros((batch, *padded, *rest), examples[0].dtype), rng)
  lengths = rng.integers(0, 1000, (batch, ragged_axes)).astype(np.int32)
  for i, x in enumerate(examples):
    data[(i, *(slice(0, s) for s in x.shape[:ragged_axes]))] = x
    lengths[i] = x.shape[:ragged_axes]
  lengths = lengths[:, 0] if ragged_axes == 1 else lengths
  return pj.Ragged(data, lengths, None if batch == n else n)


def assert_examples(got: list, want: list, rtol=RTOL, atol=ATOL):
  assert len(got) == len(want)
  for i, (g, w) in enumerate(zip(got, want)):
    for gl, wl in zip(jax.tree.leaves(g), jax.tree.leaves(w)):
      assert np.shape(gl) == np.shape(wl), (i, np.shape(gl), np.shape(wl))
      np.testing.assert_allclose(gl, wl, rtol=rtol, atol=atol, err_msg=f"example {i}")


def assert_tree_close(got, want, rtol=1e-4, atol=1e-5):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# --- models written for one unpadded example ----------------------------------

def rnn(params, x):
  def step(h, xt):
    return jnp.tanh(h @ params["w"] + xt @ params["u"]), None
  h, _ = lax.scan(step, jnp.zeros(params["w"].shape[0], x.dtype), x)
  return h


def attention(params, x):
  q, k = x @ params["q"], x @ params["k"]
  weights = jax.nn.softmax(q @ k.T / np.sqrt(q.shape[-1]), axis=-1)
  return weights @ x


def example_loss(params, x, y):
  h = rnn(params, attention(params, x) + x)
  return (h.sum() - y) ** 2


def init_params(rng, d=3, h=4):
  return {"w": normal(rng, h, h) * 0.5, "u": normal(rng, d, h), "q": normal(rng, d, d),
          "k": normal(rng, d, d)}


# The unpadded reference, compiled per exact length: tests draw lengths from a
# few values so that these programs are shared.
LENGTHS = (1, 4, 7, 12)
_reference_step = jax.jit(jax.value_and_grad(example_loss, argnums=(0, 1)))


def reference(params, xs, ys):
  """Mean loss, its gradient and the per-example data gradients, unpadded."""
  outs = [_reference_step(params, jnp.asarray(x), y) for x, y in zip(xs, ys)]
  mean = lambda *v: sum(v) / len(xs)
  value = mean(*[v for v, _ in outs])
  grads = jax.tree.map(mean, *[g[0] for _, g in outs])
  return value, grads, [g[1] / len(xs) for _, g in outs]


# --- Ragged itself -------------------------------------------------------------

def test_from_list_round_trip_and_buckets():
  rng = np.random.default_rng(0)
  xs = [normal(rng, n, 3) for n in (5, 1, 17)]
  with pj.diagnostics.count_compiles() as compiles:
    r = pj.Ragged.from_list(xs)
    r2 = pj.Ragged.from_list([normal(rng, n, 3) for n in (40, 2)], buckets=[8, 48])
    r3 = pj.Ragged.from_list([normal(rng, 3, 2) for _ in range(2)], ragged_axes=0)
    back = r.to_list()
  assert len(compiles) == 0, [c.fun_name for c in compiles]
  assert r.data.shape == (3, 32, 3) and r.padded_lengths == (32,)  # powers of two from 16
  assert r2.data.shape == (2, 48, 3)
  assert len(r) == 3 and r.num_examples == 3 and not r.batch_padded
  np.testing.assert_array_equal(r.lengths, [5, 1, 17])
  assert r.lengths.dtype == np.int32 and r3.lengths.shape == (2, 0)
  assert_examples(back, xs, rtol=0, atol=0)


def test_from_list_several_axes_pytrees_ints_and_batch_padding():
  rng = np.random.default_rng(1)
  images = [normal(rng, h, w, 2) for h, w in ((3, 20), (18, 4), (7, 7))]
  r = pj.Ragged.from_list(images, ragged_axes=2, buckets=pj.buckets.Multiples(8))
  assert r.data.shape == (3, 24, 24, 2) and r.lengths.shape == (3, 2)
  assert_examples(r.to_list(), images, rtol=0, atol=0)

  tokens = [rng.integers(0, 9, n).astype(np.int32) for n in (4, 2, 6)]
  pairs = [{"tok": t, "tgt": t * 1.5} for t in tokens]
  rp = pj.Ragged.from_list(pairs, batch_buckets=4)
  assert rp.data["tok"].dtype == np.int32 and rp.data["tgt"].shape == (4, 16)
  assert len(rp) == 3 and rp.batch_size == 4 and rp.batch_padded
  np.testing.assert_array_equal(rp.lengths, [4, 2, 6, 0])
  assert_examples(rp.to_list(), pairs, rtol=0, atol=0)


@pytest.mark.parametrize("examples, kwargs, match", [
    ([np.ones((3, 2)), np.ones((4, 3))], {}, r"example 1 has shape \(4, 3\).*ragged_axes"),
    ([np.ones(3), (np.ones(3), np.ones(3))], {}, "example 1 has the structure"),
    ([np.ones(3)], {"ragged_axes": 2}, r"fewer than ragged_axes=2"),
    ([np.ones(40)], {"buckets": pj.buckets.Explicit((16, 32), overflow="raise")},
     "above the largest bucket"),
])
def test_from_list_errors_name_the_example(examples, kwargs, match):
  with pytest.raises(pj.ShapeError, match=match):
    pj.Ragged.from_list(examples, **kwargs)


def test_constructor_checks_parts():
  with pytest.raises(pj.ShapeError, match="example 1 has length 9 on ragged axis 0"):
    pj.Ragged(np.zeros((2, 8)), np.array([3, 9]))
  with pytest.raises(pj.ShapeError, match=r"shape \(3, 8\)"):
    pj.Ragged(np.zeros((3, 8)), np.array([3, 4]))
  with pytest.raises(pj.ShapeError, match="num_examples=3"):
    pj.Ragged(np.zeros((2, 8)), np.array([3, 4]), num_examples=3)
  with pytest.raises(TypeError, match="integer array"):
    pj.Ragged(np.zeros((2, 8)), np.array([3.0, 4.0]))
  with pytest.raises(pj.ShapeError, match="example 0 has length -1 .*between 0 and"):
    pj.Ragged(np.zeros((2, 8)), np.array([-1, 3]))
  pj.Ragged(np.zeros((2, 8)), np.array([0, 3]))   # an empty example
  pj.Ragged(np.zeros((2, 8)), np.array([3, 0]), num_examples=1)  # padded-out rows are free


def test_masks_and_reductions_skip_padding_and_padded_out_rows():
  rng = np.random.default_rng(2)
  xs = [normal(rng, n, 2) for n in (3, 6)]
  r = garbage_ragged(xs, (8,), batch=4)
  flat = np.concatenate(xs)
  np.testing.assert_allclose(r.sum(), flat.sum(), rtol=1e-5)
  np.testing.assert_allclose(r.mean(), flat.mean(), rtol=1e-5)
  np.testing.assert_array_equal(r.example_mask, [True, True, False, False])
  assert int(r.mask.sum()) == flat.size
  g = jax.grad(lambda d: pj.Ragged(d, r.lengths, r.num_examples).mean())(r.data)
  np.testing.assert_allclose(g[r.mask], 1 / flat.size, rtol=1e-6)
  assert np.all(np.asarray(g)[~np.asarray(r.mask)] == 0)


def test_ragged_is_a_pytree_through_jit():
  rng = np.random.default_rng(3)
  r = pj.Ragged.from_list([normal(rng, n) for n in (2, 7)], batch_buckets=4)
  out = jax.jit(lambda r: pj.Ragged(r.data * 2, r.lengths, r.num_examples))(r)
  assert isinstance(out, pj.Ragged) and out.batch_padded and len(out) == 2
  assert_examples(out.to_list(), [x * 2 for x in r.to_list()])
  with pytest.raises(TypeError, match="r.num_examples"):
    jax.jit(lambda r: len(r))(r)
  grads = jax.grad(lambda r: r.sum(), allow_int=True)(r)
  assert isinstance(grads, pj.Ragged)
  np.testing.assert_array_equal(grads.data, r.mask)


# --- pj.vmap -------------------------------------------------------------------

def test_mixed_ragged_shared_and_mapped_arguments():
  rng = np.random.default_rng(4)
  params = init_params(rng)
  xs = [normal(rng, n, 3) for n in (1, 4, 12)]
  ys = normal(rng, 3)
  r = garbage_ragged(xs, (16,))

  got = pj.vmap(example_loss, in_axes=(None, 0, 0))(params, r, ys)
  want = [_reference_step(params, jnp.asarray(x), y)[0] for x, y in zip(xs, ys)]
  assert isinstance(got, jax.Array) and got.shape == (3,)  # stacked
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_ragged_and_stacked_outputs_with_pytrees():
  rng = np.random.default_rng(5)
  xs = [normal(rng, n, 3) for n in (2, 9, 5)]
  w = normal(rng, 3, 2)

  def fun(x, w):
    h = jnp.tanh(x @ w)
    return {"h": h, "first": h[0], "pairs": h @ h.T, "shifted": jnp.concatenate([h, h[:1]]),
            "count": x.shape[0]}

  out = pj.vmap(fun, in_axes=(0, None))(garbage_ragged(xs, (16,)), w)
  want = [fun(jnp.asarray(x), w) for x in xs]
  for key in ("h", "pairs", "shifted"):
    assert isinstance(out[key], pj.Ragged), key
    assert_examples(out[key].to_list(), [wi[key] for wi in want])
  np.testing.assert_array_equal(out["shifted"].lengths, [3, 10, 6])
  assert out["pairs"].ragged_axes == 2
  assert isinstance(out["first"], jax.Array) and out["first"].shape == (3, 2)
  np.testing.assert_allclose(out["first"], [wi["first"] for wi in want], rtol=1e-6)
  np.testing.assert_array_equal(out["count"], [2, 9, 5])


def test_several_ragged_axes():
  rng = np.random.default_rng(6)
  images = [normal(rng, h, w, 2) for h, w in ((3, 5), (6, 2), (1, 7))]
  k = normal(rng, 2, 2)

  def fun(img, k):
    feats = jnp.tanh(img @ k)
    return jnp.mean(feats, axis=(0, 1)), jnp.max(feats.sum(-1), axis=1), feats.transpose(1, 0, 2)

  r = garbage_ragged(images, (8, 8), ragged_axes=2)
  pooled, row_max, transposed = pj.vmap(fun, in_axes=(0, None))(r, k)
  want = [fun(jnp.asarray(x), k) for x in images]
  np.testing.assert_allclose(pooled, [w[0] for w in want], rtol=1e-5)
  assert row_max.ragged_axes == 1 and transposed.ragged_axes == 2
  assert_examples(row_max.to_list(), [w[1] for w in want])
  assert_examples(transposed.to_list(), [w[2] for w in want])


def test_two_ragged_arguments_with_their_own_lengths():
  rng = np.random.default_rng(7)
  src = [normal(rng, n, 3) for n in (4, 2)]
  tgt = [normal(rng, n, 3) for n in (1, 6)]

  def cross(s, t):
    return jax.nn.softmax(t @ s.T, axis=-1) @ s

  out = pj.vmap(cross)(garbage_ragged(src, (8,)), garbage_ragged(tgt, (16,), seed=1))
  assert_examples(out.to_list(), [cross(jnp.asarray(s), jnp.asarray(t))
                                  for s, t in zip(src, tgt)])


# --- Ragged arguments whose lengths the function needs equal --------------------

def token_loss(w, x, y):
  """Needs len(x) == len(y): per-token predictions against per-token targets."""
  return jnp.sum((jnp.tanh(x @ w) - y) ** 2)


def token_loss_np(w, x, y):
  """token_loss and its gradients (w, x, y), in NumPy: no compile per length."""
  x, y = np.float64(x), np.float64(y)
  t = np.tanh(x @ w)
  d = 2 * (t - y)
  return np.sum((t - y) ** 2), (d * (1 - t ** 2)) @ x, np.outer(d * (1 - t ** 2), w), -d


def checks_lengths(x, y):
  """Needs them equal through its own check, not through a shape error."""
  if x.shape[0] != y.shape[0]:
    raise ValueError("one target per token")
  return jnp.sum(x, axis=1) * y


def test_two_ragged_arguments_with_equal_lengths_share_them():
  # Tokens and targets from two Ragged, NaN in their padding and in the
  # padded-out rows (whose lengths are garbage and differ between the two).
  rng = np.random.default_rng(14)
  w = normal(rng, 3)
  xs = [normal(rng, n, 3) for n in (4, 12, 1, 7)]
  ys = [normal(rng, n) for n in (4, 12, 1, 7)]
  want = [token_loss_np(w, x, y) for x, y in zip(xs, ys)]
  tokens, targets = garbage_ragged(xs, (16,), batch=6), garbage_ragged(ys, (16,), batch=6, seed=1)
  per_example = pj.vmap(token_loss, in_axes=(None, 0, 0))
  for got in (per_example(w, tokens, targets), jax.jit(per_example)(w, tokens, targets)):
    assert isinstance(got, pj.Ragged) and len(got) == 4
    np.testing.assert_allclose(np.asarray(got.data)[:4], [v for v, *_ in want], rtol=1e-5)

  # A training step: the Ragged are arguments of the outer jit (traced lengths).
  step = jax.jit(jax.value_and_grad(lambda w, t, y: per_example(w, t, y).mean(), (0, 2),
                                    allow_int=True))
  value, (grad_w, grad_y) = step(w, tokens, targets)
  np.testing.assert_allclose(value, np.mean([v for v, *_ in want]), rtol=1e-5)
  np.testing.assert_allclose(grad_w, np.mean([g for _, g, *_ in want], 0), rtol=1e-4)
  g = np.asarray(grad_y.data)
  for i, (y, (*_, want_y)) in enumerate(zip(ys, want)):
    np.testing.assert_allclose(g[i, :len(y)], want_y / 4, rtol=1e-4, atol=1e-6)
    assert np.all(g[i, len(y):] == 0)
  assert np.all(g[4:] == 0)

  # Another batch in the same buckets: the same program, no compile.
  xs2 = [normal(rng, n, 3) for n in (9, 2, 16, 3)]
  ys2 = [normal(rng, n) for n in (9, 2, 16, 3)]
  with pj.diagnostics.count_compiles() as c:
    value2, _ = step(w, garbage_ragged(xs2, (16,), batch=6), garbage_ragged(ys2, (16,), batch=6))
  assert len(c) == 0, [e.fun_name for e in c]
  np.testing.assert_allclose(
      value2, np.mean([token_loss_np(w, x, y)[0] for x, y in zip(xs2, ys2)]), rtol=1e-5)

  # A function that checks the lengths itself shares them too.
  got = pj.vmap(checks_lengths)(tokens, targets)
  assert_examples(got.to_list(), [x.sum(1) * y for x, y in zip(xs, ys)])


def test_shared_lengths_with_different_padded_sizes():
  # Equal lengths, other bucket policies: the smaller is padded up in the program.
  rng = np.random.default_rng(15)
  w = normal(rng, 3)
  xs = [normal(rng, n, 3) for n in (5, 2, 9)]
  ys = [normal(rng, n) for n in (5, 2, 9)]
  want = [token_loss_np(w, x, y) for x, y in zip(xs, ys)]
  tokens = garbage_ragged(xs, (16,))
  targets = garbage_ragged(ys, (32,), seed=1)
  loss = lambda w, t, y: pj.vmap(token_loss, in_axes=(None, 0, 0))(w, t, y).sum()
  value, (grad_w, grad_x) = jax.jit(jax.value_and_grad(loss, (0, 1), allow_int=True))(
      w, tokens, targets)
  np.testing.assert_allclose(value, sum(v for v, *_ in want), rtol=1e-5)
  np.testing.assert_allclose(grad_w, sum(g for _, g, *_ in want), rtol=1e-4)
  g = np.asarray(grad_x.data)
  assert g.shape == (3, 16, 3)
  for i, (x, (_, _, want_x, _)) in enumerate(zip(xs, want)):
    np.testing.assert_allclose(g[i, :len(x)], want_x, rtol=1e-4, atol=1e-6)
    assert np.all(g[i, len(x):] == 0)


def test_unequal_lengths_name_both_arguments_and_the_example():
  rng = np.random.default_rng(16)
  w = normal(rng, 3)
  tokens = garbage_ragged([normal(rng, n, 3) for n in (4, 5, 2)], (16,))
  targets = {"y": garbage_ragged([normal(rng, n) for n in (4, 6, 3)], (16,), seed=1)}
  fun = lambda w, x, t: token_loss(w, x, t["y"])
  message = (r"(?s)argument 1 and argument 2 at \['y'\] are pj.Ragged arguments that "
             r"<lambda> needs with equal lengths, example by example, but example 1 has "
             r"length 5 in argument 1 and length 6 in argument 2 at \['y'\].*"
             r"sub got incompatible shapes.*Ragged.from_list\(\[\(tok, tgt\)")
  per_example = pj.vmap(fun, in_axes=(None, 0, 0))
  with pytest.raises(pj.ShapeError, match=message):  # concrete lengths: on the host
    per_example(w, tokens, targets)
  # Traced lengths: checked in the program; JAX wraps the callback's error.
  step = jax.jit(jax.grad(lambda w, x, t: per_example(w, x, t).mean()))
  with pytest.raises(jax.errors.JaxRuntimeError, match=message):
    jax.block_until_ready(step(w, tokens, targets))
  with pytest.raises(pj.ShapeError, match="example 0 has length 4 in argument 0 and length 3"):
    pj.vmap(checks_lengths)(garbage_ragged([normal(rng, 4, 3)], (8,)),
                            garbage_ragged([normal(rng, 3)], (8,)))


def test_ragged_arguments_the_function_accepts_unequal_keep_their_lengths():
  # Cross attention: queries and keys of one bucket (traced: nothing to compare),
  # equal in one batch and not in the next; neither shares nor fails.
  rng = np.random.default_rng(17)

  def cross(q, k):
    return jax.nn.softmax(q @ k.T, axis=-1) @ k

  def cross_np(q, k):
    s = np.exp(q @ k.T - (q @ k.T).max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ k

  step = jax.jit(pj.vmap(cross))
  for q_lengths, k_lengths in [((3, 5), (3, 5)), ((3, 5), (7, 1)), ((6, 2), (6, 9))]:
    qs = [normal(rng, n, 3) for n in q_lengths]
    ks = [normal(rng, n, 3) for n in k_lengths]
    want = [cross_np(q, k) for q, k in zip(qs, ks)]
    rq, rk = garbage_ragged(qs, (16,)), garbage_ragged(ks, (16,), seed=1)
    assert_examples(step(rq, rk).to_list(), want)
    assert_examples(pj.vmap(cross)(rq, rk).to_list(), want)
  # Keys at least as long as the queries: an order, never made an equality.
  with pytest.raises(pj.MaskingError, match=r"min\(n1_0, n0_0\)") as e:
    pj.vmap(lambda q, k: q * k[:q.shape[0]])(rq, rk)
  assert "equal lengths" not in str(e.value)


def test_which_ragged_arguments_share_is_decided_by_tracing_not_by_messages():
  # Queries and per-query targets must have equal lengths, keys need not. The
  # function hides why it fails behind a message that names the wrong sizes
  # (n0_0 and n1_0: queries and keys) and chains no cause: the decision must
  # come from which traces succeed, whatever any error says.
  rng = np.random.default_rng(18)

  def attend(q, k, y):
    return (jax.nn.softmax(q @ k.T, axis=-1) @ k) * y[:, None]

  def hides_why(q, k, y):
    failed = False
    try:
      return attend(q, k, y)
    except Exception:
      failed = True
    assert failed
    raise ValueError("n0_0 and n1_0 differ")  # (raised outside the handler: no cause)

  q_lengths, k_lengths = (3, 5, 2), (7, 1, 4)
  qs = [normal(rng, n, 3) for n in q_lengths]
  ks = [normal(rng, n, 3) for n in k_lengths]
  ys = [normal(rng, n) for n in q_lengths]
  want = [attend(jnp.asarray(q), jnp.asarray(k), jnp.asarray(y)) for q, k, y in zip(qs, ks, ys)]
  rq, rk, ry = (garbage_ragged(qs, (8,)), garbage_ragged(ks, (8,), seed=1),
                garbage_ragged(ys, (8,), seed=2))
  per_example = pj.vmap(hides_why)
  assert_examples(per_example(rq, rk, ry).to_list(), want)
  assert_examples(jax.jit(per_example)(rq, rk, ry).to_list(), want)
  # Queries and targets share their lengths, and the check names both.
  ry_short = garbage_ragged([normal(rng, n) for n in (3, 4, 2)], (8,), seed=3)
  with pytest.raises(pj.ShapeError, match="example 1 has length 5 in argument 0 and "
                                          "length 4 in argument 2"):
    per_example(rq, rk, ry_short)


def test_out_axes_and_no_ragged_arguments_follow_jax_vmap():
  rng = np.random.default_rng(8)
  xs = [normal(rng, n, 3) for n in (2, 3)]
  out = pj.vmap(lambda x: x.sum(0), out_axes=1)(pj.Ragged.from_list(xs))
  np.testing.assert_allclose(out, np.stack([x.sum(0) for x in xs], 1), rtol=1e-6)
  a = normal(rng, 4, 3)
  np.testing.assert_allclose(pj.vmap(jnp.cumsum, in_axes=1)(a),
                             jax.vmap(jnp.cumsum, in_axes=1)(a))


def test_gradients_with_nan_padding_match_the_unpadded_ones():
  rng = np.random.default_rng(9)
  params = init_params(rng)
  xs = [normal(rng, n, 3) for n in (4, 12, 1, 7)]
  ys = normal(rng, 4)
  want_value, want_grads, want_data_grads = reference(params, xs, ys)

  @jax.jit
  def loss(params, data, lengths, ys):
    batch = pj.Ragged(data, lengths)
    return pj.vmap(example_loss, in_axes=(None, 0, 0))(params, batch, ys).mean()

  batch = garbage_ragged(xs, (16,))
  value, (grads, data_grads) = jax.value_and_grad(loss, (0, 1))(
      params, batch.data, batch.lengths, ys)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  assert_tree_close(grads, want_grads)
  # With respect to the padded data: exact on the valid region, zero outside.
  g = np.asarray(data_grads)
  for i, (x, want) in enumerate(zip(xs, want_data_grads)):
    np.testing.assert_allclose(g[i, :len(x)], want, rtol=1e-4, atol=1e-6)
    assert np.all(g[i, len(x):] == 0)


def test_last_smaller_batch_reuses_the_program_and_means_count_real_examples():
  rng = np.random.default_rng(10)
  params = init_params(rng)
  per_example = pj.vmap(example_loss, in_axes=(None, 0, 0))

  @jax.jit
  def step(params, batch, ys):
    return jax.value_and_grad(lambda p: per_example(p, batch, ys).mean())(params)

  compiles = []
  for n in (6, 4, 1):  # a full batch, then smaller ones, padded to 8 rows
    xs = [normal(rng, int(rng.choice(LENGTHS)), 3) for _ in range(n)]
    ys = list(normal(rng, n))
    batch = pj.Ragged.from_list(xs, batch_buckets=8)
    targets = pj.Ragged.from_list(ys, ragged_axes=0, batch_buckets=8)
    with pj.diagnostics.count_compiles() as c:
      value, grads = step(params, garbage_rows(batch), garbage_rows(targets))
    compiles.append(len(c))
    want_value, want_grads, _ = reference(params, xs, ys)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    assert_tree_close(grads, want_grads)
  assert compiles[0] >= 1 and compiles[1:] == [0, 0], compiles

  losses = per_example(params, batch, targets)
  assert isinstance(losses, pj.Ragged) and losses.ragged_axes == 0 and len(losses) == 1
  with pytest.raises(TypeError):
    jnp.mean(losses)  # a plain mean would count padded-out rows: refused


def test_padded_out_rows_never_reach_values_or_gradients():
  # log(y) is NaN for the padded-out targets, whose sequences are garbage too.
  f = lambda w, x, y: (jnp.sum(x) * w * jnp.log(y), x * w)
  xs, ys = [np.full(3, 2.0, np.float32), np.ones(5, np.float32)], [2.0, 3.0]
  batch = garbage_rows(pj.Ragged.from_list(xs, batch_buckets=4))
  targets = pj.Ragged(np.array([*ys, -1.0, np.nan], np.float32), np.zeros((4, 0), np.int32), 2)

  def loss(w):
    scalars, seqs = pj.vmap(f, in_axes=(None, 0, 0))(w, batch, targets)
    return scalars.mean() + seqs.mean(), seqs

  def ref(w):
    scalars, seqs = zip(*[f(w, jnp.asarray(x), y) for x, y in zip(xs, ys)])
    return jnp.mean(jnp.stack(scalars)) + jnp.mean(jnp.concatenate(seqs))

  (value, seqs), grad = jax.value_and_grad(loss, has_aux=True)(1.5)
  np.testing.assert_allclose(value, ref(1.5), rtol=1e-6)
  np.testing.assert_allclose(grad, jax.grad(ref)(1.5), rtol=1e-6)
  np.testing.assert_array_equal(seqs.lengths, [3, 5, 0, 0])
  assert_examples(seqs.to_list(), [x * 1.5 for x in xs])


def garbage_rows(r: pj.Ragged) -> pj.Ragged:
  """`r` with NaN/inf in its padded-out rows and their lengths set to 0."""
  keep = np.arange(r.batch_size) < len(r)
  data = jax.tree.map(
      lambda x: np.where(keep.reshape((-1,) + (1,) * (x.ndim - 1)), x,
                         garbage_like(np.asarray(x), np.random.default_rng(0))), r.data)
  return pj.Ragged(data, r.lengths, r.num_examples)


def test_new_batches_in_the_same_bucket_do_not_compile():
  rng = np.random.default_rng(11)
  params = init_params(rng)
  grad_step = jax.jit(jax.grad(lambda p, b: pj.vmap(rnn, in_axes=(None, 0))(p, b).sum()))
  eager = lambda b: pj.vmap(attention, in_axes=(None, 0))(params, b)  # a new pj.vmap per call
  counts = []
  for lengths in [(3, 9, 16), (17, 2, 30), (5, 5, 5), (20, 31, 32)]:
    batch = pj.Ragged.from_list([normal(rng, n, 3) for n in lengths])
    with pj.diagnostics.count_compiles() as c:
      jax.block_until_ready((grad_step(params, batch), eager(batch).data))
    counts.append(len(c))
  assert counts[0] >= 1 and counts[1] >= 1  # buckets 16, then 32
  assert counts[2:] == [0, 0], counts


@pytest.mark.skipif(not hasattr(pj, "jit"), reason="pj.jit is not available")
def test_through_pj_jit():
  rng = np.random.default_rng(12)
  params = init_params(rng)
  step = pj.jit(jax.value_and_grad(
      lambda p, b, y: pj.vmap(example_loss, in_axes=(None, 0, 0))(p, b, y).mean()))
  counts = []
  for lengths in [(4, 12), (7, 1), (12, 12)]:
    xs, ys = [normal(rng, n, 3) for n in lengths], normal(rng, 2)
    with pj.diagnostics.count_compiles() as c:
      value, grads = step(params, pj.Ragged.from_list(xs), ys)
    counts.append(len(c))
    want_value, want_grads, _ = reference(params, xs, ys)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    assert_tree_close(grads, want_grads)
  assert counts[1:] == [0, 0], counts


# --- errors --------------------------------------------------------------------

def test_errors_name_the_argument_and_say_what_to_do():
  rng = np.random.default_rng(13)
  r = pj.Ragged.from_list([normal(rng, n, 3) for n in (2, 3)])
  with pytest.raises(TypeError, match=r"argument 0 has in_axes 1"):
    pj.vmap(lambda x: x.sum(), in_axes=1)(r)
  with pytest.raises(pj.ShapeError, match=r"argument 1 holds 3 rows but argument 0 holds 2"):
    pj.vmap(lambda a, b: a.sum() + b.sum())(r, pj.Ragged.from_list([np.ones(2)] * 3))
  with pytest.raises(pj.ShapeError, match=r"argument 1 has 5 entries on its mapped axis 0"):
    pj.vmap(lambda a, b: a.sum() + b)(r, np.ones(5))
  with pytest.raises(pj.ShapeError, match=r"jnp.moveaxis\(y, 1, 0\)"):
    pj.vmap(lambda x: x.T)(r)
  with pytest.raises(TypeError, match="use out_axes=0"):
    pj.vmap(lambda x: x * 2, out_axes=1)(r)
  padded = pj.Ragged.from_list([np.ones(2)] * 3, batch_buckets=4)
  with pytest.raises(pj.ShapeError, match=r"ragged_axes=0, batch_buckets"):
    pj.vmap(lambda a, b: a.sum() + b)(padded, np.ones(3))
  with pytest.raises(TypeError, match="outside jax.jit"):
    jax.jit(lambda r: r.to_list())(r)
