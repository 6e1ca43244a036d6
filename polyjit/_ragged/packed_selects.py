"""Which selects an elementwise op on packed tokens needs (the tail invariant).

`packed_eval.py` holds every per-token value at exactly 0 on the tail. An
elementwise op can break that in two ways: its value on the tail may not be
0 (`x + b`, `exp(x)`), which a select of its result repairs; or its
derivative there may not be finite (`sqrt`, `rsqrt`, `log`, `x / y` at 0),
so that the zero cotangent on the tail times it is NaN, which a select of
its operand stops (its transpose zeroes the tail's cotangent before it
reaches another op). `selects` decides both from the op and from which
operands are *loose* (may hold anything on the tail: a shared value, a
projection with traced parameters; on pairs also a token broadcast along a
row). `fill` replaces the two selects with one where the op is exactly 0 at
some value of its operand (`exp` at -inf). Only what is needed is written:
selects are a pass over memory each where XLA cannot fuse them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import _jax as jc

#: Elementwise ops whose derivative in every operand is 0 or +-1 wherever the
#: operands are: a NaN cotangent can never come out of them, so their operands
#: need no select whatever the other operands hold.
BOUNDED_DERIVATIVE = frozenset({"add", "add_any", "sub", "max", "min", "select_n", "neg",
                                 "convert_element_type", "copy", "real", "imag", "conj",
                                 "stop_gradient", "reduce_precision"})
#: The value of those binary ops at a zero tail and a constant: zero there
#: means the result needs no select either.
_AT_ZERO = {"add": np.add, "add_any": np.add, "sub": np.subtract, "max": np.maximum,
            "min": np.minimum}


#: f(0) == 0 with a finite derivative at 0: zero tails stay zero, no selects.
_ZERO_AT_ZERO = frozenset({"tanh", "sin", "tan", "erf", "erf_inv", "atan", "asinh", "sinh",
                           "log1p", "expm1", "square", "abs", "sign", "floor", "ceil",
                           "round"})
#: f(0) finite with a finite derivative at 0: the result's tail is selected.
#: (`add`, `neg`, `max`, ...: `BOUNDED_DERIVATIVE`, decided before these)
_FINITE_AT_ZERO = frozenset({"exp", "exp2", "cos", "cosh", "logistic", "erfc"})


def finite_constant(x: Any) -> bool:
  if isinstance(x, jc.Tracer):
    return False
  a = np.asarray(x)
  return bool(a.dtype.kind in "biuf" and np.all(np.isfinite(a)))


def selects(eqn: Any, invals: list[Any], loose: list[bool]) -> tuple[bool, bool]:
  """(select the operands, select the result) for an elementwise op. Every
  operand is zero on the tail but the `loose` ones (a shared value; in a row
  of pairs also a token's value broadcast along the row), which may hold
  anything there. None where the op keeps the tail zero with a finite
  derivative; the result alone where its value on the tail may be non-zero
  but no derivative there can be; both (the double select) otherwise."""
  name = eqn.primitive.name
  others = [v for v, lo in zip(invals, loose, strict=True) if lo]
  constant = all(finite_constant(v.val) for v in others)
  if name in BOUNDED_DERIVATIVE:
    if not others:
      return False, False
    at_zero = _AT_ZERO.get(name)
    zero = (constant and at_zero is not None and len(invals) == 2 and bool(np.all(
        at_zero(*[np.asarray(v.val) if lo else np.zeros(())
                  for v, lo in zip(invals, loose, strict=True)]) == 0)))
    return False, not zero
  if not constant:
    return True, True
  if (name == "mul" or name in _ZERO_AT_ZERO
      or (name == "integer_pow" and eqn.params["y"] >= 1)
      or (name == "div" and not loose[0] and loose[1]
          and bool(np.all(np.asarray(invals[1].val) != 0)))):
    return (False, False) if len(others) < len(invals) else (False, True)
  if name in _FINITE_AT_ZERO:
    return False, True
  return True, True


#: The largest constant computed at trace time (elements): folding a bigger one
#: would store it in the program.
_FOLD_LIMIT = 4096


#: Ops of one operand that are exactly 0, with a finite derivative, at a
#: value: the operand filled with it on the tail (one select, where the
#: double select takes two).
_FILLS = {"exp": -np.inf, "exp2": -np.inf, "logistic": -np.inf, "rsqrt": np.inf, "log": 1.0,
          "lgamma": 1.0}


def fill(eqn: Any, loose: list[bool]) -> tuple[int, float] | None:
  """(operand, value) to select that operand to on the tail in place of a
  double select: the op's value there is then exactly 0 and its derivatives
  finite (`exp(-inf)`, `rsqrt(inf)`, `log(1)`, `x / 1` and `atan2(x, 1)` of a
  zero `x`). The other operands must be zero on the tail (not loose)."""
  name = eqn.primitive.name
  if len(loose) == 1:
    if name in _FILLS:
      return 0, _FILLS[name]
    if name == "integer_pow" and eqn.params["y"] < 0:
      return 0, np.inf
    return None
  if name in ("div", "atan2") and len(loose) == 2 and not loose[0]:
    return 1, 1.0
  return None


def foldable(eqn: Any, args: Sequence[Any]) -> bool:
  """An equation of constants alone (`jnp.sqrt(16.0)`, a frequency table),
  with no effect and a small result: computed while tracing, as `jax.jit`'s
  own constant folding would, so that an op combining it with tokens sees a
  finite constant and takes no select."""
  return (not eqn.effects and not any(isinstance(x, jc.Tracer) for x in args)
          and all(np.prod(o.aval.shape, dtype=np.int64) <= _FOLD_LIMIT for o in eqn.outvars))
