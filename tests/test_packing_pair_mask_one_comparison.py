"""The mask of a packed row's pairs (tokens i and c in one example) is one
comparison per pair.

`packed_pairs._pair_valid` compares each query's example id with each key's,
the keys' tail ids set to -1 first, so that a tail token is in no pair; it
took `inside_i & (id_i == id_c)` before, two ops per pair in every fused loop
that reads the mask (six such loops in a training step of
`benchmarks/packing.py`'s transformer). The pairs must stay exactly those of
each example: values and gradients against each example alone under
`jax.jit`, NaN and inf in the rows' tails, reductions over the keys (a sum, a
max) and softmax attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _check, _eqns, _examples, _multihead

# rows of 16: 13 2 | 9 5 1 | 7 3: each row has a tail, one of 4 tokens
LENGTHS = [5, 1, 9, 13, 7, 3, 2]


def _max_over_keys(w, x):
  q = jnp.tanh(x @ w)
  return jnp.max(q @ q.T, axis=-1, keepdims=True) * x


def _sum_over_keys(w, x):
  q = jnp.tanh(x @ w)
  return jnp.sum(jnp.cos(q @ q.T), axis=-1, keepdims=True) * x


CASES = {"softmax_attention": _multihead, "max_over_keys": _max_over_keys,
         "sum_over_keys": _sum_over_keys}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pairs_are_each_examples_own(name):
  rng = np.random.default_rng(41)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(CASES[name], w, _examples(rng, LENGTHS))


def test_the_pair_mask_is_one_comparison():
  rng = np.random.default_rng(42)
  xs = _examples(rng, LENGTHS)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  packed = pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16))
  attend = pj.vmap(lambda w, x: jnp.sum(_multihead(w, x)), in_axes=(None, 0))
  jaxpr = jax.make_jaxpr(jax.grad(lambda w: jnp.sum(attend(w, packed))))(w)
  pair = (packed.rows, packed.row_length, packed.row_length)
  ops = [e.primitive.name for e in _eqns(jaxpr.jaxpr)
         if any(getattr(o.aval, "shape", ()) == pair and o.aval.dtype == np.bool_
                for o in e.outvars)]
  assert "eq" in ops and "and" not in ops, ops
