"""polyjit's own algebra on symbolic dimension expressions.

A dimension expression (`2*n + 1`, `n - floordiv(n, 2)`, `max(n, m)`) comes
from `jax.export`; polyjit needs more of it than JAX offers: its value at
concrete sizes in Python ints (no int32 overflow), its linear form (to solve
padded sizes from argument shapes), whether it is monotone (whether a value's
data fits in its padded buffer, see `_masking.core.MaskEnv`), and an upper bound over
a box of sizes (for sizes that are not monotone). This module computes them.

It reads the structure of an expression (a sum of terms `coeff * product of
factor**exp`, each factor a variable or an operation on expressions) only
through the accessors of `polyjit/_jax/` (`dim_terms`, `factor_parts`,
`symbolic_vars`, `evaluate_symbolic`, `dim_variable`), so that it knows no
private name of JAX's.
"""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import jax.numpy as jnp
import numpy as np

from .. import _jax as jc

#: A dimension: an int or a JAX symbolic dimension expression (`jc.DimExpr`,
#: whose arithmetic JAX does not type).
Dim: TypeAlias = Any

#: An interval of integers, (lowest, highest).
Interval: TypeAlias = tuple[int, int]


def dim_vars(d: Dim) -> set[str]:
  """The dimension variables an expression mentions (empty for an int)."""
  return jc.symbolic_vars(d) if jc.is_symbolic_dim(d) else set()


def evaluate_dim(d: Dim, env: dict[str, Any]) -> Any:
  """Evaluates a dimension expression on `env` (ints or traced int scalars).

  With ints in `env` the result is a Python int; with traced values it is a
  traced scalar of `jc.dim_value_dtype()`.
  """
  if not jc.is_symbolic_dim(d):
    return int(d)
  if all(isinstance(v, int) for v in env.values()):
    return _evaluate_int(d, env)  # Python ints: no int32 overflow, no tracing
  if not any(jc.is_symbolic_dim(v) for v in env.values()):
    try:
      return _evaluate_values(d, env)
    except KeyError:   # (a variable JAX normalizes away: its own evaluation)
      pass
  res = jc.evaluate_symbolic(d, env)
  if isinstance(res, (int, np.integer)):
    return int(res)
  return res


def _evaluate_int(d: Dim, env: dict[str, int]) -> int:
  if not jc.is_symbolic_dim(d):
    return int(d)
  total = 0
  for factors, k in jc.dim_terms(d):
    value = k
    for factor, exp in factors:
      value *= _factor_int(factor, env) ** exp
    total += value
  return total


def _evaluate_values(d: Dim, env: dict[str, Any]) -> Any:
  """`d` on traced (or mixed) sizes, as JAX's evaluation computes it (a
  value of `jc.dim_value_dtype()`, floor division and modulo as `divmod`'s),
  without JAX's: that asks `operator.index` of each traced operand whether it
  is a constant 0 or 1, and each refusal builds an error message that walks
  the whole trace so far (quadratic in the size of the function: most of the
  trace time of a function with many data-dependent slices)."""
  if not jc.is_symbolic_dim(d):
    return int(d)
  dtype = jc.dim_value_dtype()
  total: Any = None
  for factors, k in jc.dim_terms(d):
    value: Any = None
    for factor, exp in factors:
      f = _factor_value(factor, env)
      for _ in range(exp):
        value = f if value is None else value * f
    term = np.asarray(k, dtype) if value is None else value if k == 1 else value * np.asarray(k, dtype)
    total = term if total is None else total + term
  return np.asarray(0, dtype) if total is None else total


def _factor_value(f: Any, env: dict[str, Any]) -> Any:
  var, operation, operands = jc.factor_parts(f)
  if var is not None:
    return env[var]
  a, b = (_evaluate_values(o, env) for o in operands)
  if operation == "floordiv":
    return divmod(a, b)[0]
  if operation == "mod":
    return divmod(a, b)[1]
  if operation in ("max", "min"):
    if isinstance(a, int) and isinstance(b, int):
      return max(a, b) if operation == "max" else min(a, b)
    return (jnp.maximum if operation == "max" else jnp.minimum)(a, b)
  raise KeyError(operation)   # (an operation polyjit does not know: JAX's evaluation)


def _factor_int(f: Any, env: dict[str, int]) -> int:
  var, operation, operands = jc.factor_parts(f)
  if var is not None:
    return env[var]
  a, b = (_evaluate_int(o, env) for o in operands)
  assert operation is not None  # a factor is a variable or an operation
  return {"floordiv": lambda: a // b, "mod": lambda: a % b,
          "max": lambda: max(a, b), "min": lambda: min(a, b)}[operation]()


def linear_form(d: Dim) -> tuple[dict[str, int], int] | None:
  """`d` as `{var: coeff}, const` when it is linear in its variables, else None.

  Used to solve padded sizes from argument shapes: `2*n + 1` -> ({'n': 2}, 1).
  """
  if not jc.is_symbolic_dim(d):
    return {}, int(d)
  coeffs: dict[str, int] = {}
  const = 0
  for factors, k in jc.dim_terms(d):
    if not factors:
      const += k
      continue
    var = _term_var(factors)
    if var is None:
      return None
    coeffs[var] = coeffs.get(var, 0) + k
  return coeffs, const


