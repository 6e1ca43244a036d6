"""A traced shared scalar next to per-token values in a packed `pj.vmap`.

`jnp` leaves a scalar operand unbroadcast (`w / x` is `div w x` with `w`
`f32[]`, `x ** p` is `pow x p`), so the packed layout sees a shared value in
the op itself. Its cotangent sums the op's derivative over every token, the
unused tail's included, where the per-token operand is 0: `d(w / x)/dw =
1 / x` and `d(x ** p)/dp = log(x) x ** p` (JAX's, at x = 0 and p < 0) are
infinite or NaN there, and 0 times them was NaN in the gradient of `w` and
`p`, where each example alone under `jax.jit` gives finite numbers. So on
values held one padded row per example (longer than the example: `jnp.pad`),
for shared scalars and per-example ones (`jnp.mean(x)`), whose NaN reached
the example's own tokens' gradient.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from test_packing import _check, _examples


def _longer(x):
  return jnp.abs(jnp.pad(x, ((1, 1), (0, 0)))) + 0.5


def _scores(w, x):
  return (x @ w) @ jnp.tanh(x @ w).T


CASES = {
    "scalar_over_tokens": lambda w, x: jnp.sum(w[0, 0] / (jnp.abs(x) + 0.5), axis=0),
    "tokens_to_a_negative_power": lambda w, x: jnp.sum((jnp.abs(x) + 0.1) ** w[0, 0], axis=0),
    # on pairs of tokens: the zeros off each example's block
    "scores_to_a_negative_power": lambda w, x: ((jnp.abs(_scores(w, x)) + 0.1) ** w[0, 0]) @ x,
    # one padded row per example (through the masking rules)
    "scalar_over_a_longer_value": lambda w, x: jnp.sum(w[0, 0] / _longer(x), axis=0),
    "a_longer_value_to_a_negative_power": lambda w, x: jnp.sum(_longer(x) ** w[0, 0], axis=0),
    "per_example_scalar_over_a_longer_value": lambda w, x: jnp.sum(
        jnp.mean(x) * w[0, 0] / _longer(x), axis=0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_traced_scalar_gets_no_derivative_from_the_tail(name):
  rng = np.random.default_rng(34)
  w = rng.normal(size=(3, 4)).astype(np.float32)
  w[0, 0] = -0.5
  _check(CASES[name], jnp.asarray(w), _examples(rng))
