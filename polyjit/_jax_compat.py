"""The one place that touches `jax._src` or depends on JAX's version.

polyjit reads jaxprs, symbolic dimension expressions and source locations, and
binds primitives directly. Public APIs (`jax.export`, `jax.extend.core`) are
used where they exist; everything private is wrapped here so that a JAX upgrade
touches one file. Nothing outside this module imports from `jax._src`.

Tested against JAX 0.10.2 (see pyproject.toml for the supported range).
"""

from __future__ import annotations

import functools
import os
import sys
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
  res = d._evaluate(env)
  if isinstance(res, (int, np.integer)):
    return int(res)
  return res


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


def scope_constraints(scope) -> list[tuple[str, str, Any]]:
  """The explicit constraints of a scope as (text, 'eq'|'geq', e1 - e2)."""
  out = []
  for c in scope._explicit_constraints:
    kind = "eq" if c.cmp == _shape_poly.Comparator.EQ else "geq"
    out.append((c.debug_str, kind, c.diff))
  return out


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
_siu.register_exclusion(os.path.dirname(os.path.abspath(__file__)))


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


def instantiate_zeros(t, like):
  """A tangent as an array: symbolic zeros become zeros shaped like `like`."""
  if isinstance(t, _ad.Zero):
    return jax.numpy.zeros(like.shape, _core.primal_dtype_to_tangent_dtype(like.dtype))
  return t


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
