"""Data-dependent sizes: x[x > 0], nonzero, unique and friends (issue 14).

Each row is written once for an array module `xp`; the reference is NumPy on
the unpadded data, the subject is jax.numpy under pj.jit, pj.mask with traced
sizes (NaN padding) and pj.vmap over a Ragged, at selection counts 0, 1, some
and all.
"""

import importlib
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from harness import nan_padded, unpad_outputs
from polyjit._spellings import data_dependent as _data_dependent
from polyjit import _jax as jc


def _selected(xp, x):
  y = x[x > 0]
  return y * 2 + 1, xp.sum(y), xp.cumsum(y), xp.sort(-y)


def _unique_all(xp, x):
  return xp.unique(xp.round(x), return_index=True, return_inverse=True, return_counts=True)


ROWS = {  # name: (fun(xp, x), rank of x)
    "x[m]": (lambda xp, x: x[x > 0], 1),
    "downstream": (_selected, 1),
    "x[m] leading axis": (lambda xp, x: x[x[:, 0] > 0] @ xp.ones((3,), x.dtype), 2),
    "x[m] n-d mask": (lambda xp, x: xp.sum(x[x > 0] ** 2), 2),
    "nonzero": (lambda xp, x: xp.nonzero(x > 0), 2),
    "argwhere": (lambda xp, x: xp.argwhere(x > 0), 2),
    "flatnonzero": (lambda xp, x: xp.flatnonzero(x > 0), 2),
    "where(c)": (lambda xp, x: xp.where(x > 0), 1),
    "compress": (lambda xp, x: xp.compress(x[:, 1] > 0, x, axis=0), 2),
    "extract": (lambda xp, x: xp.extract(x > 0, x), 2),
    "gather": (lambda xp, x: x[xp.flatnonzero(x > 0)] * x[0], 1),
    "unique": (_unique_all, 1),
    "unique n-d": (_unique_all, 2),
}


def _data(n, count, rank, seed=0):
  """Values with exactly `count` positive entries (rounded: repeats for unique)."""
  rng = np.random.default_rng(seed + count)
  shape = (n,) if rank == 1 else (n, 3)
  size = int(np.prod(shape))
  mag = rng.integers(1, 4, size).astype(np.float32) + 0.25
  sign = np.where(rng.permutation(size) < count, 1.0, -1.0).astype(np.float32)
  return (mag * sign).reshape(shape)


