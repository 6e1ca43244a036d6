"""What a packed `lax.scan` streams in and out, and that it stays exact.

A packed scan streams its per-token inputs time-major, each row's unused tail
holding the row's source token (the first example's first token, its last in
reverse), so that a tail step is a step an example takes itself. The tail
step's outputs are discarded and the next step restarts the carry, so the
source token's cotangent from the tail is exactly 0: the packed program takes
none (a scatter of zeros onto the tokens per scan, in the backward pass of a
BiLSTM's two directions, was a pass over the tokens each). Checked here: the
gradient's program scatters nothing, and a bidirectional scan over a value
made from the shared parameters (an embedding's projection, as a BiLSTM
reads it) is exact in value, gradient and forward-mode derivative, with NaN
and inf in the unused tail, empty examples and a row that is all tail.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import polyjit as pj
from test_packing import _check, _examples, _poison


def _bidirectional(w, x):
  """Both directions over one projection of the tokens, concatenated (a
  BiLSTM's layout), a step with no finite derivative at 0 (`sqrt(|c + x|)`),
  each direction's final carry, and attention pooling over the outputs."""
  h = jnp.tanh(x @ w)                                          # (n, 4)

  def forward(c, ht):
    c = jnp.tanh(c * w[0] + ht) + jnp.sqrt(jnp.abs(c[0] + ht[1]))
    return c, c

  def backward(c, ht):
    c = jax.nn.sigmoid(c * w[1] + ht) * jnp.sqrt(jnp.abs(c[1] + ht[0]))
    return c, c * 2.0

  f_last, fs = lax.scan(forward, jnp.zeros(4), h)
  b_last, bs = lax.scan(backward, jnp.zeros(4), h, reverse=True)
  both = jnp.concatenate([fs, bs], axis=-1)                    # (n, 8)
  pooled = jax.nn.softmax(both @ jnp.ones(8) * 0.1) @ both
  return both, pooled, f_last + b_last


def _scatters(jaxpr) -> list[tuple[str, tuple[int, ...]]]:
  """The scatters of inexact values in a jaxpr and every jaxpr inside it,
  with the shape of the array each scatters into."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name.startswith("scatter") and jnp.issubdtype(eqn.invars[0].aval.dtype,
                                                                   jnp.inexact):
      found.append((f"{eqn.primitive.name} {[str(v.aval) for v in eqn.invars]}",
                    tuple(eqn.invars[0].aval.shape)))
    for sub in _subjaxprs(eqn):
      found += _scatters(sub)
  return found


def _subjaxprs(eqn):
  for value in eqn.params.values():
    for v in value if isinstance(value, (tuple, list)) else [value]:
      if hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
        yield v.jaxpr
      elif hasattr(v, "eqns"):
        yield v


def test_bidirectional_scan_over_parameters_is_exact():
  rng = np.random.default_rng(41)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32) * 0.7)
  # rows of 16: 13 | 9 5 1 | 16 with two empty examples, then a row all tail
  # (the row count's bucket)
  xs = _examples(rng, [5, 0, 1, 9, 13, 16, 0, 3, 12])
  _check(_bidirectional, w, xs)


def test_bidirectional_scan_forward_mode_is_exact():
  rng = np.random.default_rng(42)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32) * 0.7)
  dw = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = _examples(rng, [5, 1, 9, 13, 16, 3])
  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  vmapped = pj.vmap(lambda w, x: _bidirectional(w, x)[1:], in_axes=(None, 0))
  value, tangent = jax.jit(lambda w, dw: jax.jvp(lambda w: vmapped(w, packed), (w,), (dw,)))(
      w, dw)
  one = jax.jit(lambda w, dw, x: jax.jvp(lambda w: _bidirectional(w, x)[1:], (w,), (dw,)))
  for i, x in enumerate(xs):
    want_value, want_tangent = one(w, dw, x)
    for got, want in [(value, want_value), (tangent, want_tangent)]:
      for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g)[i], r, rtol=2e-5, atol=2e-5)
        assert np.all(np.isfinite(np.asarray(g)))


def test_scan_tail_takes_no_cotangent_back_to_its_source_tokens():
  """The gradient of a BiLSTM-like step (both directions over one projection
  of the tokens) scatters nothing onto the tokens: no cotangent of the tail
  steps goes back to the source tokens they read. (The pooling's segment sums
  scatter onto the examples, in the forward pass.)"""
  rng = np.random.default_rng(43)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(_examples(rng, [5, 1, 9, 13]),
                               packing=pj.Packing(row_length=16))
  tokens = packed.rows * packed.row_length

  def pooled(w, x):
    h = jnp.tanh(x @ w)
    step = lambda c, ht: (jnp.tanh(c * w[0] + ht),) * 2
    fs = lax.scan(step, jnp.zeros(4), h)[1]
    bs = lax.scan(step, jnp.zeros(4), h, reverse=True)[1]
    return jnp.sum(jnp.tanh(jnp.concatenate([fs, bs], axis=-1)), axis=0)

  vmapped = pj.vmap(pooled, in_axes=(None, 0))
  jaxpr = jax.make_jaxpr(jax.grad(lambda w: jnp.sum(jnp.sin(vmapped(w, packed)))))(w)
  onto_tokens = [s for s, shape in _scatters(jaxpr.jaxpr) if shape[:1] == (tokens,)]
  assert onto_tokens == []
  assert _scatters(jaxpr.jaxpr)   # (the segment sums': the check sees scatters)
