"""Elementwise primitives: padding stays in padding, so they bind unchanged.

An elementwise op maps position i of its operands to position i of its result,
so garbage in the padding can only produce garbage in the padding. NaN, inf,
integer division by zero: XLA never traps, so none of it escapes.

Except in time, where JAX lowers an elementwise special function to a loop
that runs until *every* lane has converged (`CONVERGING`): `lax.betainc`'s
continued fraction updates every lane on every step, so a padding lane that
converges late changes the valid lanes' results (by 1e-6 here), and garbage
that never converges runs to the iteration limit. Their operands' padding is
filled with a copy of a valid lane (the first along each dynamic axis, the
same mapping for every operand, so each padding lane repeats a valid lane's
arguments): the loop stops when the valid lanes have converged, as for
`jax.jit` on the unpadded arrays. The copy is a `stop_gradient`: nothing
reaches the valid lane from the padding's cotangents.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from ... import _jax as jc
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
    "name",   # (`jax.ad_checkpoint.checkpoint_name`: the identity, with a tag for remat)
)

BINARY = (
    "add", "add_any", "and", "atan2", "complex", "div", "eq", "eq_to", "ge", "gt",
    "igamma", "igamma_grad_a", "igammac", "le", "le_to", "lt", "lt_to", "max", "min", "mul",
    "mulhi", "ne", "nextafter", "or", "polygamma", "pow", "rem", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "sub", "xor", "zeta",
)

NARY = ("select_n", "clamp", "regularized_incomplete_beta")

ELEMENTWISE = UNARY + BINARY + NARY

#: Lowered to a loop until every lane converges (JAX's special-function lowering).
CONVERGING = ("regularized_incomplete_beta", "igamma", "igammac", "igamma_grad_a")


@register(*CONVERGING)
def _converging(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
  return ctx.bind(*[_padding_of_a_valid_lane(ctx, x, aval)
                    for x, aval in zip(args, ctx.in_avals, strict=True)], **params)


def _padding_of_a_valid_lane(ctx: RuleContext, x: Any, aval: Any) -> Any:
  shape: Any = getattr(aval, "shape", ())
  for axis, d in enumerate(shape):
    if not jc.is_symbolic_dim(d) or jnp.shape(x)[axis] == 0:
      continue
    first = jnp.broadcast_to(lax.slice_in_dim(x, 0, 1, axis=axis), jnp.shape(x))
    x = lax.select(ctx.env.valid_mask(aval, [axis], ctx.eqn), x, lax.stop_gradient(first))
  return x


@register(*[name for name in ELEMENTWISE if name not in CONVERGING])
@register("one_minus_square", optional=True)  # (1 - x**2: tanh's derivative, JAX after 0.11.0)
# (Horner's rule on x and its coefficients, which broadcast: erf's, JAX 0.12)
@register("polynomial", optional=True)
def _elementwise(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
  return ctx.bind(*args, **params)
