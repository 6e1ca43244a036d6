"""The one place that touches `jax._src` or depends on JAX's version.

polyjit reads jaxprs, symbolic dimension expressions and source locations, and
binds primitives directly. Public APIs (`jax.export`, `jax.extend.core`) are
used where they exist; everything private is wrapped here so that a JAX upgrade
touches one file. Nothing outside this module imports from `jax._src`, reads a
private attribute of JAX's objects, or parses a text of JAX's (error messages,
cache-miss explanations, monitoring event and program names). polyjit's own
algebra on dimension expressions is in `_dims.py`, on the accessors below.
Every patch to JAX's tables and classes is installed by `install_patches()`.
This module imports nothing of polyjit's.

Tested against JAX 0.10.2, and 0.9.2 in part (see the version section below and
pyproject.toml for the supported range).
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import importlib
import os
import re
import sys
import threading
import types
import typing
from typing import Any, Callable, Iterable, Iterator

import jax
import jax.extend.core as jex_core
import numpy as np
from jax import export as _export
from jax._src import config as _config
from jax._src.array import ArrayImpl as _ArrayImpl
from jax._src.interpreters import pxla as _pxla
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import source_info_util as _siu
from jax._src.export import shape_poly as _shape_poly
from jax._src.numpy import util as _np_util
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import partial_eval as _pe

# --- JAX versions: every difference between the supported lines is here ------
# Supported: JAX 0.10.x (the whole test suite, on 0.10.2) and 0.9.2 (a fast subset,
# tests/test_old_jax.py). What 0.9 lacks, detected by feature where possible:
# - InconclusiveDimensionOperation and jaxprs_in_params in jax.extend.core (0.10 made
#   them public; 0.9 has them in jax._src.core);
# - the primitives `mulhi`, `stack` and `unstack`: their rules are skipped there
#   (`_core.register`), so they are simply unsupported on 0.9.
JAX_VERSION = tuple(int(re.sub(r"\D.*", "", p) or 0) for p in jax.__version__.split(".")[:3])
PRIMITIVES_NEWER_THAN_THIS_JAX = (frozenset({"mulhi", "stack", "unstack"})
                                  if JAX_VERSION < (0, 10) else frozenset())
_InconclusiveDimensionOperation = getattr(jex_core, "InconclusiveDimensionOperation",
                                          None) or _core.InconclusiveDimensionOperation
_jaxprs_in_params = getattr(jex_core, "jaxprs_in_params", None) or _core.jaxprs_in_params

# --- jaxpr data structures (public through jax.extend.core) -----------------

ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn
Literal = jex_core.Literal
Primitive = jex_core.Primitive
Tracer = jax.core.Tracer
InconclusiveDimensionOperation = _InconclusiveDimensionOperation

# --- the call path ------------------------------------------------------------

# The concrete type of a `jax.Array` on the device: `pj.jit`'s hot path keys a
# call by `type(x) is ARRAY_TYPE` (an exact type test is much cheaper than
# `isinstance(x, jax.Array)`, which goes through an ABC).
ARRAY_TYPE = _ArrayImpl


@functools.lru_cache(maxsize=None)
def default_sharding() -> jax.sharding.SingleDeviceSharding:
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def host_to_device(host: np.ndarray[Any, Any], sharding: jax.sharding.Sharding) -> jax.Array:
  """`host` copied to the device of a single-device `sharding`, without
  `jax.device_put`'s per-call overhead (about 30 us against 5 us); other
  shardings go through `jax.device_put` (to the default device)."""
  if isinstance(sharding, jax.sharding.SingleDeviceSharding):
    aval = _core.ShapedArray(host.shape, host.dtype)
    out: jax.Array = _pxla.batched_device_put(aval, sharding, [host],
                                              list(sharding.device_set), committed=False)
    return out
  placed: jax.Array = jax.device_put(host)
  return placed

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
# (`_dims.py`): a sum of terms, each `coeff * f1**e1 * f2**e2 ...`, each factor
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
  if path.startswith(_JAX_DIR) or path.startswith(_POLYJIT_DIR):
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


# --- primitives --------------------------------------------------------------

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


def required_primitive(name: str) -> Primitive:
  """The JAX primitive called `name`; an ImportError names it if this JAX has none."""
  found = primitive(name)
  if found is None:
    raise ImportError(f"polyjit needs JAX's primitive {name!r}, which this JAX "
                      f"version ({JAX_VERSION}) does not define.")
  return found


def all_primitives() -> list[Primitive]:
  """Every primitive defined by the JAX modules imported so far."""
  return [p for ps in _primitive_table().values() for p in ps]


def bind_params(eqn: JaxprEqn) -> dict[str, Any]:
  """The params to re-bind an equation's primitive with, as `eval_jaxpr` does."""
  # JAX leaves Primitive.get_bind_params unannotated (a stub gap).
  params: dict[str, Any] = eqn.primitive.get_bind_params(  # type: ignore[no-untyped-call, unused-ignore]
      eqn.params)
  return params


