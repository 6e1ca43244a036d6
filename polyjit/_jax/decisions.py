"""Size comparisons in user code: the oracle hooks on `DimExpr`."""
from __future__ import annotations

import contextlib
import dis
import os
import sys
import threading
import types
from typing import Any, Callable, Iterator

import numpy as np
from jax import export as _export
from jax._src import core as _core
from jax._src.export import shape_poly as _shape_poly

from .core import InconclusiveDimensionOperation
from .dims import DimExpr, is_symbolic_dim, symbolic_vars
from .frames import is_user_path

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

  def __init__(self, kind: str, expr: Any, text: str, where: str,
               sides: tuple[str, str] | None = None) -> None:
    self.kind = kind      # "eq" or "ge"
    self.expr = expr      # a dimension expression (of the trace's scope)
    self.text = text      # the comparison as written: "'n' == '1'"
    self.where = where    # the user's "file:line"
    self.sides = sides    # (lhs, rhs) as strings, for an equality

  def equality_constraint(self) -> str | None:
    """For an equality between sizes of two or more dimensions (`n == m`),
    the scope constraint that makes JAX treat them as one ('m == n'): its
    "equal" side must be traced with it, or `x + y` would not type-check."""
    if (self.kind != "eq" or not is_symbolic_dim(self.expr)
        or len(symbolic_vars(self.expr)) < 2 or self.sides is None):
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

  def __repr__(self) -> str:
    return f"{self.text} at {self.where}"


# A generated `__eq__` (a dataclass's) compares its fields for whoever called
# it. Called from C, from a frame that is not executing a comparison, it is a
# hash table comparing keys whose short hashes collide: JAX's C++ caches keyed
# by dataclasses that hold shapes. Answering `x_0 == 17` there as a size
# decision would hit the cached trace of another shape.
_COMPARISONS = {dis.opmap[name] for name in ("COMPARE_OP", "CONTAINS_OP") if name in dis.opmap}


def _generated_eq(code: types.CodeType) -> bool:
  return code.co_name == "__eq__" and code.co_filename.startswith("<")


def _user_frame() -> str | None:
  """'file:line' of the code that asked a comparison, or None when it was JAX
  or polyjit itself, or a cache comparing its keys."""
  frame: types.FrameType | None = sys._getframe(2)
  through_generated_eq = False
  while frame is not None:  # `!=` calls `==`, `>` calls `_geq_decision`
    if _generated_eq(frame.f_code):
      through_generated_eq = True
    elif os.path.abspath(frame.f_code.co_filename) not in (_SHAPE_POLY_FILE, _THIS_FILE):
      break
    frame = frame.f_back
  if frame is None:
    return None
  if through_generated_eq and frame.f_code.co_code[frame.f_lasti] not in _COMPARISONS:
    return None
  path = os.path.abspath(frame.f_code.co_filename)
  if not is_user_path(path):  # by path components: `jax_md/` is the user's
    return None
  return f"{path}:{frame.f_lineno}"


def dim_bounds(d: Any) -> tuple[float, float]:
  """Lower and upper bounds of a dimension expression (dims are >= 1)."""
  if not is_symbolic_dim(d):
    return int(d), int(d)
  return _shape_poly._bounds_decision(d, _shape_poly.BoundsPrecision.BEST)


def _install_decision_hooks() -> None:
  if getattr(DimExpr.__eq__, "_polyjit", False):
    return
  original_eq = DimExpr.__eq__
  original_geq = _shape_poly._geq_decision

  def __eq__(self: Any, other: Any) -> Any:
    result = original_eq(self, other)
    oracle: Any = getattr(_decisions, "oracle", None)
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

  def _geq_decision(e1: Any, e2: Any, cmp_str: Callable[[], str]) -> Any:
    try:
      return original_geq(e1, e2, cmp_str)
    except InconclusiveDimensionOperation:
      oracle: Any = getattr(_decisions, "oracle", None)
      where = _user_frame() if oracle is not None else None
      if where is None:
        raise
      return oracle(SizeDecision("ge", e1 - e2, cmp_str(), where))

  setattr(__eq__, "_polyjit", True)  # (setattr: mypy forbids new attributes on functions)
  # (assigning __eq__ later leaves __hash__ as it was; setattr: a method replaced on purpose)
  setattr(DimExpr, "__eq__", __eq__)
  _shape_poly._geq_decision = _geq_decision


@contextlib.contextmanager
def size_decisions(oracle: Callable[[SizeDecision], bool]) -> Iterator[None]:
  """Within the block, user code's undecidable size comparisons are answered
  by `oracle(decision) -> bool` (which records them). The hooks that ask it
  are installed by `install_patches()` when polyjit is imported."""
  previous = getattr(_decisions, "oracle", None)
  _decisions.oracle = oracle
  try:
    yield
  finally:
    _decisions.oracle = previous


def scope_constraints(scope: Any) -> list[tuple[str, str, Any]]:
  """The explicit constraints of a scope as (text, 'eq'|'geq', e1 - e2)."""
  out = []
  for c in scope._explicit_constraints:
    kind = "eq" if c.cmp == _shape_poly.Comparator.EQ else "geq"
    out.append((c.debug_str, kind, c.diff))
  return out
