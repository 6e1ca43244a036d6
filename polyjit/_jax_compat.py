"""The one place that touches `jax._src` or depends on JAX's version.

polyjit reads jaxprs, symbolic dimension expressions and source locations, and
binds primitives directly. Public APIs (`jax.export`, `jax.extend.core`) are
used where they exist; everything private is wrapped here so that a JAX upgrade
touches one file. Nothing outside this module imports from `jax._src`.

Tested against JAX 0.10.2 (see pyproject.toml for the supported range).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import threading
from typing import Any, Callable, Iterable

import jax
import jax.extend.core as jex_core
import numpy as np
from jax import export as _export
from jax._src import core as _core
from jax._src import source_info_util as _siu
from jax._src.export import shape_poly as _shape_poly
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import partial_eval as _pe

# --- jaxpr data structures (public through jax.extend.core) -----------------

ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn
Literal = jex_core.Literal
Var = jex_core.Var
Primitive = jex_core.Primitive
Tracer = jax.core.Tracer
InconclusiveDimensionOperation = jex_core.InconclusiveDimensionOperation
float0 = jax.dtypes.float0

# --- symbolic dimensions (jax.export) ---------------------------------------

SymbolicScope = _export.SymbolicScope
symbolic_shape = _export.symbolic_shape
is_symbolic_dim = _export.is_symbolic_dim
DimExpr = _shape_poly._DimExpr


def dim_value_dtype():
  """The dtype of `dim_as_value` results: int32, or int64 under x64."""
  return _core.dim_value_dtype()


def dim_vars(d) -> set[str]:
  """The dimension variables an expression mentions (empty for an int)."""
  return d._get_vars() if is_symbolic_dim(d) else set()


def evaluate_dim(d, env: dict[str, Any]):
  """Evaluates a dimension expression on `env` (ints or traced int scalars).

  With ints in `env` the result is a Python int; with traced values it is a
  traced scalar of `dim_value_dtype()`.
  """
  if not is_symbolic_dim(d):
    return int(d)
  if all(isinstance(v, int) for v in env.values()):
    return _evaluate_int(d, env)  # Python ints: no int32 overflow, no tracing
  res = d._evaluate(env)
  if isinstance(res, (int, np.integer)):
    return int(res)
  return res


def _evaluate_int(d, env: dict[str, int]) -> int:
  if not is_symbolic_dim(d):
    return int(d)
  total = 0
  for term, k in d._sorted_terms:
    value = k
    for factor, exp in term._factors:
      value *= _factor_int(factor, env) ** exp
    total += value
  return total


def _factor_int(f, env) -> int:
  if f.var is not None:
    return env[f.var]
  a, b = (_evaluate_int(o, env) for o in f.operands)
  return {"floordiv": lambda: a // b, "mod": lambda: a % b,
          "max": lambda: max(a, b), "min": lambda: min(a, b)}[f.operation]()


def linear_form(d) -> tuple[dict[str, int], int] | None:
  """`d` as `{var: coeff}, const` when it is linear in its variables, else None.

  Used to solve padded sizes from argument shapes: `2*n + 1` -> ({'n': 2}, 1).
  """
  if not is_symbolic_dim(d):
    return {}, int(d)
  coeffs: dict[str, int] = {}
  const = 0
  for term, k in d._sorted_terms:
    if term.is_constant:
      const += k
      continue
    var = term.to_var()
    if var is None:
      return None
    coeffs[var] = coeffs.get(var, 0) + k
  return coeffs, const


@functools.lru_cache(maxsize=4096)
def is_monotone_dim(d) -> bool:
  """Whether `d` never decreases when any of its variables increases.

  Masking evaluates symbolic sizes twice: on the padded sizes (for array shapes)
  and on the logical sizes (for masks). The data of a value fits in its padded
  buffer only if padded(d) >= logical(d), which holds for every logical
  assignment below the padded one exactly when `d` is monotone. `n - 1`,
  `2*n + m`, `n - floordiv(n, 2)` and `max(n, m)` are; `n - m` and `mod(n, 2)`
  are not. A quick syntactic check comes first; then, per variable v, JAX's
  decision procedure is asked whether d(v + 1) - d(v) >= 0.
  """
  if not is_symbolic_dim(d):
    return True
  if _syntactically_monotone(d):
    return True
  for var in sorted(d._get_vars()):
    env = {v: _shape_poly._DimExpr._from_var(v, d.scope) for v in d._get_vars()}
    env[var] = env[var] + 1
    try:
      if not (d._evaluate(env) - d >= 0):
        return False
    except InconclusiveDimensionOperation:
      return False
  return True


def _syntactically_monotone(d) -> bool:
  for term, k in d._sorted_terms:
    if term.is_constant:
      continue
    if k < 0:
      return False
    for factor, _exp in term._factors:
      if not _factor_is_monotone(factor):
        return False
  return True


def _factor_is_monotone(f) -> bool:
  if f.var is not None:
    return True
  op = f.operation
  if op == "floordiv":
    num, den = f.operands
    return (is_monotone_dim(num) and not is_symbolic_dim(den) and int(den) > 0)
  if op in ("max", "min"):
    return all(is_monotone_dim(o) for o in f.operands)
  return False  # mod, and anything newer we do not know about


# --- size comparisons in user code -----------------------------------------------
#
# User code branches on sizes (`if x.shape[0] == 1:`, `n % 2 == 0`, `n > 3`).
# With symbolic sizes `jax.export` answers `a == b` with False whenever it
# cannot prove equality (it must: `__eq__` is used for hashing), and raises
# InconclusiveDimensionOperation for an undecidable `>=`. Either way a trace
# would silently hold for one side of the comparison only. While polyjit
# traces, every such comparison *asked from user code* (JAX's and polyjit's own
# internal checks are left alone) goes to an oracle that polyjit installs:
# it answers the comparison (for concrete sizes, as those sizes do; when
# exploring, each way in turn) and records the answer, so that the trace is
# known to be valid exactly where its recorded answers hold (`_mask.Variant`).

_decisions = threading.local()
_JAX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(_core.__file__)))
_SHAPE_POLY_FILE = os.path.abspath(_shape_poly.__file__)
_THIS_FILE = os.path.abspath(__file__)


class SizeDecision:
  """A comparison of sizes asked by user code: `expr == 0` or `expr >= 0`."""
  __slots__ = ("kind", "expr", "text", "where", "sides")

  def __init__(self, kind: str, expr, text: str, where: str, sides=None):
    self.kind = kind      # "eq" or "ge"
    self.expr = expr      # a dimension expression (of the trace's scope)
    self.text = text      # the comparison as written: "'n' == '1'"
    self.where = where    # the user's "file:line"
    self.sides = sides    # (lhs, rhs) as strings, for an equality

  def equality_constraint(self) -> str | None:
    """For an equality between sizes of two or more dimensions (`n == m`),
    the scope constraint that makes JAX treat them as one ('m == n'): its
    "equal" side must be traced with it, or `x + y` would not type-check."""
    if self.kind != "eq" or len(dim_vars(self.expr)) < 2 or self.sides is None:
      return None
    for lhs, rhs in (self.sides, self.sides[::-1]):
      text = f"{lhs} == {rhs}"
      try:
        _export.SymbolicScope([text])
      except Exception:
        continue
      return text
    return None

  @property
  def key(self) -> tuple[str, str]:
    """Identifies the comparison across traces (whose scopes differ)."""
    return self.kind, str(self.expr)

  def holds(self, sizes: dict[str, Any]):
    """Whether it holds at these sizes: a bool for ints, a traced bool else."""
    value = evaluate_dim(self.expr, sizes)
    return value == 0 if self.kind == "eq" else value >= 0

  def __repr__(self):
    return f"{self.text} at {self.where}"


def _user_frame() -> str | None:
  """'file:line' of the code that asked a comparison, or None when it was JAX
  or polyjit itself."""
  frame = sys._getframe(2)
  while frame is not None and os.path.abspath(frame.f_code.co_filename) in (
      _SHAPE_POLY_FILE, _THIS_FILE):
    frame = frame.f_back  # `!=` calls `==`, `>` calls `_geq_decision`
  if frame is None:
    return None
  path = os.path.abspath(frame.f_code.co_filename)
  if path.startswith(_JAX_DIR) or path.startswith(_POLYJIT_DIR):
    return None
  return f"{path}:{frame.f_lineno}"


def dim_bounds(d) -> tuple[float, float]:
  """Lower and upper bounds of a dimension expression (dims are >= 1)."""
  if not is_symbolic_dim(d):
    return int(d), int(d)
  return _shape_poly._bounds_decision(d, _shape_poly.BoundsPrecision.BEST)


def _install_decision_hooks() -> None:
  if getattr(DimExpr.__eq__, "_polyjit", False):
    return
  original_eq = DimExpr.__eq__
  original_geq = _shape_poly._geq_decision

  def __eq__(self, other):
    result = original_eq(self, other)
    oracle = getattr(_decisions, "oracle", None)
    if oracle is None or result is not False or not (
        is_symbolic_dim(other) or isinstance(other, (int, np.integer))):
      return result
    where = _user_frame()
    if where is None:
      return result
    try:
      diff = self - other
    except Exception:  # another scope: not a size comparison polyjit made
      return result
    lo, hi = dim_bounds(diff)
    if not is_symbolic_dim(diff) or lo > 0 or hi < 0:
      return result  # proven unequal
    return oracle(SizeDecision("eq", diff, f"'{self}' == '{other}'", where,
                               (str(self), str(other))))

  def _geq_decision(e1, e2, cmp_str):
    try:
      return original_geq(e1, e2, cmp_str)
    except InconclusiveDimensionOperation:
      oracle = getattr(_decisions, "oracle", None)
      where = _user_frame() if oracle is not None else None
      if where is None:
        raise
      return oracle(SizeDecision("ge", e1 - e2, cmp_str(), where))

  __eq__._polyjit = True
  DimExpr.__eq__ = __eq__  # (assigning __eq__ later leaves __hash__ as it was)
  _shape_poly._geq_decision = _geq_decision


@contextlib.contextmanager
def size_decisions(oracle: Callable[[SizeDecision], bool]):
  """Within the block, user code's undecidable size comparisons are answered
  by `oracle(decision) -> bool` (which records them)."""
  _install_decision_hooks()
  previous = getattr(_decisions, "oracle", None)
  _decisions.oracle = oracle
  try:
    yield
  finally:
    _decisions.oracle = previous


def scope_constraints(scope) -> list[tuple[str, str, Any]]:
  """The explicit constraints of a scope as (text, 'eq'|'geq', e1 - e2)."""
  out = []
  for c in scope._explicit_constraints:
    kind = "eq" if c.cmp == _shape_poly.Comparator.EQ else "geq"
    out.append((c.debug_str, kind, c.diff))
  return out


def dim_upper_bound(d, var_bounds: dict[str, int]) -> int | None:
  """An upper bound of `d` over every assignment with 1 <= v <= var_bounds[v].

  For sizes that are not monotone (`n - mod(-2, n)`, from `jnp.roll`), where
  evaluating at the largest values gives no bound. Interval arithmetic over
  the expression; None when an operation is unknown or could divide by <= 0.
  """
  interval = _dim_interval(d, var_bounds)
  return None if interval is None else interval[1]


def _dim_interval(d, bounds):
  if not is_symbolic_dim(d):
    return int(d), int(d)
  lo = hi = 0
  for term, k in d._sorted_terms:
    t = (1, 1)
    for factor, exp in term._factors:
      f = _factor_interval(factor, bounds)
      if f is None:
        return None
      for _ in range(exp):
        t = _interval_mul(t, f)
    lo, hi = lo + min(k * t[0], k * t[1]), hi + max(k * t[0], k * t[1])
  return lo, hi


def _interval_mul(a, b):
  corners = [x * y for x in a for y in b]
  return min(corners), max(corners)


def _factor_interval(f, bounds):
  if f.var is not None:
    return (1, bounds[f.var]) if f.var in bounds else None
  ops = [_dim_interval(o, bounds) for o in f.operands]
  if any(o is None for o in ops):
    return None
  if f.operation in ("max", "min"):
    pick = max if f.operation == "max" else min
    return pick(o[0] for o in ops), pick(o[1] for o in ops)
  if f.operation not in ("floordiv", "mod") or ops[1][1] < 1:
    return None
  # Only assignments where the divisor is >= 1 matter: at any other the size
  # is undefined and the unpadded program itself fails (JAX refuses a zero or
  # negative divisor in a shape), so there is nothing to match.
  (a_lo, a_hi), (b_lo, b_hi) = ops[0], (max(ops[1][0], 1), ops[1][1])
  if f.operation == "floordiv":  # monotone in each operand: extremes at corners
    corners = [x // y for x in (a_lo, a_hi) for y in (b_lo, b_hi)]
    return min(corners), max(corners)
  return 0, (b_hi - 1 if a_lo < 0 else min(b_hi - 1, a_hi))  # mod, divisor >= 1


# --- primitives --------------------------------------------------------------

dim_as_value_p = _shape_poly.dim_as_value_p


@functools.lru_cache(maxsize=None)
def _primitive_table() -> dict[str, list[Primitive]]:
  table: dict[str, list[Primitive]] = {}
  seen: set[int] = set()
  for modname, mod in list(sys.modules.items()):
    if not (modname.startswith("jax._src") or modname.startswith("jax.extend")):
      continue
    for value in list(vars(mod).values()):
      if isinstance(value, _core.Primitive) and id(value) not in seen:
        seen.add(id(value))
        table.setdefault(value.name, []).append(value)
  return table


def primitive(name: str) -> Primitive | None:
  """The JAX primitive called `name`, or None if this JAX version has none."""
  found = _primitive_table().get(name)
  return found[0] if found else None


def all_primitives() -> list[Primitive]:
  """Every primitive defined by the JAX modules imported so far."""
  return [p for ps in _primitive_table().values() for p in ps]


def bind_params(eqn: JaxprEqn) -> dict[str, Any]:
  """The params to re-bind an equation's primitive with, as `eval_jaxpr` does."""
  return eqn.primitive.get_bind_params(eqn.params)