def eqn_context(eqn: JaxprEqn) -> _EqnContext:
  """Context that gives ops emitted for `eqn` its source location and ctx."""
  name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
  return _EqnContext(eqn, name_stack)


class _EqnContext:
  __slots__ = ("_eqn", "_name_stack", "_managers")

  def __init__(self, eqn: JaxprEqn, name_stack: Any) -> None:
    self._eqn = eqn
    self._name_stack = name_stack
    self._managers: Any = None

  def __enter__(self) -> None:
    self._managers = (
        _siu.user_context(self._eqn.source_info.traceback,
                          name_stack=self._name_stack),
        self._eqn.ctx.manager)
    for m in self._managers:
      m.__enter__()

  def __exit__(self, *exc: Any) -> typing.Literal[False]:
    for m in reversed(self._managers):
      m.__exit__(*exc)
    return False


# polyjit's own frames are not the user's: leave them out of source lines.
# (Registered with JAX by `install_patches()`.)
_POLYJIT_DIR = os.path.dirname(os.path.abspath(__file__))


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
  return None  # only JAX's call machinery: the user's own line failed


# Frames of JAX's own call machinery (jit dispatch, traceback filtering).
_WRAPPER_MODULES = {"jax._src.traceback_util", "jax._src.pjit", "jax._src.api",
                    "jax._src.export.shape_poly", "jax._src.core",
                    "jax._src.linear_util", "jax._src.profiler", "jax._src.api_util"}


def current_user_line() -> str:
  """The innermost user frame of the current Python stack."""
  frame = _siu.user_frame(_siu.current().traceback)
  return _siu._summarize_frame(frame) if frame is not None else "unknown location"


# --- differentiation rules ---------------------------------------------------

def wrap_jvp_rule(name: str, rule: Callable[..., Any]) -> None:
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
  setattr(wrapped, "_polyjit_wrapped", True)
  _ad.primitive_jvps[prim] = wrapped


def wrap_transpose_rules(name: str, wrap: Callable[[int, Any], Any]) -> None:
  """Wraps the rule functions behind `name`'s transpose.

  JAX stores a linear or bilinear primitive's transpose as
  `functools.partial(driver, *rules)` (one rule for `deflinear2`, the lhs and
  rhs rules for `defbilinear`, in two tables). Each rule is replaced by
  `wrap(i, rule)`, which must defer to `rule` except where it adds support
  (see `_rules/windows.py`, `_rules/fft.py`). Idempotent.
  """
  prim = primitive(name)
  if prim is None:
    return
  for table in (_ad.primitive_transposes, getattr(_ad, "fancy_transposes", {})):
    entry = table.get(prim)
    if not isinstance(entry, functools.partial) or getattr(entry, "_polyjit_wrapped", False):
      continue
    rules = [wrap(i, rule) for i, rule in enumerate(entry.args)]
    wrapped = functools.partial(entry.func, *rules, **entry.keywords)
    setattr(wrapped, "_polyjit_wrapped", True)
    table[prim] = wrapped


def instantiate_zeros(t: Any, like: Any) -> Any:
  """A tangent as an array: symbolic zeros become zeros shaped like `like`."""
  # `ad.Zero` is re-exported by JAX implicitly, and primal_dtype_to_tangent_dtype
  # is unannotated (stub gaps).
  if isinstance(t, _ad.Zero):  # type: ignore[attr-defined, unused-ignore]
    return jax.numpy.zeros(
        like.shape,
        _core.primal_dtype_to_tangent_dtype(like.dtype))  # type: ignore[no-untyped-call, unused-ignore]
  return t


