"""Elementwise primitives: padding stays in padding, so they bind unchanged.

An elementwise op maps position i of its operands to position i of its result,
so garbage in the padding can only produce garbage in the padding. NaN, inf,
integer division by zero: XLA never traps, so none of it escapes.
"""

from __future__ import annotations

from typing import Any

from ..core import RuleContext, register

UNARY = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i0e",
    "bessel_i1e", "cbrt", "ceil", "clz", "conj", "cos", "cosh", "digamma",
    "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "imag",
    "integer_pow", "is_finite", "lgamma", "log", "log1p", "logistic", "neg",
    "not", "population_count", "real", "reduce_precision", "round", "rsqrt",
    "sign", "sin", "sinh", "sqrt", "square", "tan", "tanh",
    "convert_element_type", "bitcast_convert_type", "copy",
    "stop_gradient", "optimization_barrier",
)

BINARY = (
    "add", "add_any", "and", "atan2", "complex", "div", "eq", "eq_to", "ge", "gt",
    "igamma", "igamma_grad_a", "igammac", "le", "le_to", "lt", "lt_to", "max", "min", "mul",
    "mulhi", "ne", "nextafter", "or", "polygamma", "pow", "rem", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "sub", "xor", "zeta",
)

NARY = ("select_n", "clamp", "regularized_incomplete_beta")

ELEMENTWISE = UNARY + BINARY + NARY


@register(*ELEMENTWISE)
@register("one_minus_square", optional=True)  # (1 - x**2: tanh's derivative, JAX after 0.11.0)
# (Horner's rule on x and its coefficients, which broadcast: erf's, JAX 0.12)
@register("polynomial", optional=True)
def _elementwise(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
  return ctx.bind(*args, **params)