def eqn_context(eqn: JaxprEqn):
  """Context that gives ops emitted for `eqn` its source location and ctx."""
  name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
  return _EqnContext(eqn, name_stack)


class _EqnContext:
  __slots__ = ("_eqn", "_name_stack", "_managers")

  def __init__(self, eqn, name_stack):
    self._eqn = eqn
    self._name_stack = name_stack
    self._managers = None

  def __enter__(self):
    self._managers = (
        _siu.user_context(self._eqn.source_info.traceback,
                          name_stack=self._name_stack),
        self._eqn.ctx.manager)
    for m in self._managers:
      m.__enter__()

  def __exit__(self, *exc):
    for m in reversed(self._managers):
      m.__exit__(*exc)
    return False


# polyjit's own frames are not the user's: leave them out of source lines.
_POLYJIT_DIR = os.path.dirname(os.path.abspath(__file__))
_siu.register_exclusion(_POLYJIT_DIR)


def source_line(eqn: JaxprEqn | None) -> str:
  """Where an equation came from: 'at model.py:12 (loss)', or 'in `sort`'.

  When JAX kept no user frame (a library function called directly, or frames
  cut at a jit boundary), names the function the equation came from instead.
  """
  if eqn is None:
    return "at an unknown location"
  try:
    line = _siu.summarize(eqn.source_info)
  except Exception:  # pragma: no cover - defensive: never fail an error path
    line = ""
  if line and line != "unknown":
    return f"at {line}"
  name = str(_siu.current_name_stack() + eqn.source_info.name_stack)
  return f"in `{name}`" if name else "at an unknown location"


