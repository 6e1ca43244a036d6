"""Dtype promotion under and without `jax_enable_x64` as `jax.jit` promotes.

A NumPy float64 scalar is not weakly typed: under x64, `jnp.sum(x) +
np.float64(0.1)` is float64 for a float32 `x` under `jax.jit`, float32
without x64; a Python float is weakly typed and keeps float32 either way. The
same holds for constants the function closes over and for scalar arguments.
Each test runs one polyjit function (pj.jit, pj.mask, pj.vmap over a padded
and over a packed batch; `pj.vmap(f)` asked for again in each configuration,
as a program would) without x64, under it, and without it again, and compares
dtypes, weak types and values with `jax.jit` in the same configuration. (It
gave float32 under x64 once the function had been called without it: the
trace of the first call served the second.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

X = np.linspace(0.5, 4.5, 5, dtype=np.float32)
PADDED = np.concatenate([X, [np.nan, np.inf, -np.inf]]).astype(np.float32)

NP_F64 = np.float64(0.1)
PY_FLOAT = 0.1

# f(x, s): x a float32 example; s a scalar argument shared by the examples,
# None for the functions of x alone (whose argument types are the same with and
# without x64: only the configuration tells their traces apart)
FUNCTIONS = {
    "numpy float64 literal": (lambda x: jnp.sum(x) + np.float64(0.1), None),
    "python float literal": (lambda x: jnp.sum(x) + 0.1, None),
    "closed-over numpy float64": (lambda x: jnp.sum(x) + NP_F64, None),
    # (not a closed-over float64 NumPy *array*: JAX 0.10.2 and 0.12 fail to lower
    # `x * np.full((), 0.1)` under x64 once a function that closes over it was
    # traced without x64, jax.jit alone included: "'stablehlo.multiply' op requires
    # compatible types")
    "closed-over python float": (lambda x: x * PY_FLOAT, None),
    "numpy float64 times x": (lambda x: x * np.float64(2.0), None),
    "numpy int64 and int32 sum": (lambda x: x.astype(jnp.int32).sum() + np.int64(1), None),
    "python int and int32 sum": (lambda x: x.astype(jnp.int32).sum() + 1, None),
    "astype(float)": (lambda x: x.astype(float) * 2, None),
    "float64 scalar argument": (lambda x, s: jnp.sum(x) + s, np.float64(2.0)),
    "python float argument": (lambda x, s: x * s, 2.0),
}


def _jit(f, s, **options):
  g = pj.jit(f, **options)
  return lambda: [g(X[:3], *s), g(X, *s)]


def _mask(f, s):
  m = pj.mask(f, ["n", None][:1 + len(s)])
  def run():
    outs = [m([PADDED, *s], {"n": n}) for n in (3, 5)]
    # a padded output: its logical region
    return [o if np.ndim(o) == 0 else o[:n] for o, n in zip(outs, (3, 5), strict=True)]
  return run


def _vmap(f, s, packing=None):
  def run():
    # asked for again in each configuration, as a program would (pj.vmap
    # gives the same function for the same f)
    g = pj.vmap(f, in_axes=(0, None)[:1 + len(s)])
    out = g(pj.Ragged.from_list([X[:3], X], packing=packing), *s)
    return out.to_list() if isinstance(out, pj.Ragged) else [out[0], out[1]]
  return run


PATHS = {
    "pj.jit": _jit,
    "pj.jit explicit": lambda f, s: _jit(f, s, polymorphic_shapes=["n", None][:1 + len(s)]),
    "pj.mask": _mask,
    "pj.vmap padded": _vmap,
    "pj.vmap packed": lambda f, s: _vmap(f, s, pj.Packing(row_length=8)),
}


def _described(v):
  return str(jnp.result_type(v)), jax.typeof(jnp.asarray(v)).weak_type


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_promotes_as_jax_jit_with_and_without_x64(name, path):
  f, scalar = FUNCTIONS[name]
  s = () if scalar is None else (scalar,)
  run = PATHS[path](f, s)
  seen = set()
  for on in (False, True, False):
    with jax.enable_x64(on):
      want = [jax.jit(f)(X[:3], *s), jax.jit(f)(X, *s)]
      got = run()
      for g, w in zip(got, want, strict=True):
        if path.startswith("pj.vmap"):   # (stacked by pj.vmap: as jax.vmap stacks, not weak)
          assert str(jnp.result_type(g)) == str(jnp.result_type(w)), (on, g, w)
        else:
          assert _described(g) == _described(w), (on, _described(g), _described(w))
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
      seen.add(str(jnp.result_type(want[0])))
  assert ("python" in name) or len(seen) == 2   # (x64 changes jax.jit's answer)
