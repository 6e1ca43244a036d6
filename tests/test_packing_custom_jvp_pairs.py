"""`jax.custom_jvp` functions on attention scores (pairs of tokens) in a packed
`pj.vmap`: `jax.nn.relu`, `jax.nn.softplus` and `jax.nn.log_sigmoid` on
scores run packed and differentiate (their rule raised an internal error
from inside JAX's differentiation, past `pj.vmap`'s fallback), and a
function returning a token broadcast onto pairs gives each example's own
values (its output was taken as zero off each example's block, and the
other examples' tokens of the row leaked into the product). Checked against
each example alone under `jax.jit`, values and gradients, NaN and inf in the
rows' tails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_packing import _check, _examples


@jax.custom_jvp
def _broadcast_rows(x):
  return jnp.broadcast_to(x[:, None], (x.shape[0], x.shape[0]))


_broadcast_rows.defjvp(lambda p, t: (_broadcast_rows(p[0]), _broadcast_rows(t[0])))


def _scores(w, x):
  return (x @ w) @ jnp.tanh(x @ w).T


CASES = {
    "relu": lambda w, x: jax.nn.relu(_scores(w, x)) @ x,
    "softplus_log_sigmoid": lambda w, x: (jax.nn.softplus(_scores(w, x)) @ x,
                                          jnp.sum(jax.nn.log_sigmoid(_scores(w, x)), axis=1)),
    "returns_a_token_broadcast": lambda w, x: _broadcast_rows(jnp.tanh(x @ w)[:, 0]) @ x,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_custom_jvp_on_pairs_is_exact(name):
  rng = np.random.default_rng(22)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  _check(CASES[name], w, _examples(rng))