def user_line_of(error: BaseException) -> str | None:
  """'file:line' of the innermost frame of `error`'s traceback that is not
  JAX's or polyjit's (the user's line that failed), or None."""
  tb, found = error.__traceback__, None
  while tb is not None:
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if not (path.startswith(_JAX_DIR) or path.startswith(_POLYJIT_DIR)):
      found = f"{path}:{tb.tb_lineno}"
    tb = tb.tb_next
  return found


def library_function_of(error: BaseException) -> str | None:
  """The JAX function the user called when `error` was raised inside JAX
  (`jax.numpy.convolve`), or None when it was raised in user code."""
  tb, called = error.__traceback__, None
  last_user = None
  frames = []
  while tb is not None:
    frames.append(tb.tb_frame)
    tb = tb.tb_next
  for i, frame in enumerate(frames):
    path = os.path.abspath(frame.f_code.co_filename)
    if not (path.startswith(_JAX_DIR) or path.startswith(_POLYJIT_DIR)):
      last_user = i
  if last_user is None or last_user == len(frames) - 1:
    return None
  for frame in frames[last_user + 1:]:
    module = frame.f_globals.get("__name__", "")
    if module.startswith("polyjit"):
      return None
    if module in _WRAPPER_MODULES or module.startswith("jax._src.interpreters"):
      continue
    for prefix, short in (("jax._src.numpy", "jnp"), ("jax._src.lax", "lax"),
                          ("jax._src.scipy", "jax.scipy"), ("jax._src.nn", "jax.nn")):
      if module.startswith(prefix):
        return f"{short}.{frame.f_code.co_name}"
    return f"{module}.{frame.f_code.co_name}"
  return "a JAX function"