def _term_var(factors: Any) -> str | None:
  """The variable a term is (`n`, not `n**2`, `n*m` or `mod(n, 2)`), or None."""
  if len(factors) != 1:
    return None
  (factor, exp), = factors
  return jc.factor_parts(factor)[0] if exp == 1 else None


@functools.lru_cache(maxsize=4096)
def is_monotone_dim(d: Dim) -> bool:
  """Whether `d` never decreases when any of its variables increases.

  Masking evaluates symbolic sizes twice: on the padded sizes (for array shapes)
  and on the logical sizes (for masks). The data of a value fits in its padded
  buffer only if padded(d) >= logical(d), which holds for every logical
  assignment below the padded one exactly when `d` is monotone. `n - 1`,
  `2*n + m`, `n - floordiv(n, 2)` and `max(n, m)` are; `n - m` and `mod(n, 2)`
  are not. A quick syntactic check comes first; then, per variable v, JAX's
  decision procedure is asked whether d(v + 1) - d(v) >= 0.
  """
  if not jc.is_symbolic_dim(d):
    return True
  if _syntactically_monotone(d):
    return True
  structural = _monotone_terms(_terms(d), MAX_PAIRINGS)
  if structural is not None:
    return structural
  if len(str(d)) > MAX_DECIDED_CHARS:
    # JAX's decision procedure takes time exponential in the nesting of
    # `floordiv` (recursion on sizes: `x[:n // 2]`, `x[n // 2:]`, halved
    # again): not decided, which is the safe answer (a larger buffer)
    return False
  names = jc.symbolic_vars(d)
  for var in sorted(names):
    env = {v: jc.dim_variable(v, d) for v in names}
    env[var] = env[var] + 1
    try:
      if not (jc.evaluate_symbolic(d, env) - d >= 0):
        return False
    except jc.InconclusiveDimensionOperation:
      return False
  return True


MAX_PAIRINGS = 64          # `e - floordiv(e, c)` pairs taken apart for one expression
MAX_DECIDED_CHARS = 160   # longer expressions are not given to JAX's decision procedure

# An expression as its terms: {key: (coefficient, [(factor, exp), ...])}.
_Terms: TypeAlias = dict[str, tuple[int, list[tuple[Any, int]]]]


def _terms(d: Dim) -> _Terms:
  if not jc.is_symbolic_dim(d):
    return {"": (int(d), [])} if int(d) else {}
  out: _Terms = {}
  for factors, k in jc.dim_terms(d):
    key = "*".join(f"{f}^{e}" for f, e in factors)
    out[key] = (out.get(key, (0, factors))[0] + k, factors)
  return out


def _monotone_terms(terms: _Terms, budget: int) -> bool | None:
  """Whether a sum of terms never decreases as a variable grows: True when
  every term does (positive coefficient, monotone factors); a term
  `-k * floordiv(e, c)` (c >= 1) is taken together with `k * e`, since
  `e - floordiv(e, c)` is monotone when `e` is (it grows by d - ceil(d / c)
  >= 0 when `e` grows by d >= 0), and the rest is decided the same way.
  None: undecided (another negative term, or the budget spent)."""
  negative = [(key, k, factors) for key, (k, factors) in terms.items() if factors and k < 0]
  if not negative:
    return all(_factor_is_monotone(f) for k, factors in terms.values() if factors
               for f, _ in factors)
  if budget <= 0:
    return None
  for key, k, factors in negative:
    if len(factors) != 1 or factors[0][1] != 1:
      continue
    var, op, operands = jc.factor_parts(factors[0][0])
    c = _constant(operands[1]) if op == "floordiv" else None
    if c is None or c < 1:
      continue
    e = operands[0]
    rest = dict(terms)
    del rest[key]   # d = rest' + (-k) * (floordiv(e, c) - e), rest' = d + k*floordiv(e, c) - k*e
    for ekey, (ek, efactors) in _terms(e).items():
      left = rest.get(ekey, (0, efactors))[0] - (-k) * ek
      if left:
        rest[ekey] = (left, efactors)
      else:
        rest.pop(ekey, None)
    if not is_monotone_dim(e):
      continue
    return _monotone_terms(rest, budget - 1)
  return None


def _constant(d: Dim) -> int | None:
  """The value of an expression without variables (JAX keeps the divisor of
  `floordiv(n, 2)` as an expression), else None."""
  if not jc.is_symbolic_dim(d):
    return int(d)
  return _evaluate_int(d, {}) if not jc.symbolic_vars(d) else None


def _syntactically_monotone(d: Dim) -> bool:
  for factors, k in jc.dim_terms(d):
    if not factors:
      continue
    if k < 0:
      return False
    for factor, _exp in factors:
      if not _factor_is_monotone(factor):
        return False
  return True


def _factor_is_monotone(f: Any) -> bool:
  var, op, operands = jc.factor_parts(f)
  if var is not None:
    return True
  if op == "floordiv":
    num, den = operands
    c = _constant(den)
    return c is not None and c > 0 and is_monotone_dim(num)
  if op in ("max", "min"):
    return all(is_monotone_dim(o) for o in operands)
  return False  # mod, and anything newer we do not know about


