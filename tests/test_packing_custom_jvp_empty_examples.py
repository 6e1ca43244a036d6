"""A `jax.custom_jvp` rule on tokens differentiates packed with empty examples.

The packed evaluation keeps an empty example's per-example values out of
every derivative (`Layout.off_empty`): it replaced them with another
example's under `lax.stop_gradient`. A custom JVP rule evaluated packed
(`packed_custom.py`) computes its tangents with the same ops, so an op on a
per-example tangent (`jnp.sum(t) * 2.0`) put a `stop_gradient` on a tangent,
which JAX cannot transpose: `jax.grad` raised "Transpose rule (for
reverse-mode differentiation) for 'stop_gradient' not implemented" where the
padded batch and each example alone differentiate. Compared with each
example alone under `jax.jit` (an empty example's sum is 0), NaN and inf in
the unused tail.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj
from test_packing import _poison


@jax.custom_jvp
def doubled_total(v):
  return jnp.sum(v, axis=0) * 2.0


@doubled_total.defjvp
def _doubled_total_jvp(primals, tangents):
  (v,), (t,) = primals, tangents
  return doubled_total(v), jnp.sum(t, axis=0) * 2.0


def loss(w, x):
  return jnp.sum(jnp.tanh(doubled_total(x @ w)) * w[0])


def test_custom_jvp_rule_on_per_example_tangents_with_empty_examples():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  examples = [rng.normal(size=(n, 3)).astype(np.float32) for n in (5, 0, 9, 13, 0, 3)]
  batch = _poison(pj.Ragged.from_list(examples, packing=pj.Packing(row_length=16)))
  step = jax.jit(jax.value_and_grad(lambda w: pj.vmap(loss, in_axes=(None, 0))(w, batch).sum()))
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.PerformanceWarning)   # packed, not the fallback
    value, grad = step(w)
  one = jax.jit(jax.value_and_grad(loss))
  refs = [one(w, jnp.asarray(x)) for x in examples]
  np.testing.assert_allclose(value, sum(r[0] for r in refs), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, sum(r[1] for r in refs), rtol=1e-4, atol=1e-5)
