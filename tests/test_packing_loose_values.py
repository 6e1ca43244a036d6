"""Values the packed layout leaves unselected on the tail keep that flag.

A projection with traced parameters (`x @ w`) is left *loose* on the tail
(0 times an inf in `w` is NaN there) and selected by the op that uses it.
Where a value goes on as a bare array, its flags stay behind: the outputs of
a `jax.custom_jvp` function, and the carries and outputs of a loop of a
fixed length. Such a projection came out of them as if zero on the tail,
`tanh` kept its NaN there, and attention multiplied it into every example
of the row: NaN where each example alone under `jax.jit` gives -1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from test_packing import _check, _examples


@jax.custom_jvp
def _project(x, w):
  return x @ w


_project.defjvp(lambda p, t: (p[0] @ p[1], t[0] @ p[1] + p[0] @ t[1]))


def _attend(x, v):
  return jax.nn.softmax(jnp.tanh(x) @ jnp.tanh(x).T, axis=-1) @ jnp.tanh(v)


CASES = {
    "custom_jvp_output": lambda w, x: _attend(x, _project(x, w)),
    "fixed_loop_carry": lambda w, x: _attend(
        x, lax.fori_loop(0, 2, lambda i, y: x @ w, jnp.zeros((x.shape[0], 4)))),
    "fixed_scan_output": lambda w, x: _attend(
        x, lax.scan(lambda c, _: (c, x @ w), 0.0, None, length=1)[1][0]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_projection_with_an_inf_parameter_through_a_boundary(name):
  rng = np.random.default_rng(33)
  w = rng.normal(size=(3, 4)).astype(np.float32)
  w[0, 0] = -np.inf   # x @ w: -inf on every token (tanh: -1), NaN on the tail
  xs = [np.abs(x) + 0.5 for x in _examples(rng)]
  _check(CASES[name], jnp.asarray(w), xs)
