"""Size comparisons in user code: the oracle hooks on `DimExpr`."""
from __future__ import annotations

import contextlib
import dis
import numbers
import os
import threading
import types
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as _export
from jax._src.export import shape_poly as _shape_poly

from .core import InconclusiveDimensionOperation, Tracer
from .dims import DimExpr, dim_value_dtype, is_symbolic_dim, symbolic_vars
from .frames import current_source_line, current_user_line, is_user_path, stack_outward
from .set_sites import may_share_one_hash
from .size_class import install_size_class

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

class _Decisions(threading.local):
  # Defaults on the class: a thread that never entered `size_decisions` reads
  # them without the AttributeError that `getattr(local, name, None)` raises
  # and catches (1.3 us, on every hash, comparison and isinstance of a size).
  oracle: Any = None
  raised: list[BaseException] | None = None


_decisions = _Decisions()
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


def _generated_hash(code: types.CodeType) -> bool:
  # A dataclass's generated `__hash__` hashes its fields for whoever hashed
  # it (JAX's caches keyed by dataclasses such as batching's AxisData): the
  # question is its caller's.
  return code.co_name == "__hash__" and code.co_filename.startswith("<")


_absolute: dict[str, str] = {}


def _abspath(filename: str) -> str:
  """`os.path.abspath`, remembered for absolute file names (whose result does
  not depend on the working directory): every hash and comparison of a size
  while polyjit traces walks a few frames, so this is on the tracing path."""
  path = _absolute.get(filename)
  if path is None:
    path = os.path.abspath(filename)
    if os.path.isabs(filename):
      _absolute[filename] = path
  return path


# JAX functions whose own comparison of sizes decides their *result*, not a
# fast path or an error: `jnp.array_equal` returns False when
# `np.shape(a1) != np.shape(a2)`, which JAX answers True for `n` and `m` unless
# it can prove them equal, so equal arrays of sizes equal at run time would
# compare unequal. Their comparisons are asked on behalf of the user's line
# that called them (by code object: `pj.vmap(jnp.array_equal)` passes the
# function itself, which no module attribute swap would reach).
_DECIDING_CODE = frozenset({jnp.array_equal.__code__})


def _user_frame() -> str | None:
  """'file:line' of the code that asked a comparison, or None when it was JAX
  or polyjit itself, or a cache comparing its keys."""
  through_generated_eq = False
  frames = stack_outward(2)
  for frame in frames:  # `!=` calls `==`, `>` calls `_geq_decision`
    if _generated_eq(frame.f_code):
      through_generated_eq = True
    elif _generated_hash(frame.f_code):
      pass
    elif _abspath(frame.f_code.co_filename) not in (_SHAPE_POLY_FILE, _THIS_FILE):
      break
  else:
    return None
  if through_generated_eq and frame.f_code.co_code[frame.f_lasti] not in _COMPARISONS:
    return None
  if frame.f_code in _DECIDING_CODE:  # asked for the user's line that called it
    caller = next((f for f in frames if is_user_path(_abspath(f.f_code.co_filename))), None)
    return None if caller is None else (
        f"{_abspath(caller.f_code.co_filename)}:{caller.f_lineno}")
  path = _abspath(frame.f_code.co_filename)
  if not is_user_path(path):  # by path components: `jax_md/` is the user's
    return None
  return f"{path}:{frame.f_lineno}"


#: The longest comparison (in characters of its two sides) given to JAX's
#: decision procedure while polyjit traces: recursion that halves a size
#: doubles its expression per level, and the procedure's time grows faster
#: still (1.5 s for 16 elements, 35 s for 32, hours for 64).
MAX_COMPARED_CHARS = 400


def _too_large(e1: Any, e2: Any) -> bool:
  total = 0
  for e in (e1, e2):
    if is_symbolic_dim(e):
      total += len(str(e))
  return total > MAX_COMPARED_CHARS


# --- hashing a size: building a set of sizes, or looking a size up ---------------
#
# Python hashes a size for two different questions. Building a set of sizes
# (`set(leaves)`, `{a.shape[0], b.shape[0]}`, `{x.shape[0] for x in xs}`:
# Flax's `nn.scan` collects its lengths this way) asks how the sizes compare
# among themselves; looking a size up in a container built elsewhere
# (`n in {1, 2}`, `{1: a}.get(n)`, `d[n]`, `functools.cache`) asks its value.
# A set finds an entry only among entries of equal hash and asks `==` of those
# alone, so no single hash of `n` can make `n in {1, 2}` right for every n:
# a lookup keeps the value (recorded at concrete sizes, refused when traced).
# Building a set of sizes alone, never looked up afterwards (`set_sites`
# proves both from the source), gives every symbolic size one shared hash,
# `SIZE_HASH`, that does not depend on the sizes' values: equal expressions
# are then the same member, and two different ones (`n`, `m`) meet in `==`,
# which the oracle answers and records like any comparison. Every other set
# (`{n, 5}`, a set later asked `5 in s`) hashes by value. A later lookup of a
# size in a trace that built such a set is refused (a value-hashed lookup
# would miss members carrying SIZE_HASH).

