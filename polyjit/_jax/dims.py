"""Symbolic dimensions (`jax.export`): the accessors polyjit's own algebra
(`_masking/dims.py`) works on."""
from __future__ import annotations

from typing import Any

import numpy as np
from jax import export as _export
from jax._src import core as _core
from jax._src.export import shape_poly as _shape_poly

# --- symbolic dimensions (jax.export) ---------------------------------------

SymbolicScope = _export.SymbolicScope
symbolic_shape = _export.symbolic_shape
is_symbolic_dim = _export.is_symbolic_dim
DimExpr = _shape_poly._DimExpr


def dim_value_dtype() -> np.dtype[Any]:
  """The dtype of `dim_as_value` results: int32, or int64 under x64."""
  # JAX leaves this function unannotated (a stub gap).
  dtype: np.dtype[Any] = _core.dim_value_dtype()  # type: ignore[no-untyped-call, unused-ignore]
  return dtype


# The structure of a dimension expression, for polyjit's own algebra on it
# (`_masking/dims.py`): a sum of terms, each `coeff * f1**e1 * f2**e2 ...`, each factor
# a variable or an operation (floordiv, mod, max, min) on expressions.

def symbolic_vars(d: Any) -> set[str]:
  """The dimension variables a symbolic dimension expression mentions."""
  names: set[str] = d._get_vars()
  return names


def dim_terms(d: Any) -> list[tuple[list[tuple[Any, int]], int]]:
  """A symbolic expression's terms as `[([(factor, exp), ...], coeff), ...]`
  in JAX's order; a constant term has no factors."""
  return [(list(term._factors), k) for term, k in d._sorted_terms]


def factor_parts(f: Any) -> tuple[str | None, str | None, tuple[Any, ...]]:
  """A factor of a term as `(var, operation, operands)`: `(name, None, ())`
  for a variable, else `(None, 'floordiv' | 'mod' | 'max' | 'min' | ..., operands)`."""
  if f.var is not None:
    return f.var, None, ()
  return None, f.operation, tuple(f.operands)


def evaluate_symbolic(d: Any, env: dict[str, Any]) -> Any:
  """JAX's evaluation of a symbolic expression on `env`, whose values may be
  ints, traced scalars or dimension expressions (for `_dims.evaluate_dim`,
  which evaluates on ints itself)."""
  return d._evaluate(env)


def dim_variable(name: str, like: Any) -> Any:
  """The variable `name` as a dimension expression of `like`'s scope."""
  return _shape_poly._DimExpr._from_var(name, like.scope)


def dim_scope(d: Any) -> Any:
  """The `jax.export.SymbolicScope` of a symbolic dimension expression."""
  return d.scope
