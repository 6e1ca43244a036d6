"""Packed values whose size can shrink as the example grows (`jnp.roll`'s
`n - mod(-k, n)` and `mod(-k, n)`), through a masking rule one padded row per
example: the row must hold the size's largest value over every length up to
the row's, not its value at the row's length (`mod(-16, n)` is 0 at 16, and
4 at 5), or the example's tokens past it are lost.

Each example is checked against itself alone under `jax.jit`, values and the
gradient, with NaN and inf in the rows' unused tails (`test_packing._check`);
the roll cases include an empty example.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from test_packing import _check, _examples


@pytest.mark.parametrize("shift", [3, 16, 17, -16, -33, 32])
def test_roll_by_at_least_the_row_length_is_exact(shift):
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(lambda w, x: jnp.roll(x @ w, shift, axis=0), w,
         _examples(rng, [5, 0, 1, 9, 13, 3, 2]))


def test_a_suffix_from_a_shrinking_start_through_a_masking_rule_is_exact():
  """`x[mod(-17, n):]` (size `n - mod(-17, n)`: 1 at 16, 3 at 5) into a
  cumulative sum, one padded row per example (before: a TypeError, the row
  sized at the suffix's value at 16)."""
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(lambda w, x: jnp.cumsum(x[(-17) % x.shape[0]:] @ w, axis=0), w,
         _examples(rng, [5, 1, 9, 13, 16, 3, 2]))
