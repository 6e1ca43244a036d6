"""pj.vmap of a pj.Ragged made under x64 (float64 or int64 data), called with
x64 off, and one made without x64 called under it.

`jax.jit` traces a float64 `jax.Array` made under `jax.enable_x64()` at its
float64 type, also with x64 off: JAX's functions convert it where they
would (`x * 0.1`, `jnp.sum`: float32, with JAX's truncation warning) and the
rest keeps it (`lax.reduce_sum(x * x)`: float64). `pj.vmap` traced it as
float32 (through `jax.ShapeDtypeStruct`) and then crashed: a padded batch
failed to lower (StableHLO's verifier: `multiply` of f64 and f32), a packed
one raised JAX's `lax.mul requires arguments to have the same dtypes`. Each
example is compared with `jax.jit(f)` on its own array under the same
configuration (values and dtypes), with NaN and inf in the batch's padding,
eagerly, under `jax.jit` and under `jax.grad`.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

LENGTHS = (3, 7, 5)
ROW = 16


def converts(x):   # JAX's functions convert float64 to float32 (x64 off)
  return jnp.sum(x * 0.1) + jnp.max(x)


def keeps(x):      # lax keeps float64: jax.jit's output is float64
  return lax.reduce_sum(x * x, (0,))


def per_token(x):  # an output per token (float64 kept)
  return jnp.sin(x) * x


def _garbage(shape, dtype):
  if np.issubdtype(dtype, np.floating):
    return np.where(np.indices(shape).sum(0) % 2, np.nan, np.inf).astype(dtype)
  return np.full(shape, np.iinfo(dtype).max, dtype)


def _poisoned(batch):
  """`batch` with NaN and inf (an int's maximum) in its padding, its data a
  jax.Array of the data's own dtype (made under x64 where it is 64-bit)."""
  with jax.enable_x64(np.asarray(batch.data).dtype.itemsize == 8):
    if isinstance(batch, pj.PackedRagged):
      valid = np.asarray(batch.valid())
      data = np.array(batch.data)
      data[~valid] = _garbage(data[~valid].shape, data.dtype)
      return pj.PackedRagged(jnp.asarray(data), batch.lengths, batch.starts, batch.segments,
                             batch.positions, batch.nonempty)
    mask = np.asarray(batch.mask)
    data = np.asarray(batch.data)
    return pj.Ragged(jnp.asarray(np.where(mask, data, _garbage(data.shape, data.dtype))),
                     batch.lengths)


def _batch(examples, packing, x64):
  with jax.enable_x64(x64):
    batch = _poisoned(pj.Ragged.from_list(examples, packing=packing))
    arrays = [jnp.asarray(e) for e in examples]
  return batch, arrays


def _data_as(batch, data):
  leaves, tree = jax.tree.flatten(batch)
  return jax.tree.unflatten(tree, [data, *leaves[1:]])


def _outputs(out):
  return out.to_list() if isinstance(out, (pj.Ragged, pj.PackedRagged)) else list(out)


def _assert_as_jax_jit(got, want):
  assert len(got) == len(want)
  for i, (g, w) in enumerate(zip(got, want, strict=True)):
    assert np.asarray(g).dtype == np.asarray(w).dtype, (i, np.asarray(g).dtype, w.dtype)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6,
                               err_msg=str(i))


PACKINGS = pytest.mark.parametrize("packing", [None, pj.Packing(row_length=ROW)],
                                   ids=["padded", "packed"])


@PACKINGS
@pytest.mark.parametrize("fun", [converts, keeps, per_token])
def test_float64_ragged_called_without_x64_is_jax_jit(packing, fun):
  rng = np.random.default_rng(0)
  batch, arrays = _batch([rng.normal(size=(n,)) for n in LENGTHS], packing, True)
  assert np.asarray(batch.data).dtype == arrays[0].dtype == np.float64
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")   # (and JAX's truncation warning)
    want = [jax.jit(fun)(a) for a in arrays]
    # (jax.jit(jax.vmap(fun)) over a stack of examples makes the same dtype)
    stacked = jax.jit(jax.vmap(fun))(jnp.stack([arrays[0]] * 2))
    got = _outputs(pj.vmap(fun)(batch))
    jitted = _outputs(jax.jit(pj.vmap(fun))(batch))
  # A packed batch of `keeps` runs unpacked, and says so: the packed segment sum
  # would compute in float32 (`packed_eval._uncanonical_in_rule`).
  unpacked = [w for w in caught if issubclass(w.category, pj.PerformanceWarning)]
  assert bool(unpacked) == (packing is not None and fun is keeps), unpacked
  assert stacked.dtype == want[0].dtype
  _assert_as_jax_jit(got, want)
  _assert_as_jax_jit(jitted, want)


@PACKINGS
@pytest.mark.parametrize("fun", [converts, keeps])
def test_float64_ragged_gradient_without_x64_is_jax_jit(packing, fun):
  if packing is not None and fun is keeps:
    pytest.skip("JAX's own transpose of a gather of float64 with x64 off fails "
                "(lax.scatter of f32 and f64): the unpacked run gathers the rows")
  rng = np.random.default_rng(1)
  batch, arrays = _batch([rng.normal(size=(n,)) for n in LENGTHS], packing, True)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    want = [jax.jit(jax.grad(fun))(a) for a in arrays]
    loss = lambda data: jnp.sum(pj.vmap(fun)(_data_as(batch, data)))
    grad = jax.jit(jax.grad(loss))(batch.data)
  got = _data_as(batch, grad).to_list()
  _assert_as_jax_jit(got, want)
  assert all(np.isfinite(np.asarray(g)).all() for g in got)


def int_sum(x):
  return jnp.sum(x * 3) + jnp.max(x)


def int_tokens(x):
  return x * 2 - 1


@PACKINGS
@pytest.mark.parametrize("fun", [int_sum, int_tokens])
def test_int64_ragged_called_without_x64_is_jax_jit(packing, fun):
  rng = np.random.default_rng(2)
  batch, arrays = _batch([rng.integers(-9, 9, size=(n,)) for n in LENGTHS], packing, True)
  assert arrays[0].dtype == np.int64
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    want = [jax.jit(fun)(a) for a in arrays]
    got = _outputs(pj.vmap(fun)(batch))
  _assert_as_jax_jit(got, want)


@PACKINGS
@pytest.mark.parametrize("fun", [converts, keeps, per_token])
def test_float32_ragged_called_under_x64_is_jax_jit(packing, fun):
  rng = np.random.default_rng(3)
  batch, arrays = _batch([rng.normal(size=(n,)).astype(np.float32) for n in LENGTHS],
                         packing, False)
  with jax.enable_x64(True):
    want = [jax.jit(fun)(a) for a in arrays]
    got = _outputs(pj.vmap(fun)(batch))
    grad = jax.grad(lambda d: jnp.sum(pj.vmap(fun)(_data_as(batch, d))))(batch.data) \
        if fun is not per_token else None
    grad_want = [jax.grad(fun)(a) for a in arrays] if grad is not None else None
  _assert_as_jax_jit(got, want)
  if grad is not None:
    _assert_as_jax_jit(_data_as(batch, grad).to_list(), grad_want)