def _counts(size):
  return sorted({0, 1, size // 2, size})


def _reference(fun, x):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    return fun(x)


def _close(got, want):
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    g, w = np.asarray(g), np.asarray(w)
    assert g.shape == w.shape, (g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=1e-6)


def _rows_of_rank(rank, xp):
  """Every row of that rank, as one function (one program for all of them)."""
  return lambda x: {name: fun(xp, x) for name, (fun, r) in ROWS.items() if r == rank}


def _close_rows(got, want):
  assert got.keys() == want.keys()
  for name in want:
    try:
      _close(got[name], want[name])
    except AssertionError as e:
      raise AssertionError(f"row {name!r}: {e}") from None


@pytest.mark.parametrize("rank", [1, 2])
def test_rows_under_jit_and_mask(rank):
  f = _rows_of_rank(rank, jnp)
  jitted = pj.jit(f)
  masked = pj.mask(f, ["n" if rank == 1 else "(n, _)"])
  run_masked = jax.jit(lambda x, n: masked([x], {"n": n}))
  with pj.diagnostics.count_compiles() as compiles:
    for n, counts in ((5, [1]), (7, _counts(7 * (3 if rank == 2 else 1)))):
      for count in counts:
        x = _data(n, count, rank)
        want = _reference(_rows_of_rank(rank, np), x)
        _close_rows(jitted(x), want)
        _close_rows(unpad_outputs(*run_masked(nan_padded(x, 8), n)), want)
  # pj.jit: the exact first call and bucket 16; pj.mask: one program. The
  # counts never enter a program's key.
  assert len(compiles) == 3, compiles


def test_vmap_over_ragged_with_different_counts():
  fun = lambda x: (x[x > 0], jnp.sum(x[x > 0]), jnp.unique(jnp.round(x)))
  xs = [_data(n, c, 1, seed=n) for n, c in ((3, 0), (6, 1), (2, 2), (5, 3))]
  outs = pj.vmap(fun)(pj.Ragged.from_list(xs))
  for i, x in enumerate(xs):
    ref = (x[x > 0], np.sum(x[x > 0]), np.unique(np.round(x)))
    np.testing.assert_allclose(outs[0].to_list()[i], ref[0])
    np.testing.assert_allclose(outs[1][i], ref[1], rtol=1e-6)
    np.testing.assert_allclose(outs[2].to_list()[i], ref[2])


def _grad_reference(x):
  return np.where(x > 0, 2 * x, 0).astype(x.dtype)


def test_gradients():
  loss = lambda x: jnp.sum(x[x > 0] ** 2)
  x = _data(6, 3, 1)
  # pj.jit of a gradient: the backward pass is in the traced program.
  np.testing.assert_allclose(pj.jit(jax.grad(loss))(x), _grad_reference(x))
  # The gradient of pj.mask, NaN padding: zeros in the padding, exact in the data.
  masked = pj.mask(loss, ["n"])
  g = jax.jit(jax.grad(lambda x, n: masked([x], {"n": n})[0]))(nan_padded(x, 8), 6)
  np.testing.assert_allclose(np.asarray(g)[:6], _grad_reference(x))
  assert np.all(np.asarray(g)[6:] == 0)
  # Through pj.vmap over a Ragged (per-example counts differ).
  xs = [_data(4, 1, 1, seed=1), _data(6, 4, 1, seed=2)]
  r = pj.Ragged.from_list(xs)
  g = jax.grad(lambda d: jnp.sum(pj.vmap(loss)(pj.Ragged(d, r.lengths))))(r.data)
  for i, x in enumerate(xs):
    np.testing.assert_allclose(np.asarray(g)[i, :len(x)], _grad_reference(x))


def test_empty_reduction_without_identity_raises():
  f = pj.jit(lambda x: jnp.max(x[x > 0]))
  x = _data(6, 2, 1)
  np.testing.assert_allclose(f(x), np.max(x[x > 0]))
  with pytest.raises(ValueError, match="zero-size array"):
    f(_data(6, 0, 1))
  masked = pj.mask(lambda x: jnp.argmin(x[x > 0]), ["n"])
  with pytest.raises(ValueError, match="zero-size array"):
    masked([nan_padded(_data(5, 0, 1), 8)], {"n": 5})
  out, _ = jax.jit(lambda x, n: pj.mask(lambda x: jnp.min(x[x > 0]), ["n"])([x], {"n": n}))(
      nan_padded(_data(5, 0, 1), 8), 5)
  assert np.isnan(out)  # traced sizes cannot raise: NaN, never a number
  # Reading an element of an empty selection: NumPy's IndexError; slicing: empty.
  first = pj.jit(lambda x: (x[x > 0][0], x[x > 0][1:]))
  x = _data(6, 2, 1)
  np.testing.assert_allclose(first(x)[0], x[x > 0][0])
  with pytest.raises(IndexError, match="index out of bounds"):
    first(_data(6, 0, 1))
  np.testing.assert_array_equal(pj.jit(lambda x: x[x > 0][1:])(_data(6, 0, 1)), np.zeros(0))
  # Outputs that no computed size shapes, no checks: no read-back, same answers.
  total = pj.jit(lambda x: (jnp.sum(x[x > 0]), jnp.asarray(x[x > 0].shape[0])))
  for count in (0, 4):
    x = _data(6, count, 1)
    np.testing.assert_allclose(total(x), (np.sum(x[x > 0]), count))


def test_mask_api_keeps_the_plain_form_without_data_dependent_sizes():
  masked = pj.mask(lambda x: jnp.cumsum(x), ["n"])
  out = masked([np.arange(4.0, dtype=np.float32)], {"n": 3})
  assert isinstance(out, jax.Array)
  out, shapes = pj.mask(lambda x: x[x > 1], ["n"])([np.arange(4.0, dtype=np.float32)],
                                                  {"n": 3})
  assert int(shapes[0]) == 1 and float(out[0]) == 2.0


def test_explicit_spellings_under_plain_jax_jit_have_size_semantics():
  x = _data(6, 2, 1)
  # Under polyjit: exact sizes.
  np.testing.assert_array_equal(pj.jit(pj.nonzero)(x > 0)[0], np.nonzero(x > 0)[0])
  np.testing.assert_allclose(pj.jit(pj.unique)(np.round(x)), np.unique(np.round(x)))
  # Eagerly: NumPy's results.
  np.testing.assert_allclose(pj.boolean_mask(x, x > 0), x[x > 0])
  # Under plain jax.jit: padded to the bound, filled past the count.
  (idx,) = jax.jit(pj.nonzero)(x > 0)
  np.testing.assert_array_equal(idx, np.r_[np.nonzero(x > 0)[0], [0] * 4])
  sel = jax.jit(lambda x: pj.boolean_mask(x, x > 0, fill_value=-7.0))(x)
  np.testing.assert_allclose(sel, np.r_[x[x > 0], [-7.0] * 4])
  x2 = _data(4, 5, 2)
  cols = pj.jit(lambda x: (pj.boolean_mask(x, x[0] > 0, axis=1), pj.boolean_mask(x, x > 0)))(x2)
  np.testing.assert_allclose(cols[0], x2[:, x2[0] > 0])
  np.testing.assert_allclose(cols[1], x2[x2 > 0])
  u = jax.jit(pj.unique)(np.round(x))
  assert u.shape == (6,)


def test_unsupported_forms_raise_clear_errors():
  x = _data(6, 3, 2)
  with pytest.raises(pj.MaskingError, match="branch|loop"):
    pj.jit(lambda x: jax.lax.map(lambda r: jnp.sum(r[r > 0]), x))(x)
  with pytest.raises(pj.MaskingError, match="under jax.vmap"):
    pj.jit(lambda x: jax.vmap(lambda r: jnp.sum(r[r > 0]))(x))(x)
  with pytest.raises(pj.MaskingError, match="together with other indices"):
    pj.jit(lambda x: x[x[:, 0] > 0, 0])(x)
  with pytest.raises(pj.MaskingError, match="data-dependent size"):
    pj.jit(lambda x: x[x > 0][:2] if x[x > 0].shape[0] >= 2 else x[:1, 0])(x)
  # JAX's own comparison of a selection's size (slice_sizes <= its length), under
  # traced sizes: answered for a selection long enough and checked in the
  # program (issue 31, as `lax.top_k(y, k)`), also with a domain too large to
  # list (never a KeyError from checking a guard on the selection's size
  # against the input sizes); a selection too short poisons the outputs.
  f = lambda x: jax.lax.dynamic_slice(x[x > 0], (jnp.int32(1),), (2,))
  masked = pj.mask(f, ["n"])
  for padded in (8, 60_000):
    data = _data(5, 3, 1)
    out, _ = jax.jit(lambda x, n: masked([x], {"n": n}))(nan_padded(data, padded), 5)
    np.testing.assert_array_equal(out, f(jnp.asarray(data)))
    short = -np.abs(data)
    out, _ = jax.jit(lambda x, n: masked([x], {"n": n}))(nan_padded(short, padded), 5)
    assert np.all(np.isnan(out))


# --- the JAX functions polyjit intercepts ---------------------------------------------

def test_intercepted_spellings_match_this_jax():
  """A JAX that renames, moves or re-signs an intercepted function fails here."""
  ours = {"nonzero": _data_dependent.nonzero, "flatnonzero": _data_dependent.flatnonzero,
          "argwhere": _data_dependent.argwhere, "where": _data_dependent.where,
          "compress": _data_dependent.compress, "extract": _data_dependent.extract,
          "unique": _data_dependent.unique, "getitem": _data_dependent.getitem}
  names = {fn: name for name, fn in ours.items()}
  targets = [(m, a, names[r]) for m, a in jc.SWAP_SITES
             if (r := jc.replacement_of(getattr(importlib.import_module(m), a))) in names]
  assert {n for _, _, n in targets} == set(ours)
  for module, attr, name in targets:
    original = getattr(importlib.import_module(module), attr)
    params = list(inspect.signature(original).parameters.values())
    mine = list(inspect.signature(ours[name]).parameters.values())[1:]  # after `original`
    if name == "getitem":  # forwards **kwargs; the array and index come first
      assert [p.name for p in params[:2]] == ["arr", "idx"], params
      continue
    assert [(p.name, p.kind) for p in params] == [(p.name, p.kind) for p in mine], (
        module, attr, params)
  # The function behind Array.__getitem__ is the one intercepted.
  from jax._src.numpy import array_methods, indexing
  assert "indexing.rewriting_take" in inspect.getsource(array_methods._getitem)
  assert indexing.rewriting_take is not None