SIZE_HASH = 0x5EED_512E   # an int that hashes to itself; it meets sizes in `==`


def _hashing_frame() -> types.FrameType | None:
  """The user's frame that hashed a size (None when JAX, polyjit or a cache
  comparing its keys did)."""
  for frame in stack_outward(2):
    if _generated_hash(frame.f_code):
      continue
    if _abspath(frame.f_code.co_filename) in (_SHAPE_POLY_FILE, _THIS_FILE):
      continue
    return frame if is_user_path(_abspath(frame.f_code.co_filename)) else None
  return None


def dim_bounds(d: Any) -> tuple[float, float]:
  """Lower and upper bounds of a dimension expression (dims are >= 1)."""
  if not is_symbolic_dim(d):
    return int(d), int(d)
  return _shape_poly._bounds_decision(d, _shape_poly.BoundsPrecision.BEST)


# What a size can be compared with. Python asks a question of a size in more
# ways than `==` and `>=`: `==`/`!=` with a float (`n == 1.0`), truth
# (`if n - 1:`), hashing (`n in {1, 2}`, `{1: a}.get(n)`, `functools.cache`),
# and `in range(...)` (which compares with `==` element by element). Each is
# answered by the oracle or refused; none falls back on JAX's default answer,
# which holds for one side only.
_NON_INTEGRAL = object()   # a number no integer size can equal (1.5, nan, inf, 1j)


def _size_operand(other: Any) -> Any:
  """`other` as a size operand: a dimension expression, an int, `_NON_INTEGRAL`,
  or None when it is not a number at all."""
  if is_symbolic_dim(other):
    return other
  if isinstance(other, (bool, int, np.integer)):
    return int(other)
  if isinstance(other, (numbers.Number, np.ndarray, np.generic)) and np.ndim(other) == 0:  # type: ignore[arg-type, unused-ignore]
    try:
      c = complex(other)  # type: ignore[arg-type]
    except (TypeError, ValueError):
      return None
    if c.imag != 0 or not float(c.real).is_integer():
      return _NON_INTEGRAL
    return int(c.real)
  return None


def _is_traced_value(other: Any) -> bool:
  """A JAX array (traced or not) that is not a plain integer: `n == t` is then
  an elementwise comparison, which JAX's array computes when asked."""
  return isinstance(other, jax.Array) and _size_operand(other) is None