def is_zero_tangent(t: Any) -> bool:
  """Whether a tangent is JAX's symbolic zero."""
  # `ad.Zero` is re-exported by JAX implicitly (a stub gap).
  return isinstance(t, _ad.Zero)  # type: ignore[attr-defined, unused-ignore]


def wrap_custom_jvp_rule(module: str, name: str, rule: Callable[..., Any]) -> None:
  """Installs `rule(original, primals, tangents)` as the JVP of the private
  `jax.custom_jvp` function `module.name` (e.g. jax._src.numpy.linalg._det).

  Like `wrap_jvp_rule`: the rule defers to `original` except where it adds
  support. Idempotent; does nothing if this JAX version has no such function.
  """
  fn = getattr(importlib.import_module(module), name, None)
  if not isinstance(fn, jax.custom_jvp) or getattr(fn.jvp, "_polyjit_wrapped", False):
    return
  wrapped = functools.partial(rule, fn.jvp)
  setattr(wrapped, "_polyjit_wrapped", True)
  fn.jvp = wrapped


# --- installing the patches ---------------------------------------------------

_patches_lock = threading.Lock()
_patches_installed = False


def install_patches(*rule_installers: Callable[[], None]) -> None:
  """Installs every change polyjit makes to JAX's tables and classes, once
  (later calls do nothing). Called when polyjit is imported, from `_mask.py`.

  * polyjit's frames are left out of JAX's source lines
    (`source_info_util.register_exclusion`);
  * the size-decision hooks: `DimExpr.__eq__` and `shape_poly._geq_decision`
    ask the oracle of `size_decisions()` about user code's comparisons (and
    behave as JAX's own outside such a block);
  * `rule_installers`, polyjit's differentiation rules (`_symbolic_ad.install`
    and the transposes in `_rules/windows.py`, `_rules/fft.py`), each calling
    `wrap_jvp_rule`, `wrap_transpose_rules` or `wrap_custom_jvp_rule`; they are
    passed in so that this module imports nothing of polyjit's.

  Not installed here, by design: the spelling replacements of
  `trace_spellings()` are put in place for each symbolic trace and removed
  after it (see below), since they replace public JAX functions.
  """
  global _patches_installed
  with _patches_lock:
    if _patches_installed:
      return
    _siu.register_exclusion(_POLYJIT_DIR)
    _install_decision_hooks()
    for install in rule_installers:
      install()
    _patches_installed = True


# --- recompilation explanations ------------------------------------------------

def explain_cache_misses() -> Any:
  """Context manager: JAX logs why each tracing cache miss happened."""
  return _config.explain_cache_misses(True)


def cache_miss_loggers() -> list[str]:
  """The loggers JAX writes its cache-miss explanations to."""
  return ["jax._src.interpreters.partial_eval", "jax._src.pjit", "jax._src.dispatch"]


# An explanation names the function that missed ("never seen function: f id=..
# defined at file:line", or "for f defined at file:line" against the closest
# previous call) and each argument whose type changed
# ("* at x, now f32[7,3] and before f32[5,3]").
_MISS_HEAD = "TRACING CACHE MISS"
_NEVER_SEEN = re.compile(r"never seen function:\s*\n\s*(?P<name>\S+) id=\S+ defined at (?P<where>\S+)")
_SEEN = re.compile(r"\n\s*for (?P<name>\S+) defined at (?P<where>\S+)")
_CHANGE = re.compile(r"\* at (?P<path>.+?), now (?P<now>\S+) and before (?P<before>\S+)")
_AVAL = re.compile(r"^(?P<dtype>[a-z]+[0-9]*)\[(?P<dims>[0-9,]*)\]")


def is_cache_miss_explanation(message: str) -> bool:
  """Whether a log message is one of JAX's cache-miss explanations."""
  return message.startswith(_MISS_HEAD)


@dataclasses.dataclass(frozen=True)
class CacheMiss:
  """What a cache-miss explanation says."""
  function: str            # the function's name
  defined_at: str          # its "file:line"
  never_seen: bool         # the function object is new
  # (argument path, its dims now, its dims before); dims are None when the
  # type is not an array of a known shape
  changes: tuple[tuple[str, list[int] | None, list[int] | None], ...]


