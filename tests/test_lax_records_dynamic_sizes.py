"""`lax` ops from JAX's own op records at dynamic sizes: exact under both entry points.

Each row is one op: `lax.associative_scan` (a non-commutative combination of
a pytree, forward and reverse; `axis=1`), the ops that need a lower bound on the size
(`lax.top_k(x, 3)`, `dynamic_slice`/`dynamic_update_slice` of 2 or 3,
negative `lax.pad`, `gather`/`scatter_add` windows of 2, `split(x, (2, n - 2))`),
`x[n // 2]` and `lax.index_take`. Checked against `jax.jit` on the unpadded input:

* `pj.jit` over sizes 0..100, the small ones first (where `jax.jit` raises,
  `pj.jit` raises too): exact, no fallback warning, and fewer programs than
  sizes (compiles counted with `jax.monitoring`);
* `pj.vmap` over a `pj.Ragged` whose padding holds NaN, values and gradients:
  the bound a row needs is learned from the function (`_ragged/bounds.py`),
  and an example below it is a `pj.ShapeError` naming it (checked on the host
  for concrete lengths, in the program for traced lengths and grouped batches);
* two `pj.vmap` arguments of equal lengths that the function needs ordered
  (`dynamic_update_slice(x[n, 4], u[n, 2])`).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import nan_padded

SIZES = (0, 1, 2, 3, 17, 100, 20, 90)
P = 32   # pj.vmap's padded length


def _gather2(x):
  dn = lax.GatherDimensionNumbers(offset_dims=(0,), collapsed_slice_dims=(),
                                  start_index_map=(0,))
  return lax.gather(x, jnp.array([1]), dn, (2,), mode="clip")


def _scatter_add2(x):
  dn = lax.ScatterDimensionNumbers(update_window_dims=(0,), inserted_window_dims=(),
                                   scatter_dims_to_operand_dims=(0,))
  return lax.scatter_add(x, jnp.array([1]), jnp.arange(1.0, 3.0, dtype=x.dtype), dn,
                         mode="clip")


def _affine(a, b):   # (x -> a0 x + a1) then (x -> b0 x + b1): not commutative
  return (a[0] * b[0], a[1] * b[0] + b[1])


# name: (fun, the smallest size at which jax.jit runs it, differentiable)
CASES = {
    "associative_scan_max_2d_axis1_reverse": (
        lambda x: lax.associative_scan(jnp.maximum, jnp.stack([x, -x]), axis=1,
                                       reverse=True).T, 0, True),
    "associative_scan_affine_pytree": (
        lambda x: lax.associative_scan(_affine, (jnp.tanh(x) * 0.5 + 1.0, x))[1], 0, True),
    "associative_scan_affine_reverse": (
        lambda x: lax.associative_scan(_affine, (jnp.tanh(x) * 0.5 + 1.0, x),
                                       reverse=True)[1], 0, True),
    "top_k_3": (lambda x: lax.top_k(x, 3)[0], 3, True),
    "dynamic_slice_2": (lambda x: lax.dynamic_slice(x, (1,), (2,)), 2, True),
    "dynamic_slice_3_from_end": (
        lambda x: lax.dynamic_slice(x, (x.shape[0] - 3,), (3,)), 3, True),
    "dynamic_update_slice_2": (
        lambda x: lax.dynamic_update_slice(x, jnp.array([7.0, 8.0], x.dtype), (1,)), 2, True),
    "negative_pad": (lambda x: lax.pad(x, jnp.float32(0), ((-1, -1, 0),)), 2, True),
    "gather_window_2": (_gather2, 2, True),
    "scatter_add_window_2": (_scatter_add2, 2, True),
    "split_2_rest": (lambda x: lax.split(x, (2, x.shape[0] - 2))[1], 2, True),
    "index_half": (lambda x: x[x.shape[0] // 2], 1, True),
    "index_take": (lambda x: lax.index_take(x, (jnp.array([0, -1, 2]),), (0,)), 1, True),
}


class Compiles:
  """Backend compiles while the block is open (jax.monitoring)."""
  count = 0
  active = False

  def __enter__(self):
    Compiles.count, Compiles.active = 0, True
    return self

  def __exit__(self, *exc):
    Compiles.active = False


def _listen(event, *args, **kwargs):
  if event == "/jax/core/compile/backend_compile_duration" and Compiles.active:
    Compiles.count += 1


jax.monitoring.register_event_duration_secs_listener(_listen)


def data(n, seed=0):
  return (np.random.default_rng(n + 1000 * seed).standard_normal(n) * 0.5).astype(np.float32)


def reference(fun, x):
  try:
    return jax.jit(fun)(x), None
  except Exception as e:  # noqa: BLE001  (compared with what pj.jit raises)
    return None, e


@pytest.mark.parametrize("name", sorted(CASES))
def test_pj_jit_exact_over_sizes_with_bounded_programs(name):
  fun, lowest, _ = CASES[name]
  f = pj.jit(fun)
  with warnings.catch_warnings(), Compiles() as compiles:
    warnings.simplefilter("error", pj.FallbackWarning)
    for n in SIZES:
      x = data(n)
      Compiles.active = False
      want, error = reference(fun, x)
      Compiles.active = True
      if error is not None:
        assert n < lowest, (name, n, error)
        with pytest.raises(Exception):
          f(x)
        continue
      got = f(x)
      jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5),
                   got, want)
  # Every size that runs, in at most one program per bucket and one exact
  # program for the first call and for size 0.
  runs = sum(n >= lowest for n in SIZES)
  assert compiles.count < runs, (name, compiles.count, runs)
  assert compiles.count <= 7, (name, compiles.count)


def ragged(xs):
  return pj.Ragged(np.stack([nan_padded(x, P) for x in xs]),
                   np.array([len(x) for x in xs], np.int32))


def lengths_for(lowest):
  return (max(lowest, 1), 17, max(lowest, 1) + 1, P, 5)


def _rows(out):
  return out.to_list() if isinstance(out, pj.Ragged) else list(np.asarray(out))


@pytest.mark.parametrize("name", sorted(CASES))
def test_pj_vmap_over_nan_padded_ragged_values_and_gradients(name):
  fun, lowest, differentiable = CASES[name]
  xs = [data(n, seed=1) for n in lengths_for(lowest)]
  r = ragged(xs)
  for x, got in zip(xs, _rows(pj.vmap(fun)(r)), strict=True):
    np.testing.assert_allclose(got, jax.jit(fun)(x), rtol=1e-5, atol=1e-5)
  if not differentiable:
    return

  def loss(x):
    return jnp.sum(jnp.sin(fun(x)))
  grads = pj.vmap(jax.grad(loss))(r)
  for x, got in zip(xs, _rows(grads), strict=True):
    want = jax.jit(jax.grad(loss))(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("name", ["top_k_3", "dynamic_slice_3_from_end", "split_2_rest"])
def test_pj_vmap_example_below_the_learned_bound(name):
  fun, lowest, _ = CASES[name]
  lengths = (lowest + 2, lowest - 1, 9)
  r = ragged([data(n) for n in lengths])
  with pytest.raises(pj.ShapeError, match=rf"example 1 has lengths n0_0 = {lowest - 1} "
                     r"(.|\n)*learned from .* that it needs 'n0_0"):
    pj.vmap(fun)(r)
  # Lengths traced by the caller's jax.jit, and a batch in length groups, are
  # checked in the program (a callback raises: JAX wraps the error).
  with pytest.raises(Exception, match=rf"example 1 has lengths n0_0 = {lowest - 1} "):
    jax.block_until_ready(jax.jit(lambda r: pj.vmap(fun)(r))(r))
  xs = [data(n) for n in (lowest + 2, 9, lowest - 1, 20)]
  grouped = pj.Ragged.from_list(xs, groups=pj.LengthGroups(groups=2, rows=2))
  with pytest.raises(Exception, match=rf"example 2 has lengths n0_0 = {lowest - 1} "):
    jax.block_until_ready(pj.vmap(fun)(grouped).to_list())


def test_pj_vmap_ragged_arguments_the_function_needs_ordered():
  def update(x, u):
    return lax.dynamic_update_slice(x, u, (0, 1))
  lengths = (3, 17, 1, 9)
  rng = np.random.default_rng(0)
  xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in lengths]
  us = [rng.standard_normal((n, 2)).astype(np.float32) for n in lengths]
  rx, ru = ragged(xs), ragged(us)
  for x, u, got in zip(xs, us, _rows(pj.vmap(update)(rx, ru)), strict=True):
    np.testing.assert_array_equal(got, jax.jit(update)(x, u))
  grads = pj.vmap(jax.grad(lambda x, u: jnp.sum(update(x, u) ** 2), argnums=(0, 1)))(rx, ru)
  for b, (x, u) in enumerate(zip(xs, us, strict=True)):
    want = jax.grad(lambda x, u: jnp.sum(update(x, u) ** 2), argnums=(0, 1))(x, u)
    for g, w in zip(grads, want, strict=True):
      np.testing.assert_allclose(g.to_list()[b], w, rtol=1e-5)
  # An update longer than its operand fails fun itself: named, before running.
  longer = ragged([u if b != 2 else np.ones((2, 2), np.float32) for b, u in enumerate(us)])
  with pytest.raises(pj.ShapeError, match="example 2 has lengths n0_0 = 1 .* n1_0 = 2"):
    pj.vmap(update)(rx, longer)