# Frames of JAX's own call machinery (jit dispatch, traceback filtering).
_WRAPPER_MODULES = {"jax._src.traceback_util", "jax._src.pjit", "jax._src.api",
                    "jax._src.export.shape_poly", "jax._src.core",
                    "jax._src.linear_util", "jax._src.profiler", "jax._src.api_util"}


def current_user_line() -> str:
  """The innermost user frame of the current Python stack."""
  frame = _siu.user_frame(_siu.current().traceback)
  return _siu._summarize_frame(frame) if frame is not None else "unknown location"


# --- differentiation rules ---------------------------------------------------

def wrap_jvp_rule(name: str, rule: Callable) -> None:
  """Installs `rule(original, primals, tangents, **params)` as `name`'s JVP.

  The rule receives JAX's own JVP rule as `original` and must defer to it
  except where it adds support (see `_symbolic_ad.py`). Idempotent.
  """
  prim = primitive(name)
  if prim is None or prim not in _ad.primitive_jvps:
    return
  original = _ad.primitive_jvps[prim]
  if getattr(original, "_polyjit_wrapped", False):
    return
  wrapped = functools.partial(rule, original)
  wrapped._polyjit_wrapped = True
  _ad.primitive_jvps[prim] = wrapped


def wrap_transpose_rules(name: str, wrap: Callable) -> None:
  """Wraps the rule functions behind `name`'s transpose.

  JAX stores a linear or bilinear primitive's transpose as
  `functools.partial(driver, *rules)` (one rule for `deflinear2`, the lhs and
  rhs rules for `defbilinear`, in two tables). Each rule is replaced by
  `wrap(i, rule)`, which must defer to `rule` except where it adds support
  (see `_rules/windows.py`, `_rules/fft.py`). Idempotent.
  """
  prim = primitive(name)
  for table in (_ad.primitive_transposes, getattr(_ad, "fancy_transposes", {})):
    entry = table.get(prim)
    if not isinstance(entry, functools.partial) or getattr(entry, "_polyjit_wrapped", False):
      continue
    rules = [wrap(i, rule) for i, rule in enumerate(entry.args)]
    wrapped = functools.partial(entry.func, *rules, **entry.keywords)
    wrapped._polyjit_wrapped = True
    table[prim] = wrapped