def parse_cache_miss(message: str) -> CacheMiss | None:
  """The contents of a cache-miss explanation, or None when the function it
  names cannot be found in it."""
  head = _NEVER_SEEN.search(message) or _SEEN.search(message)
  if head is None:
    return None
  changes = tuple((c.group("path"), _aval_dims(c.group("now")), _aval_dims(c.group("before")))
                  for c in _CHANGE.finditer(message))
  return CacheMiss(head.group("name"), head.group("where"), head.re is _NEVER_SEEN, changes)


def _aval_dims(aval: str) -> list[int] | None:
  """[7, 3] for JAX's text of an array type 'f32[7,3]', else None."""
  match = _AVAL.match(aval)
  if match is None:
    return None
  return [int(d) for d in match.group("dims").split(",") if d]


# --- compile events (`jax.monitoring`) ---------------------------------------------
#
# JAX reports each XLA backend compile as a duration event, tagged with the
# function name; a load from the persistent compilation cache is wrapped by the
# same event, announced just before (in the same thread) by a cache-hit event.

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def compile_event_function(event_kwargs: dict[str, Any]) -> str:
  """The function name a compile event is tagged with ('?' when none)."""
  return str(event_kwargs.get("fun_name", "?"))


def jit_program_name(name: str) -> str:
  """The name compile events give `jax.jit` of a function called `name`."""
  return f"jit({name})"


def function_of_program(program_name: str) -> str:
  """The function name inside a program name 'jit(f)' (others unchanged)."""
  return program_name[4:-1] if program_name.startswith("jit(") else program_name


# --- jaxpr helpers -----------------------------------------------------------

def convert_constvars_jaxpr(jaxpr: Jaxpr) -> Jaxpr:
  """Turns a jaxpr's constvars into leading invars (for open-jaxpr params)."""
  return _pe.convert_constvars_jaxpr(jaxpr)


def subjaxprs_in_params(params: dict[str, Any]) -> Iterable[Jaxpr]:
  """Every jaxpr (open or closed) in an equation's params."""
  for j in _jaxprs_in_params(params):
    yield j.jaxpr if isinstance(j, ClosedJaxpr) else j


def jaxpr_as_fun(jaxpr: Jaxpr) -> Callable[..., Any]:
  """A Python function that evaluates a const-free open jaxpr with JAX."""
  fun: Callable[..., Any] = jex_core.jaxpr_as_fun(ClosedJaxpr(jaxpr, ()))
  return fun


def is_dropvar(v: Any) -> bool:
  return isinstance(v, _core.DropVar)


def typeof(x: Any) -> Any:
  """The abstract value (shape, dtype, weak type) of a concrete argument."""
  return jax.typeof(x)


def make_closed_jaxpr(fun: Callable[..., Any], avals: list[Any]) -> ClosedJaxpr:
  """Traces `fun(*flat_args) -> list` to a ClosedJaxpr at the given avals."""
  # jax.ShapeDtypeStruct's __init__ is unannotated in JAX (a stub gap).
  specs = [jax.ShapeDtypeStruct(  # type: ignore[no-untyped-call, unused-ignore]
               a.shape, a.dtype, weak_type=a.weak_type)
           for a in avals]
  return jax.make_jaxpr(fun)(*specs)


def shaped(shape: Any, dtype: Any, weak_type: bool = False) -> Any:
  """An abstract array value with the given (possibly symbolic) shape."""
  return _core.ShapedArray(tuple(shape), dtype, weak_type=weak_type)


def replay_unsafe_effects(jaxpr: Jaxpr) -> list[Any]:
  """The effects of `jaxpr` that must not run twice: those `jax.checkpoint`
  refuses to replay (an io_callback's), unlike debug prints."""
  return _effects.remat_allowed_effects.filter_not_in(jaxpr.effects)


# --- JAX's error texts -------------------------------------------------------------

_INCONCLUSIVE = re.compile(
    r"comparison '(?P<a>[^']+)' (?P<op>>=|<=|>|<) '(?P<b>[^']+)' is inconclusive")


def is_while_loop_vjp_refusal(error: BaseException) -> bool:
  """Whether `error` is JAX refusing to differentiate a while_loop in reverse
  mode (what a loop whose trip count is a symbolic size becomes)."""
  return "Reverse-mode differentiation does not work for lax.while_loop" in str(error)


def inconclusive_comparison(error: BaseException) -> tuple[str, str, str] | None:
  """(a, op, b) of the comparison an InconclusiveDimensionOperation names."""
  match = _INCONCLUSIVE.search(str(error))
  return None if match is None else (match.group("a"), match.group("op"), match.group("b"))


