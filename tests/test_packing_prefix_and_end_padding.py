"""Prefixes of the tokens and padding at their end, in a packed `pj.vmap`.

`lax.slice` of the first `n - 1` tokens keeps each token where it is in its
example's slot, and `lax.pad` of one value at the end of `n - 1` tokens
(`_spellings/along_axis.py` gathers from such arrays) writes the slot's next
position: both run on the packed rows (`packed_eval._slice`, `_pad`), the
rest of the slot zero. Checked against each example alone under `jax.jit`
(values, and the gradient with respect to the shared parameters, the padding
value's included), NaN and inf in the rows' unused tails, no warning
(`test_packing._check`). Examples of one token (an empty prefix) included.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from test_packing import _check, _examples

LENGTHS = [5, 1, 9, 13, 1, 2]


def _prefix(x):
  return lax.slice_in_dim(x, 0, x.shape[0] - 1, axis=0)


def _prefix_of_tokens(w, x):
  h = jnp.tanh(x @ w)
  p = _prefix(h)
  return p * 2.0, jnp.sum(p, axis=0), lax.slice(h, (0, 1), (h.shape[0] - 1, 4), (1, 2))


def _padded_at_the_end(w, x):
  h = _prefix(x @ w)                                          # n - 1 tokens
  padded = lax.pad(h, w[0, 0], ((0, 1, 0), (1, 0, 0)))        # n tokens, 5 features
  return padded * jnp.exp(x[:, :1]), jnp.sum(padded ** 2, axis=0)


def _padded_by_nothing(w, x):
  return lax.pad(jnp.sin(x @ w), w[1, 1], ((0, 0, 0), (0, 2, 0)))


def _padded_with_a_per_example_value(w, x):
  """(a per-example padding value: one padded row per example, exact)"""
  return lax.pad(_prefix(x @ w), jnp.mean(x), ((0, 1, 0), (0, 0, 0))) + x[:, :1]


CASES = {
    "prefix_of_tokens": _prefix_of_tokens,
    "padded_at_the_end": _padded_at_the_end,
    "padded_by_nothing": _padded_by_nothing,
    "padded_with_a_per_example_value": _padded_with_a_per_example_value,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_prefix_and_end_padding_pack_exactly(name):
  rng = np.random.default_rng(8)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(CASES[name], w, _examples(rng, LENGTHS))