def instantiate_zeros(t, like):
  """A tangent as an array: symbolic zeros become zeros shaped like `like`."""
  if isinstance(t, _ad.Zero):
    return jax.numpy.zeros(like.shape, _core.primal_dtype_to_tangent_dtype(like.dtype))
  return t


def is_zero_tangent(t) -> bool:
  """Whether a tangent is JAX's symbolic zero."""
  return isinstance(t, _ad.Zero)


def wrap_custom_jvp_rule(module: str, name: str, rule: Callable) -> None:
  """Installs `rule(original, primals, tangents)` as the JVP of the private
  `jax.custom_jvp` function `module.name` (e.g. jax._src.numpy.linalg._det).

  Like `wrap_jvp_rule`: the rule defers to `original` except where it adds
  support. Idempotent; does nothing if this JAX version has no such function.
  """
  import importlib
  fn = getattr(importlib.import_module(module), name, None)
  if not isinstance(fn, jax.custom_jvp) or getattr(fn.jvp, "_polyjit_wrapped", False):
    return
  wrapped = functools.partial(rule, fn.jvp)
  wrapped._polyjit_wrapped = True
  fn.jvp = wrapped


# --- recompilation explanations ------------------------------------------------

def explain_cache_misses():
  """Context manager: JAX logs why each tracing cache miss happened."""
  from jax._src import config as _config
  return _config.explain_cache_misses(True)


