"""`jnp.stack` (the `stack` primitive) and `unstack` in a packed `pj.vmap`.

`jnp.stack` binds JAX's `stack` primitive, which had no packed rule: a
function that builds its per-token values with it (rotary position
embeddings, `jnp.stack([cos, sin], -1).reshape(n, d)`) ran unpacked with a
`pj.PerformanceWarning`, where the `jnp.concatenate` form packed. A stack
never moves data along the tokens: a new axis after the token axis, or
before it (`jnp.stack([a, b])` of per-token `a`, `b` is `(2, n, d)`, whose
token axis is then axis 1), binds on the packed rows as it is. Each case is
checked against each example alone under `jax.jit` (values, and the
gradient with respect to the shared parameters), NaN and inf in the rows'
unused tails, with no warning (`test_packing._check`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_packing import _check, _examples


def _angles(n, width=4):
  pos = jnp.arange(n, dtype=jnp.float32)
  freq = jnp.exp(-np.log(100.0) * jnp.arange(width // 2, dtype=jnp.float32) / width)
  return pos[:, None] * freq[None, :]                         # (n, width // 2)


def _rotary_table(w, x):
  """The table as rotary embeddings build it: (cos, sin) interleaved."""
  n = x.shape[0]
  a = _angles(n)
  table = jnp.stack([jnp.cos(a), jnp.sin(a)], -1).reshape(n, 4)
  return jnp.tanh(x @ w) * table


def _rotary_applied(w, x):
  """Rotary embeddings applied to the pairs of features of `x @ w`."""
  n = x.shape[0]
  h = (x @ w).reshape(n, 2, 2)
  a = _angles(n)
  c, s = jnp.cos(a), jnp.sin(a)
  x1, x2 = h[..., 0], h[..., 1]
  return jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(n, 4)


def _before_tokens(w, x):
  """A new leading axis, before the tokens: (2, n, 4)."""
  h = x @ w
  s = jnp.stack([h, jnp.tanh(h) * w[0, 0]])
  # (outputs put the tokens first: pj.vmap returns them as a pj.Ragged)
  return (jnp.moveaxis(s, 1, 0), jnp.einsum("knd,kd->nd", s, w[:2]),
          jnp.sum(s ** 2, axis=(0, 2)), s[1] * s[0])


def _before_tokens_summed(w, x):
  h = x @ w
  # (2, 4): over the tokens (bounded values: a float32 sum of exp(h) in the
  # hundreds fed to the loss's sin differs from the float64 one in its
  # gradient's second digit, whichever the order of its additions)
  return jnp.sum(jnp.stack([h, jnp.tanh(h)], 0) * w[1], axis=1)


def _between(w, x):
  """A new axis between the tokens and the features: (n, 3, 4)."""
  h = x @ w
  return jnp.stack([h, jnp.sin(h), h * w[2]], 1).max(axis=1)


def _shorter_values(w, x):
  """Values one token shorter than the example (`x[1:]`): `n - 1` per slot."""
  h = jnp.tanh(x @ w)
  return jnp.stack([h[1:], h[:-1]], -1).reshape(-1, 8) @ jnp.ones((8, 2))


def _unstacked(w, x):
  h = jnp.stack([x @ w, jnp.cos(x @ w)], 1)                  # (n, 2, 4)
  a, b = jnp.unstack(h, axis=1)
  c, d = jnp.unstack(jnp.stack([a, b * w[0]]), axis=0)       # (2, n, 4): before the tokens
  return a * b + c - d


CASES = {
    "rotary_table": _rotary_table,
    "rotary_applied": _rotary_applied,
    "new_axis_before_the_tokens": _before_tokens,
    "new_axis_before_the_tokens_summed_over_them": _before_tokens_summed,
    "new_axis_between_tokens_and_features": _between,
    "values_shorter_than_the_example": _shorter_values,
    "unstack_after_and_before_the_tokens": _unstacked,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stack_packs_exactly(name):
  rng = np.random.default_rng(13)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(CASES[name], w, _examples(rng))


def test_rotary_stack_binds_stack():
  """The cases above test the `stack` primitive (not another lowering)."""
  jaxpr = jax.make_jaxpr(_rotary_table)(jnp.ones((3, 4)), jnp.ones((5, 3)))
  assert "stack" in {e.primitive.name for e in jaxpr.jaxpr.eqns}


def test_stack_before_the_tokens_merged_with_them_runs_unpacked_exactly():
  """(2, n, 4) -> (2n, 4) puts both stacked values' tokens on one axis of
  length 2n, longer than the example's slot: that reshape has no packed rule,
  so the call runs unpacked, with the warning, and exactly."""
  def fun(w, x):
    h = x @ w
    return jnp.cumsum(jnp.stack([h, -h]).reshape(-1, 4), axis=0)
  rng = np.random.default_rng(14)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(fun, w, _examples(rng), expect_warning=True)