# --- JAX spellings replaced while polyjit traces (issue 10) -------------------------
#
# `jnp.searchsorted`, `jnp.interp`, `jnp.linspace`, `jnp.diff` and
# `lax.fori_loop` cannot be traced (or, for fori_loop, reverse-differentiated)
# by JAX when a size they depend on is symbolic. `_spellings.py` has exact
# replacements; `trace_spellings()` puts them in place of JAX's functions for
# the duration of polyjit's symbolic trace (`_mask.trace_flat`). The targets
# are module attributes: the public names, plus the module globals through
# which JAX's own functions reach them (`Array.searchsorted`, `jnp.digitize`
# call `lax_numpy.searchsorted`). A JAX that moves or renames one fails loudly
# here (`getattr` raises) and in tests/test_spellings.py, never silently.
#
# Patching a module is global to the process, so each installed wrapper checks
# a thread-local depth: in a thread that is not inside `trace_spellings()` it
# calls JAX's original at once. The first block to enter (over all threads)
# installs, the last to leave restores what it found; nesting is counted.

SPELLING_TARGETS: tuple[tuple[str, str, str], ...] = (
    # (module, attribute, replacement in polyjit._spellings)
    ("jax.numpy", "searchsorted", "searchsorted"),
    ("jax._src.numpy.lax_numpy", "searchsorted", "searchsorted"),
    ("jax.numpy", "interp", "interp"),
    ("jax.numpy", "linspace", "linspace"),
    ("jax.numpy", "diff", "diff"),
    ("jax.lax", "fori_loop", "fori_loop"),
    # Data-dependent sizes (issue 14, `_data_dependent.py`): the public names,
    # `lax_numpy.nonzero` (through which `Array.nonzero` reaches it) and the
    # function behind `Array.__getitem__` (boolean masks: `x[x > 0]`).
    ("jax.numpy", "nonzero", "nonzero"),
    ("jax._src.numpy.lax_numpy", "nonzero", "nonzero"),
    ("jax.numpy", "flatnonzero", "flatnonzero"),
    ("jax.numpy", "argwhere", "argwhere"),
    ("jax.numpy", "where", "where"),
    ("jax.numpy", "compress", "compress"),
    ("jax.numpy", "extract", "extract"),
    ("jax.numpy", "unique", "unique"),
    ("jax._src.numpy.indexing", "rewriting_take", "getitem"),
)

_spelling_replacements: dict[str, Callable[..., Any]] = {}   # filled by `_spellings` at import
_spelling_lock = threading.Lock()
_spelling_local = threading.local()
_spelling_users = 0                      # open trace_spellings() blocks, all threads
_spelling_saved: list[tuple[Any, str, Any]] = []


def spellings_active() -> bool:
  """Whether this thread is inside `trace_spellings()`."""
  return getattr(_spelling_local, "depth", 0) > 0


def _spelling_wrapper(original: Callable[..., Any],
                      replacement: Callable[..., Any]) -> Callable[..., Any]:
  @functools.wraps(original)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    if getattr(_spelling_local, "depth", 0) > 0:
      return replacement(original, *args, **kwargs)
    return original(*args, **kwargs)
  setattr(wrapper, "_polyjit_spelling", original)
  return wrapper


def register_spellings(replacements: dict[str, Callable[..., Any]]) -> None:
  """Gives the replacements (name -> `fn(original, *args, **kwargs)`); called
  by `_spellings` when it is imported, so that this module imports nothing of
  polyjit's."""
  _spelling_replacements.update(replacements)


def _install_spellings() -> None:
  # Resolve every target before patching any: a missing one raises with
  # nothing half-installed.
  plan = []
  for module_name, attr, name in SPELLING_TARGETS:
    module = importlib.import_module(module_name)
    current = getattr(module, attr)          # AttributeError: JAX renamed it
    original = getattr(current, "_polyjit_spelling", current)
    replacement = _spelling_replacements[name]  # KeyError: `_spellings` not imported
    plan.append((module, attr, current, _spelling_wrapper(original, replacement)))
  _spelling_saved[:] = [(module, attr, current) for module, attr, current, _ in plan]
  for module, attr, _, wrapper in plan:
    setattr(module, attr, wrapper)


