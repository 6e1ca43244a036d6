"""Values made from the length alone, longer than the example, run packed exactly.

`jnp.arange(n + 1)`, `jnp.ones(n + 1)`, `jnp.linspace(0, 1, n + 1)`,
`jnp.ones((2 * n, 2))` are an `iota` or a `broadcast_in_dim` of a size that
no example's slot in a packed row can hold (only `n` tokens are its own).
They were held in the slot anyway: the entries past the example's `n` were
dropped (a sum of `jnp.ones(n + 1)` was `n`), and an output read the next
example's first token in their place (`jnp.arange(n + 1)` of an example of
length 5 came back `[0 1 2 3 4 0]`), silently. Such a value now stays one
padded row per example, as `jnp.pad`'s longer result does.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from test_packing import WITH_EMPTY, _check, _examples

LONGER = {
    "arange_output": lambda w, x: (jnp.arange(x.shape[0] + 1), jnp.arange(2 * x.shape[0])),
    "ones_summed": lambda w, x: jnp.sum(jnp.ones(x.shape[0] + 1) * w[0, 0]),
    "linspace_summed": lambda w, x: jnp.sum(jnp.linspace(0.0, 1.0, x.shape[0] + 1)) * w[0],
    "extremum_of_arange": lambda w, x: (jnp.max(jnp.arange(x.shape[0] + 2) * w[0, 0]),
                                        jnp.argmax(jnp.arange(x.shape[0] + 2))),
    "ones_output": lambda w, x: jnp.ones((2 * x.shape[0], 2)) * w[0, :2],
    "per_example_value_broadcast": lambda w, x: jnp.ones(x.shape[0] + 1) * jnp.sum(x @ w),
    "sliced_back_to_the_tokens": lambda w, x: (
        jnp.arange(x.shape[0] + 1)[1:] * x[:, 0] * w[0, 0],
        jnp.cumsum(jnp.ones(x.shape[0] + 1) * w[0, 1]),
        (jnp.arange(2 * x.shape[0]).reshape(x.shape[0], 2) * 1.0) @ w[:2]),
}


@pytest.mark.parametrize("name", sorted(LONGER))
def test_values_longer_than_the_example_are_exact(name):
  rng = np.random.default_rng(41)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(LONGER[name], w, _examples(rng))


def test_with_empty_examples():
  rng = np.random.default_rng(42)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(lambda w, x: (jnp.arange(x.shape[0] + 1), jnp.sum(jnp.ones(x.shape[0] + 1) * w[0, 0]),
                       jnp.ones((2 * x.shape[0], 2)) * w[0, :2]),
         w, _examples(rng, WITH_EMPTY))
