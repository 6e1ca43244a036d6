"""The four models of `training.py`, each written twice: for one example, and by hand.

Each model is a `Model`: `init` gives its parameters (a pytree of Flax linen
layers' parameters), `one(params, *parts, label)` is the loss of ONE unpadded
example, written as a user writes it for `pj.vmap`, and
`padded(params, parts, valid, labels)` is the mean loss of a padded batch
written by hand with explicit masks (`valid[i]`: a `(batch, padded)` boolean
mask per ragged part), what a user writes without polyjit. Both use the same
layers and the same parameters, so their losses and gradients must agree.

An example is a tuple of ragged parts, each an array whose leading axis varies
from example to example (a sentence's tokens; a graph's nodes and, apart, its
edges), and a label. The layers are Flax linen modules used as pure functions
(`Layers`): parameters in, arrays out, no module state, so the same call works
on one example and on a padded batch. No dropout: the contenders must compute
the same numbers.

  text       embedding + bidirectional LSTM (`lax.scan` over
             `nn.OptimizedLSTMCell`, the reverse direction a reverse scan) +
             attention pooling over the tokens + dense: Flax's sst2 example
             without dropout. `flax_rnn=True` writes the one-example model
             with `nn.RNN` instead (issue 33: fails under `pj.vmap` today).
  attention  embedding + sinusoidal positions + pre-norm transformer layers
             (`nn.MultiHeadDotProductAttention`, softmax over the ragged
             axis) + mean pooling + dense.
  graph      message passing: node MLP, messages from sender and receiver
             states summed into receivers with `jax.ops.segment_sum`, two
             rounds, sum readout. Nodes and edges are two ragged parts.
  sets       Deep Sets: an MLP per element, sum and mean pooling, an MLP.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

NEG = -1e9  # the hand-written mask's "minus infinity" for softmax logits (as Flax's is finite)


class Layers:
  """Flax linen modules used as pure functions of their parameters."""

  def __init__(self, **modules: nn.Module):
    self.modules = modules

  def init(self, key, **example_inputs) -> dict:
    keys = jax.random.split(key, len(self.modules))
    return {name: self.modules[name].init(k, *example_inputs[name])["params"]
            for k, name in zip(keys, self.modules, strict=True)}

  def __call__(self, params, name, *args):
    return self.modules[name].apply({"params": params[name]}, *args)


@dataclasses.dataclass
class Model:
  name: str
  parts: int                       # ragged parts of an example
  init: Callable[[Any], dict]
  one: Callable[..., Any]          # (params, *parts, label) -> loss of one example
  padded: Callable[..., Any]       # (params, parts, valid, labels) -> mean loss
  # (rng) -> (parts, label); text and attention also (rng, n): a sentence of n tokens
  make_example: Callable[..., tuple[tuple[np.ndarray, ...], Any]]
  # (params, tokens, segments, positions, labels) -> mean loss over packed rows,
  # written by hand with segment ids (the Grain/MaxText way); text and attention
  packed: Callable[..., Any] | None = None


def bce(logit, label):
  """Binary cross-entropy of one logit (sst2's loss)."""
  return jnp.maximum(logit, 0) - logit * label + jnp.log1p(jnp.exp(-jnp.abs(logit)))


def segment_mean(x, segments, count):
  """Per example: the mean of its tokens' rows of `x` (tokens, ...); the
  tail's id (`count`) is out of range, so it is dropped."""
  sums = jax.ops.segment_sum(x, segments, count)
  sizes = jax.ops.segment_sum(jnp.ones_like(segments, x.dtype), segments, count)
  return sums / sizes.reshape(-1, *([1] * (x.ndim - 1)))


def masked_mean(x, valid, axis):
  v = jnp.expand_dims(valid, -1)
  return jnp.sum(jnp.where(v, x, 0), axis) / jnp.sum(v, axis)


# --- text: embedding + bidirectional LSTM + attention pooling + dense ---------------

def text_model(vocab: int, embed: int, hidden: int, low: int, high: int,
               flax_rnn: bool = False) -> Model:
  cell = nn.OptimizedLSTMCell(hidden)
  layers = Layers(embed=nn.Embed(vocab, embed), forward=cell, backward=cell,
                  keys=nn.Dense(hidden), energy=nn.Dense(1, use_bias=False),
                  mlp=nn.Dense(hidden), out=nn.Dense(1))

  def init(key):
    carry = (jnp.zeros(hidden), jnp.zeros(hidden))
    return layers.init(key, embed=(jnp.zeros(3, jnp.int32),),
                       forward=(carry, jnp.zeros(embed)), backward=(carry, jnp.zeros(embed)),
                       keys=(jnp.zeros(2 * hidden),), energy=(jnp.zeros(hidden),),
                       mlp=(jnp.zeros(2 * hidden),), out=(jnp.zeros(hidden),))

  def lstm(params, name, x, reverse, live=None):
    """Outputs at every position; with `live` (time-major), the carry is frozen
    where it is False: padded steps change nothing (the reverse direction
    starts from zeros at each sequence's own end)."""
    def step(carry, inputs):
      xt, lt = inputs
      new, y = layers(params, name, carry, xt)
      if lt is not None:
        new = jax.tree.map(lambda a, b: jnp.where(lt[:, None], a, b), new, carry)
      return new, y
    carry = (jnp.zeros(x.shape[1:-1] + (hidden,)),) * 2
    return lax.scan(step, carry, (x, live), reverse=reverse)[1]

  def head(params, h, valid=None):
    """sst2's attention classifier: an MLP scores each position, a softmax
    over the positions pools them, then tanh(dense) and a logit."""
    scores = layers(params, "energy", jnp.tanh(layers(params, "keys", h)))[..., 0]
    if valid is not None:
      scores = jnp.where(valid, scores, NEG)
    pooled = jnp.einsum("...t,...th->...h", jax.nn.softmax(scores, axis=-1), h)
    return layers(params, "out", jnp.tanh(layers(params, "mlp", pooled)))[..., 0]

  def one(params, tokens, label):
    x = layers(params, "embed", tokens)                           # (n, embed)
    if flax_rnn:
      run = lambda name, reverse: nn.RNN(cell, reverse=reverse, keep_order=True).apply(
          {"params": {"cell": params[name]}}, x)
      h = jnp.concatenate([run("forward", False), run("backward", True)], -1)
    else:
      h = jnp.concatenate([lstm(params, "forward", x, False, None),
                           lstm(params, "backward", x, True, None)], -1)
    return bce(head(params, h), label)

  def padded(params, parts, valid, labels):
    (tokens,), (mask,) = parts, valid
    x = jnp.swapaxes(layers(params, "embed", tokens), 0, 1)        # time-major (L, B, embed)
    h = jnp.concatenate([lstm(params, "forward", x, False, mask.T),
                         lstm(params, "backward", x, True, mask.T)], -1)
    return jnp.mean(bce(head(params, jnp.swapaxes(h, 0, 1), mask), labels))

  def packed(params, tokens, segments, positions, labels):
    """Packed rows `(rows, L)` by hand: each direction's carry restarts at
    its example's first token (its last, in reverse), the pooling softmax is
    taken per segment."""
    count = labels.shape[0]
    starts = positions == 0
    ends = jnp.concatenate([segments[:, 1:] != segments[:, :-1],
                            jnp.ones_like(starts[:, :1])], 1)
    x = jnp.swapaxes(layers(params, "embed", tokens), 0, 1)        # (L, rows, embed)

    def lstm_reset(name, reset, reverse):
      def step(carry, inputs):
        xt, rt = inputs
        carry = jax.tree.map(lambda c: jnp.where(rt[:, None], 0, c), carry)
        return layers(params, name, carry, xt)
      carry = (jnp.zeros(x.shape[1:-1] + (hidden,)),) * 2
      return lax.scan(step, carry, (x, reset.T), reverse=reverse)[1]

    h = jnp.concatenate([lstm_reset("forward", starts, False),
                         lstm_reset("backward", ends, True)], -1)
    h = jnp.swapaxes(h, 0, 1).reshape(-1, 2 * hidden)                # (tokens, 2 hidden)
    seg = segments.reshape(-1)
    scores = layers(params, "energy", jnp.tanh(layers(params, "keys", h)))[..., 0]
    top = jax.ops.segment_max(lax.stop_gradient(scores), seg, count)
    e = jnp.exp(scores - jnp.take(top, seg, mode="fill", fill_value=0))
    pooled = jax.ops.segment_sum(e[:, None] * h, seg, count) / \
        jax.ops.segment_sum(e, seg, count)[:, None]
    logits = layers(params, "out", jnp.tanh(layers(params, "mlp", pooled)))[..., 0]
    return jnp.mean(bce(logits, labels))

  def make_example(rng, n=None):
    n = int(rng.integers(low, high + 1)) if n is None else n
    tokens = rng.integers(0, vocab, n).astype(np.int32)
    return (tokens,), np.float32(np.mean(tokens < vocab // 2) > 0.5)  # learnable

  return Model("text", 1, init, one, padded, make_example, packed)


# --- attention: a small transformer encoder ------------------------------------

def attention_model(vocab: int, width: int, heads: int, layers_: int, low: int,
                    high: int) -> Model:
  mods: dict[str, nn.Module] = {"embed": nn.Embed(vocab, width), "final": nn.LayerNorm(),
                                "out": nn.Dense(1)}
  for i in range(layers_):
    mods |= {f"ln1_{i}": nn.LayerNorm(), f"ln2_{i}": nn.LayerNorm(),
             f"attn_{i}": nn.MultiHeadDotProductAttention(num_heads=heads),
             f"up_{i}": nn.Dense(2 * width), f"down_{i}": nn.Dense(width)}
  layers = Layers(**mods)

  def init(key):
    x = jnp.zeros((3, width))
    shapes = {"embed": (jnp.zeros(3, jnp.int32),), "final": (x,), "out": (x,)}
    for i in range(layers_):
      shapes |= {f"ln1_{i}": (x,), f"ln2_{i}": (x,), f"attn_{i}": (x,), f"up_{i}": (x,),
                 f"down_{i}": (jnp.zeros((3, 2 * width)),)}
    return layers.init(key, **shapes)

  def positions(n, at=None):
    """Sinusoidal position encodings (computed, so no table is sliced to n);
    `at`: at these positions instead of 0..n-1."""
    pos = (jnp.arange(n) if at is None else at).astype(jnp.float32)[..., None]
    freq = jnp.exp(-np.log(10000.0) * jnp.arange(0, width, 2, dtype=jnp.float32) / width)
    return jnp.concatenate([jnp.sin(pos * freq), jnp.cos(pos * freq)], -1)

  def encode(params, tokens, mask=None, at=None):
    h = layers(params, "embed", tokens) + positions(tokens.shape[-1], at)
    for i in range(layers_):
      y = layers(params, f"ln1_{i}", h)
      attn = layers.modules[f"attn_{i}"]
      h = h + attn.apply({"params": params[f"attn_{i}"]}, y, mask=mask)
      y = layers(params, f"ln2_{i}", h)
      h = h + layers(params, f"down_{i}", nn.gelu(layers(params, f"up_{i}", y)))
    return layers(params, "final", h)

  def one(params, tokens, label):
    pooled = jnp.mean(encode(params, tokens), axis=0)
    return bce(layers(params, "out", pooled)[0], label)

  def padded(params, parts, valid, labels):
    (tokens,), (mask,) = parts, valid
    h = encode(params, tokens, nn.make_attention_mask(mask, mask))
    return jnp.mean(bce(layers(params, "out", masked_mean(h, mask, 1))[:, 0], labels))

  def make_example(rng, n=None):
    n = int(rng.integers(low, high + 1)) if n is None else n
    tokens = rng.integers(0, vocab, n).astype(np.int32)
    return (tokens,), np.float32(np.mean(tokens < vocab // 2) > 0.5)

  def packed(params, tokens, segments, positions_, labels):
    """Packed rows `(rows, L)` by hand: a block-diagonal mask from the segment
    ids, positions per segment, mean pooling per segment."""
    mask = nn.make_attention_mask(segments, segments, pairwise_fn=jnp.equal)
    h = encode(params, tokens, mask, positions_)
    pooled = segment_mean(h.reshape(-1, width), segments.reshape(-1), labels.shape[0])
    return jnp.mean(bce(layers(params, "out", pooled)[:, 0], labels))

  return Model("attention", 1, init, one, padded, make_example, packed)


# --- graph: message passing with segment_sum -------------------------------------

def graph_model(features: int, hidden: int, low: int, high: int, rounds: int = 2) -> Model:
  mods: dict[str, nn.Module] = {"encode": nn.Dense(hidden), "out": nn.Dense(1)}
  for i in range(rounds):
    mods |= {f"message_{i}": nn.Dense(hidden), f"update_{i}": nn.Dense(hidden)}
  layers = Layers(**mods)

  def init(key):
    shapes = {"encode": (jnp.zeros(features),), "out": (jnp.zeros(hidden),)}
    for i in range(rounds):
      shapes |= {f"message_{i}": (jnp.zeros(2 * hidden),),
                 f"update_{i}": (jnp.zeros(2 * hidden),)}
    return layers.init(key, **shapes)

  def propagate(params, h, senders, receivers, edge_valid=None):
    for i in range(rounds):
      pairs = jnp.concatenate([h[senders], h[receivers]], -1)
      messages = nn.relu(layers(params, f"message_{i}", pairs))
      if edge_valid is not None:
        messages = jnp.where(edge_valid[:, None], messages, 0)
      agg = jax.ops.segment_sum(messages, receivers, num_segments=h.shape[0])
      h = h + nn.relu(layers(params, f"update_{i}", jnp.concatenate([h, agg], -1)))
    return h

  def one(params, nodes, edges, target):
    h = nn.relu(layers(params, "encode", nodes))
    h = propagate(params, h, edges[:, 0], edges[:, 1])
    return (layers(params, "out", jnp.sum(h, 0))[0] - target) ** 2

  def padded(params, parts, valid, targets):
    """jraph's way: the padded graphs as one big graph (node ids offset by
    each graph's row), padded edges point at node 0 and are masked."""
    (nodes, edges), (node_valid, edge_valid) = parts, valid
    b, n = nodes.shape[:2]
    offsets = (jnp.arange(b) * n)[:, None]
    h = nn.relu(layers(params, "encode", nodes)).reshape(b * n, -1)
    h = propagate(params, h, (edges[..., 0] + offsets).reshape(-1),
                  (edges[..., 1] + offsets).reshape(-1), edge_valid.reshape(-1))
    h = jnp.where(node_valid[..., None], h.reshape(b, n, -1), 0)
    return jnp.mean((layers(params, "out", jnp.sum(h, 1))[:, 0] - targets) ** 2)

  def make_example(rng):
    n = int(rng.integers(low, high + 1))
    e = int(rng.integers(n, 3 * n + 1))
    nodes = rng.standard_normal((n, features)).astype(np.float32)
    edges = rng.integers(0, n, (e, 2)).astype(np.int32)
    return (nodes, edges), np.float32(e / n + nodes[:, 0].mean())

  return Model("graph", 2, init, one, padded, make_example)


# --- sets: Deep Sets with sum and mean pooling ---------------------------------------

def sets_model(features: int, hidden: int, low: int, high: int) -> Model:
  layers = Layers(phi1=nn.Dense(hidden), phi2=nn.Dense(hidden), rho1=nn.Dense(hidden),
                  rho2=nn.Dense(1))

  def init(key):
    return layers.init(key, phi1=(jnp.zeros(features),), phi2=(jnp.zeros(hidden),),
                       rho1=(jnp.zeros(2 * hidden),), rho2=(jnp.zeros(hidden),))

  def phi(params, x):
    return nn.relu(layers(params, "phi2", nn.relu(layers(params, "phi1", x))))

  def rho(params, pooled):
    return layers(params, "rho2", nn.relu(layers(params, "rho1", pooled)))[..., 0]

  def one(params, x, target):
    h = phi(params, x)  # the sum scaled by a constant: sets of up to hundreds of elements
    return (rho(params, jnp.concatenate([jnp.sum(h, 0) / 16, jnp.mean(h, 0)])) - target) ** 2

  def padded(params, parts, valid, targets):
    (x,), (mask,) = parts, valid
    h = jnp.where(mask[..., None], phi(params, x), 0)
    pooled = jnp.concatenate([jnp.sum(h, 1) / 16, masked_mean(h, mask, 1)], -1)
    return jnp.mean((rho(params, pooled) - targets) ** 2)

  def make_example(rng):
    n = int(rng.integers(low, high + 1))
    x = rng.standard_normal((n, features)).astype(np.float32)
    return (x,), np.float32(np.abs(x[:, 0]).max())

  return Model("sets", 1, init, one, padded, make_example)
