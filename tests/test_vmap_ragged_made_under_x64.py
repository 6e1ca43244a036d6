"""pj.vmap of a pj.Ragged made under x64 (float64 data), called with x64 off.

`jax.jit` and `jax.vmap` take a float64 `jax.Array` made under
`jax.enable_x64()` with x64 off and compute in float32 (with JAX's
truncation warning). `pj.vmap` raised instead: a padded batch failed to
lower (StableHLO's verifier: `multiply` of f64 and f32), a packed one
raised JAX's `lax.mul requires arguments to have the same dtypes`. Each
example is compared with `jax.jit(f)` on its own float64 array under the
same configuration. Not fixed yet (a strict xfail, whose reason says where
and how).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def f(x):
  return jnp.sum(x * 0.1) + jnp.max(x)


@pytest.mark.xfail(strict=True, reason=(
    "the masked trace (jc.make_closed_jaxpr) goes through jax.ShapeDtypeStruct, which "
    "canonicalizes float64 to float32 with x64 off, so the masked jaxpr takes f32 where "
    "the batch holds f64 (jax.jit keeps the f64 aval and converts inside). Fix: trace at "
    "the avals as they are, or convert such leaves to the traced dtype where the masked "
    "program is bound (pj.jit sends them to jax.jit: args.uncanonical_array)"))
@pytest.mark.parametrize("packing", [None, pj.Packing(row_length=16)], ids=["padded", "packed"])
def test_ragged_made_under_x64_called_without_it(packing):
  rng = np.random.default_rng(0)
  examples = [rng.normal(size=(n,)) for n in (3, 7, 5)]
  with jax.enable_x64():
    batch = pj.Ragged.from_list(examples, packing=packing)
    arrays = [jnp.asarray(e) for e in examples]
  assert arrays[0].dtype == np.float64
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)   # (JAX's truncation warning)
    want = [jax.jit(f)(a) for a in arrays]
    got = pj.vmap(f)(batch)
  assert got.dtype == want[0].dtype == np.float32
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)