def cache_miss_loggers() -> list[str]:
  """The loggers JAX writes its cache-miss explanations to."""
  return ["jax._src.interpreters.partial_eval", "jax._src.pjit", "jax._src.dispatch"]


# --- jaxpr helpers -----------------------------------------------------------

def convert_constvars_jaxpr(jaxpr: Jaxpr) -> Jaxpr:
  """Turns a jaxpr's constvars into leading invars (for open-jaxpr params)."""
  return _pe.convert_constvars_jaxpr(jaxpr)


def subjaxprs_in_params(params: dict[str, Any]) -> Iterable[Jaxpr]:
  """Every jaxpr (open or closed) in an equation's params."""
  for j in jex_core.jaxprs_in_params(params):
    yield j.jaxpr if isinstance(j, ClosedJaxpr) else j


def jaxpr_as_fun(jaxpr: Jaxpr) -> Callable:
  """A Python function that evaluates a const-free open jaxpr with JAX."""
  return jex_core.jaxpr_as_fun(ClosedJaxpr(jaxpr, ()))


def is_dropvar(v) -> bool:
  return isinstance(v, _core.DropVar)


def typeof(x):
  """The abstract value (shape, dtype, weak type) of a concrete argument."""
  return jax.typeof(x)


def make_closed_jaxpr(fun: Callable, avals: list[Any]) -> ClosedJaxpr:
  """Traces `fun(*flat_args) -> list` to a ClosedJaxpr at the given avals."""
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
           for a in avals]
  return jax.make_jaxpr(fun)(*specs)


def shaped(shape, dtype, weak_type=False):
  """An abstract array value with the given (possibly symbolic) shape."""
  return _core.ShapedArray(tuple(shape), dtype, weak_type=weak_type)


def replay_unsafe_effects(jaxpr: Jaxpr) -> list:
  """The effects of `jaxpr` that must not run twice: those `jax.checkpoint`
  refuses to replay (an io_callback's), unlike debug prints."""
  from jax._src import effects as _effects
  return _effects.remat_allowed_effects.filter_not_in(jaxpr.effects)


# --- JAX's error texts -------------------------------------------------------------

_INCONCLUSIVE = re.compile(
    r"comparison '(?P<a>[^']+)' (?P<op>>=|<=|>|<) '(?P<b>[^']+)' is inconclusive")


def inconclusive_comparison(error: Exception) -> tuple[str, str, str] | None:
  """(a, op, b) of the comparison an InconclusiveDimensionOperation names."""
  match = _INCONCLUSIVE.search(str(error))
  return None if match is None else (match.group("a"), match.group("op"), match.group("b"))
