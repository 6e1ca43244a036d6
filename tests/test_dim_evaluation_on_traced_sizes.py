"""A dimension expression evaluated on traced sizes (`_masking/dims.py`,
`evaluate_dim`) gives what JAX's own evaluation gives, and what Python's
integer arithmetic gives at those sizes, for every kind of factor: sums,
products, powers, floor division and modulo (negative operands included),
max and min; and its trace holds no more equations than JAX's.

polyjit evaluates these itself: JAX's evaluation asks `operator.index` of
each traced operand whether it is a constant, and each refusal builds an
error message that walks the whole trace so far (quadratic in the size of
a function with many data-dependent sizes).
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from jax import export

from polyjit import _jax as jc
from polyjit._masking import dims as _dims

N, M = export.symbolic_shape("n, m")

EXPRESSIONS = {
    "linear": 3 * N - 2 * M + 7,
    "product": N * M + N * N * 2 - 1,
    "floordiv": (N + 5) // 3 - M // 2,
    "mod": (2 * N + 1) % 4 + M % 3,
    "floordiv_negative": (N - 3 * M) // 4,
    "mod_negative": (N - 2 * M) % 3,
    "max": export.symbolic_shape("max(n, 2*m)")[0],
    "min_nested": export.symbolic_shape("min(n + 1, floordiv(m, 2)) + n")[0],
}
SIZES = list(itertools.product((1, 2, 5, 9), (1, 3, 8)))


def _python(d, n, m):
  return _dims._evaluate_int(d, {"n": n, "m": m})


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_traced_evaluation_matches_jax_and_python(name):
  d = EXPRESSIONS[name]
  ours = jax.jit(lambda n, m: _dims.evaluate_dim(d, {"n": n, "m": m}))
  jaxs = jax.jit(lambda n, m: jc.evaluate_symbolic(d, {"n": n, "m": m}))
  dtype = jc.dim_value_dtype()
  for n, m in SIZES:
    a, b = np.asarray(n, dtype), np.asarray(m, dtype)
    got, want = ours(a, b), jaxs(a, b)
    assert got.dtype == want.dtype == dtype
    assert int(got) == int(want) == _python(d, n, m), (name, n, m)
  # (mixed: one size an int, the other traced)
  for n, m in SIZES:
    got = jax.jit(lambda m: _dims.evaluate_dim(d, {"n": n, "m": m}))(np.asarray(m, dtype))
    assert int(got) == _python(d, n, m)


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_traced_evaluation_costs_no_more_equations_than_jax(name):
  d = EXPRESSIONS[name]
  dtype = jc.dim_value_dtype()
  args = (np.asarray(2, dtype), np.asarray(3, dtype))
  ours = jax.make_jaxpr(lambda n, m: _dims.evaluate_dim(d, {"n": n, "m": m}))(*args)
  jaxs = jax.make_jaxpr(lambda n, m: jc.evaluate_symbolic(d, {"n": n, "m": m}))(*args)
  assert len(ours.eqns) <= len(jaxs.eqns) + 1, (ours, jaxs)