def _install_decision_hooks() -> None:
  if getattr(DimExpr.__eq__, "_polyjit", False):
    return
  original_eq = DimExpr.__eq__
  original_hash: Callable[[Any], int] = DimExpr.__hash__
  original_geq = _shape_poly._geq_decision

  def __eq__(self: Any, other: Any) -> Any:
    result = original_eq(self, other)
    oracle: Any = getattr(_decisions, "oracle", None)
    if oracle is None or result is not False:
      return result
    operand = _size_operand(other)
    if operand is None:
      # `n == jnp_value`: JAX's array compares (a traced bool), as under jax.jit
      return NotImplemented if _is_traced_value(other) and _user_frame() else result
    if operand is _NON_INTEGRAL:
      return False  # proven: an integer size never equals 1.5
    where = _user_frame()
    if where is None:
      return result
    try:
      diff = self - operand
    except Exception:  # another scope: not a size comparison polyjit made
      return result
    lo, hi = dim_bounds(diff)
    if not is_symbolic_dim(diff) or lo > 0 or hi < 0:
      return result  # proven unequal
    return _ask(oracle, SizeDecision("eq", diff, f"'{self}' == '{operand}'", where,
                                     (str(self), str(operand))))

  def __ne__(self: Any, other: Any) -> Any:
    equal = self.__eq__(other)
    return equal if equal is NotImplemented else not equal

  def __bool__(self: Any) -> bool:
    # Python's default (every object is true) holds for one side of `n - 1`.
    oracle: Any = getattr(_decisions, "oracle", None)
    where = _user_frame() if oracle is not None else None
    lo, hi = dim_bounds(self)
    if where is None or lo > 0 or hi < 0:
      return True
    return not _ask(oracle, SizeDecision("eq", self, f"bool('{self}')", where))

  def __hash__(self: Any) -> int:
    # A hash decides membership (`n in {1, 2}`) before any `==` is asked.
    # From user code: building a set of sizes gets SIZE_HASH (the sizes then
    # meet in `==`); any other hash is the size's value, taken at concrete
    # sizes (and recorded as `n == value`), refused when sizes are traced.
    oracle: Any = getattr(_decisions, "oracle", None)
    frame = _hashing_frame() if oracle is not None else None
    if frame is None:
      return original_hash(self)
    where = f"{_abspath(frame.f_code.co_filename)}:{frame.f_lineno}"
    if may_share_one_hash(frame):
      return SIZE_HASH
    value = int(_ask(oracle.value_of, self, where))
    return hash(value)

  def refusing(how: str, original: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    # `int(n)`, `operator.index(n)` (range(n), indexing), `float(n)`: JAX
    # refuses them too, but from user code polyjit says where and what to do.
    def convert(self: Any) -> Any:
      oracle: Any = getattr(_decisions, "oracle", None)
      where = _user_frame() if oracle is not None else None
      if where is not None:
        constant = _shape_poly._DimExpr._to_constant(self)
        if constant is not None:  # (an expression that folded to a number)
          return float(constant) if how == "float(n)" else int(constant)
        raise signal_raised(oracle.refuse_value(self, where, how))
      if original is None:
        raise TypeError(f"'{type(self).__name__}' object cannot be interpreted as {how}")
      return original(self)
    return convert

  conversions = (("__int__", refusing("int(n)", DimExpr.__int__)),
                 ("__index__", refusing("an integer: range(n), operator.index(n)", None)),
                 ("__float__", refusing("float(n)", None)))

  def _geq_decision(e1: Any, e2: Any, cmp_str: Callable[[], str]) -> Any:
    oracle: Any = getattr(_decisions, "oracle", None)
    if oracle is not None and _too_large(e1, e2):
      # JAX's decision procedure takes time exponential in the nesting of
      # these expressions (recursion on sizes, `x[:n // 2]` halved again):
      # polyjit refuses before asking it
      at = _user_frame() or current_user_line()
      raise signal_raised(oracle.too_large(cmp_str(), at))
    try:
      return original_geq(e1, e2, cmp_str)
    except InconclusiveDimensionOperation as error:
      # (where JAX asked it, for a refusal of a question a derivative rule
      # asks: `question_line`)
      error.__dict__["_polyjit_line"] = current_source_line()
      if oracle is None:
        raise
      where = _user_frame()
      if where is None:
        # JAX's own shape rule: answered where it assumes a data-dependent
        # size non-empty (checked when the program runs), else refused. The
        # refusal is recorded too: polyjit settles it as a guard, and user
        # code that catches it would go on where jax.jit raises nothing.
        answer = _ask(oracle.assume, e1 - e2, cmp_str())
        if answer is None:
          signal_raised(error)
          raise
        return answer
      return _ask(oracle, SizeDecision("ge", e1 - e2, cmp_str(), where))

  def __abs__(self: Any) -> Any:
    # `abs(x.shape[0] - y.shape[0])`: JAX's expressions have no abs, and
    # Python's TypeError blamed something else. It is a size comparison
    # (`n - m >= 0`), asked for the user's line like any other.
    return self if self >= 0 else -self

  setattr(__eq__, "_polyjit", True)  # (setattr: mypy forbids new attributes on functions)
  # (setattr: methods replaced on purpose; __hash__ is set with __eq__, which
  # would otherwise leave it as it was)
  for name, method in (("__eq__", __eq__), ("__ne__", __ne__), ("__bool__", __bool__),
                       ("__hash__", __hash__), ("__abs__", __abs__), *conversions,
                       *_float_arithmetic()):
    setattr(DimExpr, name, method)
  _shape_poly._geq_decision = _geq_decision
  install_size_class(_decisions)


# --- a size in float arithmetic --------------------------------------------------
#
# Under jax.jit `len(x) * 0.3` is a Python float, computed in float64 and
# rounded once to float32 where it meets an array; polyjit computes it in the
# program, float32(n) * float32(0.3). Where the constant is a float32 (and n
# below 2**24) both are the correctly rounded float32 of the exact result
# (float64 has more than 2 * 24 + 2 bits, so its rounding first never changes
# the float32 one), so they agree; where it is not (0.1, 0.3), they differ in
# the last place and an integer-valued function amplifies it:
# `jnp.ceil(len(x) * 0.3)` is 15 under jax.jit at n = 50 and 16 in float32.
# So from user code, while polyjit traces, such arithmetic is refused at the
# user's line (pj.jit then compiles that size exactly), saying how to write it
# so that jax.jit computes it the same way. Under x64 both compute in float64.

_FLOAT_OPS = ("mul", "add", "sub", "truediv", "floordiv", "mod")


def _differs_from_python(op: str, other: Any, reflected: bool) -> bool:
  """Whether `size <op> other` (`other <op> size` if reflected) in float32
  can differ from Python's value rounded to float32."""
  if dim_value_dtype() == np.int64:
    return False
  if op == "truediv" and not reflected and not isinstance(other, Tracer):
    # XLA divides by a constant as a product with its rounded reciprocal
    # (`len(x) / 3` is 14.333334 at 43; Python's, and NumPy's or an eager JAX
    # division by np.float32(3), 14.333333): a power of two only
    try:
      values = np.asarray(other, dtype=np.float64)
    except (TypeError, ValueError):
      return False
    return not bool(np.all(np.isfinite(values) & (np.abs(np.frexp(values)[0]) == 0.5)))
  if isinstance(other, bool) or not isinstance(other, (int, float)):
    return False   # an array, a NumPy float32, a size: computed alike
  if isinstance(other, int) and op != "truediv":
    return False   # integer arithmetic: a size
  if op in ("floordiv", "mod"):
    return True    # a float floor division: JAX's and Python's roundings differ
  return float(np.float32(other)) != other


def _float_arithmetic() -> list[tuple[str, Callable[..., Any]]]:
  methods = []
  for op in _FLOAT_OPS:
    for name in (f"__{op}__", f"__r{op}__"):
      methods.append((name, _refusing_inexact(name, op, getattr(DimExpr, name))))
  return methods


def _refusing_inexact(name: str, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
  symbol = {"mul": "*", "add": "+", "sub": "-", "truediv": "/", "floordiv": "//", "mod": "%"}[op]

  def method(self: Any, other: Any) -> Any:
    oracle: Any = getattr(_decisions, "oracle", None)
    if oracle is not None and _differs_from_python(op, other, name != f"__{op}__"):
      where = _user_frame()
      if where is not None:
        why = ("float floor divisions round differently" if op in ("floordiv", "mod")
               else "XLA divides by a constant through its reciprocal" if op == "truediv"
               else f"{other!r} is not a float32")
        todo = ("multiply by a float32 reciprocal, `len(x) * jnp.float32(1 / c)`, which "
                "jax.jit computes the same way" if op == "truediv" else
                f"write the constant as a float32, jnp.float32({other!r}), which jax.jit "
                "computes in float32 as well")
        text = (f"'{self}' {symbol} {other!r}" if name == f"__{op}__"
                else f"{other!r} {symbol} '{self}'")
        raise signal_raised(oracle.refuse_value(self, where, (
            f"{text}: jax.jit computes it on the host, rounded once to float32, "
            f"and polyjit in the program from the size, which can differ in the last place "
            f"({why}); {todo}")))
    return original(self, other)
  method.__name__ = name
  return method


# --- signals raised into user code ------------------------------------------------
#
# An oracle answers by raising as well as by returning: polyjit leaves a shared
# scope (`LeftSharedScope`), settles a comparison as a constraint, or refuses
# (`int(n)`). Each such exception travels up through the user's frames before
# polyjit's handler gets it, and user code may catch it (`except:`, a `finally`
# that returns, a context manager, a generator) and go on along a path that
# jax.jit would not take. So every exception raised into user code is recorded
# in the `size_decisions` block it was raised in; the block's owner checks on
# exit that the first one arrived (`_masking/signals.py`).

def question_line(error: BaseException) -> str | None:
  """The user's line of the equation whose JAX rule asked the undecidable
  comparison `error` reports (recorded when it was asked), or None."""
  line: str | None = error.__dict__.get("_polyjit_line")
  return line


def signal_raised(exc: BaseException) -> BaseException:
  """Records `exc`, about to be raised into user code, in the current
  `size_decisions` block; returns it."""
  raised: list[BaseException] | None = getattr(_decisions, "raised", None)
  if raised is not None:
    raised.append(exc)
  return exc


def _ask(call: Callable[..., Any], *args: Any) -> Any:
  """`call(*args)`, an oracle's answer; an exception it raises is recorded."""
  try:
    return call(*args)
  except BaseException as e:
    signal_raised(e)
    raise


@contextlib.contextmanager
def size_decisions(oracle: Callable[[SizeDecision], bool]) -> Iterator[list[BaseException]]:
  """Within the block, user code's undecidable size comparisons are answered
  by `oracle(decision) -> bool` (which records them). The hooks that ask it
  are installed by `install_patches()` when polyjit is imported. Yields the
  list of exceptions raised into user code within the block (the oracle's,
  and those passed to `signal_raised`), in order."""
  previous = getattr(_decisions, "oracle", None), getattr(_decisions, "raised", None)
  raised: list[BaseException] = []
  _decisions.oracle, _decisions.raised = oracle, raised
  try:
    yield raised
  finally:
    _decisions.oracle, _decisions.raised = previous


def scope_constraints(scope: Any) -> list[tuple[str, str, Any]]:
  """The explicit constraints of a scope as (text, 'eq'|'ge', e1 - e2)."""
  out = []
  for c in scope._explicit_constraints:
    kind = "eq" if c.cmp == _shape_poly.Comparator.EQ else "ge"
    out.append((c.debug_str, kind, c.diff))
  return out