def _restore_spellings() -> None:
  for module, attr, value in reversed(_spelling_saved):
    setattr(module, attr, value)
  _spelling_saved.clear()


@contextlib.contextmanager
def trace_spellings() -> Iterator[None]:
  """Within the block, this thread's calls of the `SPELLING_TARGETS` go to
  polyjit's exact replacements where a size they need is symbolic."""
  global _spelling_users
  with _spelling_lock:
    if _spelling_users == 0:
      _install_spellings()
    _spelling_users += 1
  depth = getattr(_spelling_local, "depth", 0)
  _spelling_local.depth = depth + 1
  try:
    yield
  finally:
    _spelling_local.depth = depth
    with _spelling_lock:
      _spelling_users -= 1
      if _spelling_users == 0:
        _restore_spellings()


def promote_dtypes_inexact(*args: Any) -> Any:
  """JAX's numpy promotion to an inexact dtype, weak types included (the
  replacement of `jnp.interp` must promote exactly as JAX's does)."""
  return _np_util.promote_dtypes_inexact(*args)


# --- data-dependent sizes (issue 14) ------------------------------------------------

def size_primitive(name: str, abstract_eval: Callable[..., Any],
                   refuse_batching: Callable[[], Exception]) -> Primitive:
  """A primitive whose output shape holds a size computed from its operand's
  data (a fresh symbolic dimension passed as a param). It has no
  implementation and no lowering: only polyjit's masking interpreter
  evaluates it, so an equation of it anywhere else fails loudly. Its output is
  integer, so its derivative is zero. `jax.vmap` inside the traced function
  would need one size per example: it raises `refuse_batching()`."""
  prim = Primitive(name)
  # Primitive's methods are unannotated in JAX (a stub gap).
  prim.def_abstract_eval(abstract_eval)  # type: ignore[no-untyped-call, unused-ignore]

  def batch(*args: Any, **params: Any) -> Any:
    raise refuse_batching()

  _batching.primitive_batchers[prim] = batch

  def jvp(primals: Any, tangents: Any, **params: Any) -> tuple[Any, Any]:
    out = prim.bind(*primals, **params)  # type: ignore[no-untyped-call, unused-ignore]
    # `ad.Zero` is re-exported implicitly and its classmethod unknown to mypy (a stub gap).
    return out, _ad.Zero.from_primal_value(out)  # type: ignore[attr-defined, unused-ignore]

  _ad.primitive_jvps[prim] = jvp
  return prim


def dim_scope(d: Any) -> Any:
  """The `jax.export.SymbolicScope` of a symbolic dimension expression."""
  return d.scope


# --- the persistent compilation cache (`_disk_cache.py`) ----------------------------
# JAX reads its process-global cache object `compilation_cache._cache`, built
# from `jax_compilation_cache_dir` on first use; polyjit installs its own
# (atomic writes, a size bound without the `filelock` package). Probe: the
# module has `_cache`, `_cache_initialized`, `reset_cache` and
# `compilation_cache_interface.CacheInterface` (JAX 0.4.30 to 0.10).
from jax._src import compilation_cache as _cc  # noqa: E402
from jax._src import compilation_cache_interface as _cci  # noqa: E402
import pathlib as _pathlib  # noqa: E402

CompilationCacheBase: Any = _cci.CacheInterface


def pathlib_path(path: str) -> Any:
  return _pathlib.Path(path)


def user_compilation_cache_dir() -> str | None:
  """JAX's cache directory when the user (not polyjit) set one."""
  value: str | None = _config.compilation_cache_dir.value
  return value


def install_compilation_cache(cache: Any, path: str) -> None:
  """Makes `cache` JAX's persistent compilation cache (at `path`), for every
  program from now on, however small or quick to compile."""
  _cc.reset_cache()  # forget "no cache" decided by compiles before this one
  jax.config.update("jax_compilation_cache_dir", path)  # type: ignore[no-untyped-call, unused-ignore]
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # type: ignore[no-untyped-call, unused-ignore]
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)  # type: ignore[no-untyped-call, unused-ignore]
  with _cc._cache_initialized_mutex:
    _cc._cache = cache
    _cc._cache_initialized = True


def uninstall_compilation_cache() -> None:
  _cc.reset_cache()
  jax.config.update("jax_compilation_cache_dir", None)  # type: ignore[no-untyped-call, unused-ignore]
