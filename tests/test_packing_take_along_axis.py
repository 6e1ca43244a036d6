"""`jnp.take_along_axis` of per-token values in a packed `pj.vmap`.

A cross-entropy's `jnp.take_along_axis(log_softmax(logits), targets[:, None],
axis=-1)` gathers with the tokens a batch axis of both the array and the
indices: each token reads its own entries only, so the gather binds on the
packed rows as it is (`packed_contractions._gather`), its tail selected to
zero. Checked against each example alone under `jax.jit` (values, and the
gradient with respect to the shared parameters, whose cotangent reaches the
array through the gather's scatter-add), NaN and inf in the rows' unused
tails (the indices' tail too: 7), no warning (`test_packing._check`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_packing import LENGTHS, _check

V = 4


def _cross_entropy(w, ex):
  x, t = ex
  logp = jax.nn.log_softmax(x @ w)
  lp = jnp.take_along_axis(logp, t[:, None], axis=-1)
  return -jnp.sum(lp), lp[:, 0]


def _several_per_token(w, ex):
  """(n, 2, 4) taken along its last axis with (n, 2, 3) indices: the tokens
  and a fixed axis batched, negative indices wrapped, out of range clipped."""
  x, t = ex
  h = jnp.stack([x @ w, jnp.tanh(x @ w)], 1)
  i = jnp.stack([t[:, None] + jnp.arange(3) - 1, -t[:, None] * jnp.arange(3)], 1)
  return (jnp.take_along_axis(h, i, axis=-1, mode="clip"),
          jnp.take_along_axis(h, i % V, axis=2, mode="fill", fill_value=-1.0))


def _along_a_fixed_middle_axis(w, ex):
  x, t = ex
  h = (x @ w)[:, :, None] * w[0]                              # (n, 4, 4)
  return jnp.sum(jnp.take_along_axis(h, t[:, None, None] % V, axis=1) ** 2, axis=0)


CASES = {
    "cross_entropy": _cross_entropy,
    "several_per_token": _several_per_token,
    "along_a_fixed_middle_axis": _along_a_fixed_middle_axis,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_take_along_axis_packs_exactly(name):
  rng = np.random.default_rng(21)
  w = jnp.asarray(rng.normal(size=(3, V)).astype(np.float32))
  examples = [(rng.normal(size=(n, 3)).astype(np.float32),
               rng.integers(0, V, n).astype(np.int32)) for n in LENGTHS]
  _check(CASES[name], w, examples)