def dim_upper_bound(d: Dim, var_bounds: dict[str, int]) -> int | None:
  """An upper bound of `d` over every assignment with 1 <= v <= var_bounds[v].

  For sizes that are not monotone (`n - mod(-2, n)`, from `jnp.roll`), where
  evaluating at the largest values gives no bound. Interval arithmetic over
  the expression; None when an operation is unknown or could divide by <= 0.
  """
  interval = _dim_interval(d, var_bounds)
  return None if interval is None else interval[1]


def padded_dim(d: Dim, padded_env: dict[str, int]) -> int | None:
  """The buffer length that holds the data of a size `d` at every assignment
  up to `padded_env`: its value there where `d` never shrinks as a variable
  grows (`is_monotone_dim`), else its upper bound over those assignments (at
  least 0: `mod(-16, n)` is 0 at 16 and 4 at 5); None where none is known."""
  if not jc.is_symbolic_dim(d):
    return int(d)
  if is_monotone_dim(d):
    return int(evaluate_dim(d, padded_env))
  bound = dim_upper_bound(d, padded_env)
  return None if bound is None else max(int(bound), 0)


def dim_lower_bound(d: Dim, var_bounds: dict[str, int]) -> int | None:
  """A lower bound of `d` over every assignment with 1 <= v <= var_bounds[v]
  (interval arithmetic, so it may be lower than the true minimum); None when
  an operation is unknown. `n - 1` gets 0: a size that can be empty while
  every dimension is >= 1."""
  interval = _dim_interval(d, var_bounds)
  return None if interval is None else interval[0]


def _dim_interval(d: Dim, bounds: dict[str, int]) -> Interval | None:
  if not jc.is_symbolic_dim(d):
    return int(d), int(d)
  lo = hi = 0
  for factors, k in jc.dim_terms(d):
    t = (1, 1)
    for factor, exp in factors:
      f = _factor_interval(factor, bounds)
      if f is None:
        return None
      for _ in range(exp):
        t = _interval_mul(t, f)
    lo, hi = lo + min(k * t[0], k * t[1]), hi + max(k * t[0], k * t[1])
  return lo, hi


def _interval_mul(a: Interval, b: Interval) -> Interval:
  corners = [x * y for x in a for y in b]
  return min(corners), max(corners)


def _factor_interval(f: Any, bounds: dict[str, int]) -> Interval | None:
  var, operation, operands = jc.factor_parts(f)
  if var is not None:
    return (1, bounds[var]) if var in bounds else None
  found = [_dim_interval(o, bounds) for o in operands]
  ops = [o for o in found if o is not None]
  if len(ops) != len(found):
    return None
  if operation in ("max", "min"):
    pick = max if operation == "max" else min
    return pick(o[0] for o in ops), pick(o[1] for o in ops)
  if operation not in ("floordiv", "mod") or ops[1][1] < 1:
    return None
  # Only assignments where the divisor is >= 1 matter: at any other the size
  # is undefined and the unpadded program itself fails (JAX refuses a zero or
  # negative divisor in a shape), so there is nothing to match.
  (a_lo, a_hi), (b_lo, b_hi) = ops[0], (max(ops[1][0], 1), ops[1][1])
  if operation == "floordiv":  # monotone in each operand: extremes at corners
    corners = [x // y for x in (a_lo, a_hi) for y in (b_lo, b_hi)]
    return min(corners), max(corners)
  return 0, (b_hi - 1 if a_lo < 0 else min(b_hi - 1, a_hi))  # mod, divisor >= 1


def magnitude_bound(d: Dim, var_bounds: dict[str, int]) -> int:
  """A bound on the magnitude of `d` and of every intermediate value of
  computing it (partial products and sums of its terms, the operands of its
  operations), over every assignment with 0 <= v <= var_bounds[v].

  A size used as a value (`dim_as_value`) is computed in the dtype of sizes
  (int32 without x64); where this bound fits that dtype, no step can wrap
  around. Each factor's bound is taken as at least 1, so that a partial
  product never exceeds its term's bound.
  """
  if not jc.is_symbolic_dim(d):
    return abs(int(d))
  total = largest = 0
  for factors, k in jc.dim_terms(d):
    term = abs(k)
    for factor, exp in factors:
      f, inner = _factor_magnitude(factor, var_bounds)
      term *= max(f, 1) ** exp
      largest = max(largest, inner)
    total += term
  return max(total, largest)


def _factor_magnitude(f: Any, bounds: dict[str, int]) -> tuple[int, int]:
  """(a bound on the factor's magnitude, the largest bound of its operands)."""
  var, operation, operands = jc.factor_parts(f)
  if var is not None:
    return bounds[var], bounds[var]
  a, b = (magnitude_bound(o, bounds) for o in operands)
  # |a // b| <= |a| for an integer divisor; |a mod b| < |b|
  value = {"floordiv": a, "mod": b}.get(operation or "", max(a, b))
  return value, max(a, b)
