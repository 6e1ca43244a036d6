"""Packed values with two axes along the example whose sizes are not both the
example's length (`jnp.ones((n, n - 1))`, `(n, 2n)`, a token broadcast to
`(n, n - 1)`): the per-row pair layout holds only `(n, n)` blocks, so these
must not be held as pairs (they were, and sums over them counted `n` where
the example has `n - 1` or `2n`). Checked against each example alone under
`jax.jit`, values and gradients, NaN and inf in the rows' tails.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from test_packing import _check, _examples

CASES = {
    "ones_n_by_n_minus_1": lambda w, x: jnp.sum(jnp.ones((x.shape[0], x.shape[0] - 1)),
                                                axis=1) * x[:, 0],
    "shared_n_by_2n": lambda w, x: jnp.mean(jnp.full((x.shape[0], 2 * x.shape[0]), w[0, 0]),
                                            axis=1)[:, None] * (x @ w),
    "token_n_by_n_minus_1": lambda w, x: jnp.sum(
        jnp.broadcast_to((x @ w)[:, :1], (x.shape[0], x.shape[0] - 1)), axis=1),
    # the first axis n - 1: a total over both axes
    "ones_n_minus_1_by_n_total": lambda w, x: jnp.sum(jnp.sum(
        jnp.ones((x.shape[0] - 1, x.shape[0])), axis=1)) * w[0, 0] + jnp.sum(x),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pairs_of_other_sizes_are_exact(name):
  rng = np.random.default_rng(21)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(CASES[name], w, _examples(rng, [5, 2, 9, 13]))
