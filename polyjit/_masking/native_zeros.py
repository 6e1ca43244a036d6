"""Native mode: which values' padding is already exactly zero.

`native.step` fills the padding of `dot_general`'s operands with zeros (a
select: one pass over the operand, which XLA cannot fuse into the dot) so
that its transpose multiplies the zero cotangent in the padding by 0, never
by garbage. Where the operand's padding is *already* exactly zero the fill
changes nothing but costs that pass; the hand-written version skips it
because its padding is zero by construction. This module is the forward
dataflow fact "this value's padding is exactly zero" (finite: +0 or -0),
proven per equation from its inputs' facts:

* sources: a literal zero broadcast (`jnp.zeros`), the output of a fill, a
  masked `x[i]` gather in native mode (`native._promised_gather` zeroes the
  rows of padded indices: a select fused into the gather), and a
  `scatter-add` (`segment_sum`) into a zero-padded operand (its masking rule
  lands nothing in the padding: dropped entries add -0.0);
* propagation: elementwise ops that map 0 to 0 when *every* operand is
  zero-padded or a zero literal (add, sub, max, min, select_n's cases, neg,
  tanh, ...); `mul` also by a finite literal (0 * x is NaN for x NaN or inf,
  so a non-literal operand must be zero-padded itself); `div` by a finite
  nonzero literal; concatenation along a static axis; transpose, squeeze,
  expand_dims; a broadcast that adds no dynamic axis; `custom_jvp` and inline
  calls through their jaxprs (jax.nn.relu is `max(x, 0.0)`).

Anything else (a function input, a dot, a reduction, a scan) is unknown.
The facts are kept per evaluation by object identity (`mark`, `known`), like
`native.wrap`'s clean values; `outputs` is the one rule both the runtime and
the static analysis of a sub-jaxpr use.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import _jax as jc

#: f(0) == 0, exactly and finitely, whatever the dtype.
_UNARY = frozenset({
    "neg", "convert_element_type", "copy", "reduce_precision", "real", "imag", "conj",
    "sign", "floor", "ceil", "round", "stop_gradient", "tanh", "sin", "sinh", "tan", "asin",
    "asinh", "atan", "atanh", "expm1", "log1p", "erf", "erf_inv", "sqrt", "cbrt", "abs"})
#: f(0, ..., 0) == 0: zero-padded when every operand is.
_EVERY = frozenset({"add", "add_any", "sub", "max", "min", "mul"})
_SHAPE = frozenset({"transpose", "squeeze", "expand_dims"})
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call"})


def _is_dynamic(aval: Any) -> bool:
  return any(jc.is_symbolic_dim(d) for d in getattr(aval, "shape", ()))


def literal_value(v: Any) -> Any:
  """A literal's value in its aval's dtype, the one the program computes with:
  `lax.mul(x, 1e300)` keeps the Python float 1e300 in a float32 literal,
  which is inf there (and `lax.div(x, 1e-46)` divides by 0)."""
  with np.errstate(over="ignore", under="ignore", invalid="ignore"):
    return np.asarray(v.val).astype(v.aval.dtype)


def smallest_normal(v: Any) -> Any:
  """The smallest normal number of a literal's dtype (XLA:CPU may flush a
  subnormal divisor to 0)."""
  return np.finfo(v.aval.dtype).tiny if np.issubdtype(v.aval.dtype, np.inexact) else 1


def numeric_literal(v: Any) -> bool:
  """A literal holding numbers (not JAX's float0 tangent of an integer, a
  void dtype that compares with nothing)."""
  return isinstance(v, jc.Literal) and np.dtype(getattr(v.aval, "dtype")).kind != "V"


def _literal(v: Any, test: Any) -> bool:
  return numeric_literal(v) and bool(np.all(test(literal_value(v))))


def _zero_literal(v: Any) -> bool:
  return _literal(v, lambda a: a == 0)


def _finite_literal(v: Any) -> bool:
  return _literal(v, np.isfinite)


def outputs(eqn: jc.JaxprEqn, facts: Sequence[bool]) -> list[bool]:
  """Per output of `eqn`: whether its padding is exactly zero, given per
  input (`facts[i]`, for variables; literals are read here) whether its
  padding is. (A masked gather's zeroed padding is marked by `native.step`.)"""
  name = eqn.primitive.name
  zero = [f or _zero_literal(v) for v, f in zip(eqn.invars, facts, strict=True)]
  n = len(eqn.outvars)
  if name in _UNARY:
    return [zero[0] and _is_dynamic(eqn.invars[0].aval)]
  if name == "integer_pow":
    return [zero[0] and eqn.params["y"] > 0]
  if name == "mul":  # 0 * x is 0 only for a finite x
    return [all(z or _finite_literal(v) for z, v in zip(zero, eqn.invars, strict=True))
            and any(zero)]
  if name in _EVERY:
    return [all(zero)]
  if name == "select_n":
    return [all(zero[1:])]
  if name == "div":
    return [zero[0] and _literal(eqn.invars[1], lambda a: np.isfinite(a) & (np.abs(a) >= smallest_normal(eqn.invars[1])))]
  if name in _SHAPE:
    return [zero[0]]
  if name == "concatenate":
    out_shape: Any = getattr(eqn.outvars[0].aval, "shape")
    return [all(zero) and not jc.is_symbolic_dim(out_shape[eqn.params["dimension"]])]
  if name == "broadcast_in_dim":
    return [_zero_literal(eqn.invars[0]) or (zero[0] and _adds_no_dynamic_axis(eqn))]
  if name in ("scatter-add", "scatter_add"):
    return [zero[0]]
  if name == "custom_jvp_call":
    return jaxpr_outputs(eqn.params["call_jaxpr"].jaxpr, zero)
  if name in _CALLS and "jaxpr" in eqn.params:
    return jaxpr_outputs(eqn.params["jaxpr"].jaxpr, zero)
  return [False] * n


def _adds_no_dynamic_axis(eqn: jc.JaxprEqn) -> bool:
  in_shape: Any = getattr(eqn.invars[0].aval, "shape")
  out_shape: Any = getattr(eqn.outvars[0].aval, "shape")
  dims = eqn.params["broadcast_dimensions"]
  return all(not jc.is_symbolic_dim(d) or (a in dims and in_shape[dims.index(a)] == d)
             for a, d in enumerate(out_shape))


def jaxpr_outputs(jaxpr: jc.Jaxpr, facts: Sequence[bool]) -> list[bool]:
  """`outputs` over a whole jaxpr (a custom_jvp function's, a call's), evaluated
  in native mode equation by equation as the runtime does."""
  known = {v for v, f in zip(jaxpr.invars, facts, strict=True) if f}
  for eqn in jaxpr.eqns:
    if not any(_is_dynamic(v.aval) for v in eqn.outvars):
      continue  # (no padding)
    ins = [not isinstance(v, jc.Literal) and v in known for v in eqn.invars]
    known.update(v for v, f in zip(eqn.outvars, outputs(eqn, ins), strict=True) if f)
  return [not isinstance(v, jc.Literal) and v in known for v in jaxpr.outvars]


# --- per evaluation ----------------------------------------------------------

def _table(env: Any) -> dict[int, Any]:
  table: dict[int, Any] | None = getattr(env, "_native_zero", None)
  if table is None:
    table = env._native_zero = {}
  return table


def mark(env: Any, x: Any) -> Any:
  """Records that `x`'s padding is exactly zero (the entry keeps `x` alive,
  so its id is not reused)."""
  _table(env)[id(x)] = x
  return x


def known(env: Any, x: Any) -> bool:
  return _table(env).get(id(x)) is x


def record_parts(env: Any, y: Any, xs: Sequence[Any], eqn: jc.JaxprEqn) -> None:
  """Records that `y` concatenates `xs` along a static axis (if it does),
  for `native._operand` to fill its parts instead."""
  out_shape: Any = getattr(eqn.outvars[0].aval, "shape")
  dimension = eqn.params["dimension"]
  if _is_dynamic(eqn.outvars[0].aval) and not jc.is_symbolic_dim(out_shape[dimension]):
    table: dict[int, Any] = env.__dict__.setdefault("_native_parts", {})
    table[id(y)] = (y, (list(xs), [v.aval for v in eqn.invars], dimension))


def parts(env: Any, y: Any) -> tuple[list[Any], list[Any], int] | None:
  """The parts, their avals and the axis `y` concatenates, if recorded."""
  hit = getattr(env, "_native_parts", {}).get(id(y))
  return hit[1] if hit is not None and hit[0] is y else None
