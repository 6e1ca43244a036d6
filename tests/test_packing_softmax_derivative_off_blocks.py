"""Softmax's quotient on packed rows: its derivative between two examples of a row.

`packed_pairs._normalize` divides the scores' exponentials `e` by their row
sums `z` kept per token. Off each example's block `e` is exactly 0, so the
quotient's value there is 0 (selected), but its derivative there is not
always: where a query's `z` is 0 (it attends to nothing, its softmax row NaN
for the example alone too) the tangent `de / z - e dz / z**2` is NaN on the
pairs between its example and the others, and a contraction along the first
axis of the scores (`P.T @ v`) sums them into the other examples' outputs;
and where the cotangent there is infinite (`dy_i . v_c`, a product of two
examples' finite numbers that overflows), `e == 0` times it is NaN in the
query's own row sum. Each example alone never forms those pairs: its value,
tangent and gradient stay finite. Checked against each example alone under
`jax.jit`, the unused tail of every row holding NaN and inf.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_packing import _poison, with_data


# (`jax.nn.softmax` as JAX's custom_jvp function too: its rule's `y` is the quotient)
CUSTOM_JVP = pytest.mark.parametrize("custom_jvp", [False, True])


@CUSTOM_JVP
def test_a_query_with_no_key_keeps_its_tangent_in_its_example(custom_jvp):
  """`jax.jvp` of attention contracted along the queries' axis: the marked
  example's NaN row stays in it (its neighbours' tangents are finite alone)."""
  rng = np.random.default_rng(31)
  xs = [rng.normal(size=(n, 3)).astype(np.float32) for n in (9, 5, 1)]
  xs[1][2, 0] = 100.0   # this query attends to nothing: its softmax row is NaN
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  t = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))

  def attend(w, x):
    q = jnp.tanh(x @ w)
    s = jnp.where(x[:, :1] > 50, -jnp.inf, q @ q.T)
    return jnp.sum(jnp.sin(jax.nn.softmax(s, axis=-1).T @ x))

  packed = _poison(pj.Ragged.from_list(xs, packing=pj.Packing(row_length=16)))
  assert packed.rows == 1
  batch = pj.vmap(attend, in_axes=(None, 0))
  with jax.softmax_custom_jvp(custom_jvp):
    _, got = jax.jit(lambda w, t: jax.jvp(lambda w: batch(w, packed), (w,), (t,)))(w, t)
    for i, x in enumerate(xs):
      _, want = jax.jit(lambda w, t: jax.jvp(lambda w: attend(w, x), (w,), (t,)))(w, t)
      np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-4, err_msg=str(i))
  assert np.isfinite(got[0]) and np.isfinite(got[2])


@CUSTOM_JVP
def test_an_overflowing_cotangent_between_two_examples_stays_out(custom_jvp):
  """Example 0 weighs its outputs by 1e20, example 1's values are 1e20: alone
  each gradient is finite, but `dy_i . v_c` between them is inf in f32."""
  rng = np.random.default_rng(32)
  a = rng.normal(size=(5, 3)).astype(np.float32)
  a[:, 0] = 1e20
  b = rng.normal(size=(4, 3)).astype(np.float32)
  b[:, 1] = 1e20

  def attend(x):
    s = x[:, 2:3] @ x[:, 2:3].T
    y = jax.nn.softmax(s, axis=-1) @ jax.lax.stop_gradient(x[:, 1:2])
    return jnp.sum(y * jax.lax.stop_gradient(x[:, :1]))

  packed = _poison(pj.Ragged.from_list([a, b], packing=pj.Packing(row_length=16)))
  assert packed.rows == 1
  with jax.softmax_custom_jvp(custom_jvp):
    grad = jax.jit(jax.grad(lambda d: jnp.sum(pj.vmap(attend)(with_data(packed, d)))))(
        packed.data)
    want = jax.jit(jax.grad(attend))(a)
  got = with_data(packed, grad).to_list()
  assert np.isfinite(want).all()
  # (example 1's own gradient is a difference of terms near 1e20: compared
  # only where it is not rounding)
  np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)
  assert np.isfinite(got[1]).all()
