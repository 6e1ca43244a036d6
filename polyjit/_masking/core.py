"""The masking interpreter: evaluate a symbolic jaxpr on padded arrays.

Design
------
`fun` is traced once with symbolic dimensions (`jax.export.symbolic_shape`), so
every size that varies is a symbolic expression in the jaxpr's avals and
params, and every use of a size as a value is a `dim_as_value` equation. This
module evaluates that jaxpr on *padded* arrays, the `core.eval_jaxpr` way (an
env, a loop over equations), with a table of masking rules keyed by primitive:

* a symbolic size in a shape or param evaluates to its **padded** size, a
  Python int (`MaskEnv.padded`), so every array has a static padded shape;
* `dim_as_value`, and every rule that needs to know where the data ends,
  evaluates the expression on the **logical** sizes, int scalars that may be
  traced (`MaskEnv.logical`), so one compiled program serves all sizes.

Because the interpreter is ordinary JAX code, `jit`, `vmap` and `grad` compose
with it (gradients go through `_masking/mask.py`, see there).

The invariant
-------------
Along every dynamic axis (an axis whose symbolic size is not a constant) a
value's data occupies the leading `[0, logical)` region; the rest is padding
whose content is **unspecified**: garbage, NaN or inf. Every rule must produce
outputs whose valid region equals the unpadded computation, and must never let
padding reach valid entries. Elementwise primitives keep padding in padding
and need no masking; primitives that mix positions (reductions, contractions,
reverse scans, re-anchoring ops) mask or move data explicitly.

An equation with no symbolic size anywhere (avals, params, sub-jaxprs) binds
unchanged. An equation that has one and no rule raises `MaskingError`: a wrong
answer is the worst failure this library can have, so nothing is guessed.
"""

from __future__ import annotations

import difflib
import math
import types
import weakref
from typing import Any, Callable, Mapping, Sequence, TypeVar

import jax
import numpy as np
from jax import lax

from . import dims as _dims
from .. import _jax as jc
from .errors import MaskingError, no_rule_message
from .refusals import narrowed_error, narrowed_input, narrowed_output, why_unsupported
from . import lapack_order as _lapack_order

Rule = Callable[..., list[Any]]
#: Masks of up to this many entries slice a constant (see `MaskEnv._axis_mask`).
_SMALL_MASK = 512

#: The masking rules, read-only: primitive -> rule(ctx, *padded_args, **params)
#: -> list. `register` is the only way in (a direct write raises TypeError), so
#: its checks hold for every entry and `rule_layers` can say what runs.
_rules: dict[jc.Primitive, Rule] = {}
masking_rules: Mapping[jc.Primitive, Rule] = types.MappingProxyType(_rules)
#: Per primitive, the qualified names of what runs, innermost first: the rule,
#: then each wrapper registered with `register(..., wraps=True)`.
_layers: dict[jc.Primitive, list[str]] = {}

_F = TypeVar("_F", bound=Callable[..., Any])  # a rule or wrapper, its type kept


def register(*names: "str | jc.Primitive", optional: bool = False,
             wraps: bool = False) -> Callable[[_F], _F]:
  """Registers a rule for the primitives with these names (or primitives).

  A name that matches no JAX primitive is a typo and raises, unless
  `optional`: a primitive that only some JAX versions have is skipped where
  it is missing. A primitive gets one rule: registering a second is a
  programming error (import order would otherwise decide silently which one
  runs).

  With `wraps=True` the decorated function is a *wrapper*, `rule -> rule`,
  put around the rule already registered for each primitive (a check that runs
  after it, say). Wrapping a primitive that has no rule yet raises: the
  wrapper's module must import the rules it wraps. `rule_layers` lists what
  runs for a primitive, so this one path is also where to look.
  """
  def wrap(fn: _F) -> _F:
    prims = [(name if isinstance(name, jc.Primitive) else jc.primitive(name), name)
             for name in names]
    for prim, name in prims:
      if prim is None and not optional and name not in jc.PRIMITIVES_NEWER_THAN_THIS_JAX:
        raise ValueError(_unknown_primitive_message(str(name), fn))
    for prim, _ in prims:
      if prim is None:
        continue
      other = _rules.get(prim)
      if wraps:
        if other is None:
          raise RuntimeError(f"{_qualname(fn)} wraps the masking rule for '{prim.name}', "
                             "which has none yet (import the rules it wraps first)")
        if _qualname(fn) in _layers[prim]:
          raise RuntimeError(f"{_qualname(fn)} wraps the rule for '{prim.name}' twice")
        _rules[prim] = fn(other)
        _layers[prim].append(_qualname(fn))
      else:
        if other is not None and other is not fn:
          raise RuntimeError(f"two masking rules for '{prim.name}': {_layers[prim][0]} "
                             f"and {_qualname(fn)}")
        _rules[prim] = fn
        _layers[prim] = [_qualname(fn)]
    return fn
  return wrap


def _qualname(fn: Any) -> str:
  return f"{fn.__module__}.{fn.__qualname__}"


def rule_layers(prim: jc.Primitive) -> list[str]:
  """What runs for a primitive, innermost first: its rule, then its wrappers."""
  return list(_layers.get(prim, ()))


def _unknown_primitive_message(name: str, rule: Any) -> str:
  known = sorted({p.name for p in jc.all_primitives()})
  close = difflib.get_close_matches(name, known, n=3)
  hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
  return (f"the masking rule {_qualname(rule)} is registered for "
          f"'{name}', and no JAX {jax.__version__} primitive has that name{hint}. A "
          "primitive that only some JAX versions have takes register(..., optional=True).")


def registered_names() -> set[str]:
  return {p.name for p in masking_rules}


# --- symbolic content --------------------------------------------------------

def _aval_is_symbolic(aval: Any) -> bool:
  shape = getattr(aval, "shape", ())
  return any(jc.is_symbolic_dim(d) for d in shape)


def _value_is_symbolic(v: Any) -> bool:
  if jc.is_symbolic_dim(v):
    return True
  if isinstance(v, (tuple, list)):
    return any(_value_is_symbolic(x) for x in v)
  return False


_jaxpr_symbolic: "weakref.WeakKeyDictionary[jc.Jaxpr, bool]" = weakref.WeakKeyDictionary()


def jaxpr_is_symbolic(jaxpr: jc.Jaxpr) -> bool:
  """Whether a jaxpr mentions a symbolic size anywhere (cached)."""
  try:
    return _jaxpr_symbolic[jaxpr]
  except KeyError:
    pass
  result = (any(_aval_is_symbolic(v.aval) for v in jaxpr.invars)
            or any(_aval_is_symbolic(v.aval) for v in jaxpr.constvars)
            or any(eqn_is_symbolic(e) for e in jaxpr.eqns))
  _jaxpr_symbolic[jaxpr] = result
  return result


def eqn_is_symbolic(eqn: jc.JaxprEqn) -> bool:
  if any(_aval_is_symbolic(v.aval) for v in eqn.invars):
    return True
  if any(_aval_is_symbolic(v.aval) for v in eqn.outvars):
    return True
  for value in eqn.params.values():
    if _value_is_symbolic(value):
      return True
  return any(jaxpr_is_symbolic(j) for j in jc.subjaxprs_in_params(eqn.params))


# --- sizes -------------------------------------------------------------------

class MaskEnv:
  """The sizes of one masked evaluation: padded (ints) and logical (scalars).

  `cache` is shared with the environments derived for sub-jaxprs and outlives
  one evaluation (it belongs to the traced function), so masked sub-jaxprs are
  built once per padded size.
  """

  def __init__(self, dim_names: Sequence[str], padded: dict[str, int],
               logical: Sequence[Any], cache: dict[Any, Any] | None = None):
    self.dim_names = tuple(dim_names)
    self.padded_env = dict(padded)
    self.logical_values = tuple(logical)
    self.logical_env = dict(zip(self.dim_names, self.logical_values, strict=True))
    self.cache = {} if cache is None else cache
    self._logical_cache: dict[Any, Any] = {}
    self._mask_cache: dict[Any, Any] = {}
    self._fill_cache: dict[Any, Any] = {}
    self._padded_cache: dict[Any, int] = {}
    # Data-dependent sizes (`_masking/data_dependent.py`) are bound while the jaxpr
    # runs, only at the top level (`nested` envs evaluate loop bodies and
    # branches, which run many times or not at all); `checks` are the
    # conditions (scalar bools, with an error code) under which the result
    # is defined.
    self.nested = False
    self.nested_in = ""   # the primitive whose sub-jaxpr this env evaluates
    self.size_names: tuple[str, ...] = ()
    self.checks: list[Any] = []
    # Orders this evaluation's LAPACK calls one after another (see
    # `lapack_order.py`); None before the first one.
    self.lapack_token: Any = None
    # Native mode (`native.py`): JAX differentiates this evaluation itself,
    # with tangents masked at the equations' outputs; then `native` is the
    # function that evaluates one symbolic equation (`native.step`).
    self.native: Callable[[RuleContext, Rule, list[Any], jc.Jaxpr], list[Any]] | None = None
    # Native mode, evaluating a custom_jvp rule: its values may be linear in
    # the tangents JAX transposes, so `native.wrap` masks linearly there.
    self.native_linear = False
    # Native mode, the body of a scan over a dynamic length: what each
    # equation's inputs pass through first (`rules/control_flow.py`: a frozen
    # step's zero cotangent must stay 0 through a derivative that may be inf).
    self.gate_inputs: Callable[[jc.JaxprEqn, list[Any]], list[Any]] | None = None

  def bind_size(self, name: str, padded: int, logical: Any) -> None:
    """Adds a data-dependent size, computed by the program, to the sizes."""
    self.dim_names += (name,)
    self.size_names += (name,)
    self.padded_env[name] = padded
    self.logical_values += (logical,)
    self.logical_env[name] = logical

  def padded_key(self) -> tuple[tuple[str, int], ...]:
    return tuple((k, self.padded_env[k]) for k in self.dim_names)

  def with_logical(self, logical: Sequence[Any], within: str = "") -> "MaskEnv":
    """An environment for a sub-jaxpr (`within`: its primitive's name)."""
    env = MaskEnv(self.dim_names, self.padded_env, logical, self.cache)
    env.nested = True
    env.nested_in = within
    env.native = self.native
    env.native_linear = self.native_linear
    return env

  def padded(self, d: Any, eqn: jc.JaxprEqn | None = None) -> int:
    """The padded size of a dimension: the buffer length that holds its data.

    For a size that never decreases as the dimensions grow (`n - 1`, `2*n`,
    `n // 2`) that is its value at the padded sizes. A size that can shrink
    as a dimension grows (`n - m`, `n - mod(-2, n)` from `jnp.roll`) gets an
    upper bound over every logical assignment up to the padded sizes instead;
    either way equal sizes get equal buffers.
    """
    if not jc.is_symbolic_dim(d):
      return int(d)
    size = self._padded_cache.get(d)
    if size is None:
      size = _dims.padded_dim(d, self.padded_env)
      if size is None:
        raise MaskingError(
            f"the size '{d}' {jc.source_line(eqn)} can shrink as a dimension grows, "
            "and polyjit cannot bound it, so no padded buffer is known to hold its "
            "data. Rewrite the computation, or declare one of the dimensions fixed.",
            primitive=eqn.primitive.name if eqn is not None else None,
            source=jc.source_line(eqn))
      self._padded_cache[d] = size
    return size

  def padded_shape(self, shape: Sequence[Any], eqn: jc.JaxprEqn | None = None) -> tuple[int, ...]:
    return tuple(self.padded(d, eqn) for d in shape)

  def logical(self, d: Any) -> Any:
    """The logical size of a dimension: a (possibly traced) int scalar."""
    if not jc.is_symbolic_dim(d):
      return np.asarray(int(d), jc.dim_value_dtype())
    try:
      return self._logical_cache[d]
    except KeyError:
      pass
    value = _dims.evaluate_dim(d, self.logical_env)
    value = lax.convert_element_type(value, jc.dim_value_dtype())
    self._logical_cache[d] = value
    return value

  def valid_mask(self, aval: Any, axes: Sequence[int] | None = None,
                 eqn: jc.JaxprEqn | None = None) -> Any:
    """A bool array of `aval`'s padded shape, True on the valid region of `axes`.

    `aval` is an abstract value or a symbolic shape. Only dynamic axes among
    `axes` (default: all) contribute; returns None when none does.
    """
    sym_shape = tuple(getattr(aval, "shape", aval))
    axes = range(len(sym_shape)) if axes is None else axes
    dims = tuple((a, sym_shape[a]) for a in axes if jc.is_symbolic_dim(sym_shape[a]))
    if not dims:
      return None
    shape = self.padded_shape(sym_shape, eqn)
    key = (shape, dims)
    mask = self._mask_cache.get(key)
    if mask is None:  # one mask per shape and axes, shared by every rule
      for a, d in dims:
        below = lax.broadcast_in_dim(self._axis_mask(d, shape[a], math.prod(shape)),
                                     shape, (a,))
        mask = below if mask is None else lax.bitwise_and(mask, below)
      self._mask_cache[key] = mask
    return mask

  def _axis_mask(self, d: Any, size: int, total: int) -> Any:
    """A bool vector of length `size`, True below the logical size of `d`,
    for a mask of `total` entries.

    XLA:CPU runs a program whose cost analysis counts fewer than 1000 flops
    on the calling thread and any other through its thread pool, which costs
    5-15 us a call. A small mask is therefore a slice of a constant (`size`
    True, then `size` False) starting at `size - logical`: no flop, so a
    small masked program stays as cheap as the unmasked one. A large one
    compares an iota (one flop per entry, but XLA vectorizes it well; a
    sliced mask broadcast over a large array runs 2x slower in attention).
    """
    logical = self.logical(d)
    if total > _SMALL_MASK:
      return lax.lt(lax.iota(jc.dim_value_dtype(), size), logical)
    pattern = np.arange(2 * size) < size
    start = lax.sub(np.asarray(size, logical.dtype), logical)
    return lax.dynamic_slice(pattern, (start,), (size,))

  def fill_padding(self, x: Any, aval: Any, value: Any, axes: Sequence[int] | None = None,
                   eqn: jc.JaxprEqn | None = None) -> Any:
    """`x` with the padding of `axes` (default: all) replaced by `value`.

    Filled once per value, axes and fill: rules that need the same padding
    of the same value share one select (the entry keeps `x` alive, so its id
    cannot be reused while the entry exists).
    """
    mask = self.valid_mask(aval, axes, eqn)
    if mask is None:
      return x
    key = (id(x), id(mask), np.dtype(x.dtype).str, repr(value))
    hit = self._fill_cache.get(key)
    if hit is not None and hit[0] is x:
      return hit[1]
    filled = lax.select(mask, x, lax.full_like(x, value))
    self._fill_cache[key] = (x, filled)
    return filled

  def fill_padding_if(self, x: Any, aval: Any, value: Any, axes: Sequence[int],
                      eqn: jc.JaxprEqn | None = None) -> Any:
    """`x` with the padding of *every* dynamic axis replaced by `value` when
    some axis among `axes` is dynamic, else `x`.

    For rules whose other axes' padding only lands in their output's padding
    (a reduction's kept axes, a contraction's free axes): filling them too is
    harmless, and one fill then serves every rule that fills `x` with `value`.
    """
    if self.valid_mask(aval, axes, eqn) is None:
      return x
    return self.fill_padding(x, aval, value, None, eqn)

  def padded_aval(self, aval: Any, eqn: jc.JaxprEqn | None = None) -> Any:
    return jc.shaped(self.padded_shape(aval.shape, eqn), aval.dtype,
                     getattr(aval, "weak_type", False))


# --- the interpreter ---------------------------------------------------------

# per equation: (eqn, whether it is symbolic, (index, outvar) pairs to keep)
_Step = tuple[jc.JaxprEqn, bool, tuple[tuple[int, Any], ...]]
_steps_cache: "weakref.WeakKeyDictionary[jc.Jaxpr, tuple[_Step, ...]]" = weakref.WeakKeyDictionary()


def _steps(jaxpr: jc.Jaxpr) -> tuple[_Step, ...]:
  """Per equation: (eqn, masks?, outvars to keep), computed once per jaxpr."""
  try:
    return _steps_cache[jaxpr]
  except KeyError:
    pass
  steps = tuple((eqn, eqn_is_symbolic(eqn),
                tuple((i, v) for i, v in enumerate(eqn.outvars) if not jc.is_dropvar(v)))
               for eqn in jaxpr.eqns)
  _steps_cache[jaxpr] = steps
  return steps


def eval_jaxpr_masked(jaxpr: jc.Jaxpr, consts: Sequence[Any],
                      args: Sequence[Any], env: MaskEnv) -> list[Any]:
  """Evaluates `jaxpr` on padded `args`; returns padded outputs."""
  vals: dict[Any, Any] = {}

  def read(v: Any) -> Any:
    return v.val if isinstance(v, jc.Literal) else vals[v]

  for v, x in zip(jaxpr.constvars, consts, strict=True):
    vals[v] = x
  for v, x in zip(jaxpr.invars, args, strict=True):
    vals[v] = x
  lapack = _lapack_order.lapack_calls(jaxpr) if _lapack_order.ACTIVE else None
  gate = env.gate_inputs
  for i, (eqn, symbolic, outvars) in enumerate(_steps(jaxpr)):
    invals = [read(v) for v in eqn.invars]
    if gate is not None:
      invals = gate(eqn, invals)
    if lapack is not None and lapack[i]:
      invals = _lapack_order.after(env.lapack_token, invals)
    with jc.eqn_context(eqn):
      if symbolic:
        rule = masking_rules.get(eqn.primitive)
        if rule is None:
          raise _no_rule_error(eqn)
        try:
          if env.native is not None:
            outs = env.native(RuleContext(env, eqn), rule, invals, jaxpr)
          else:
            outs = rule(RuleContext(env, eqn), *invals, **eqn.params)
        except TypeError as e:   # (`lax.pad requires ... same dtype`: a float32 fill)
          narrowed = narrowed_input(eqn)
          if narrowed is None:
            raise
          raise narrowed_error(eqn, *narrowed) from e
        narrowed = narrowed_output(eqn, outs)
        if narrowed:
          raise narrowed_error(eqn, *narrowed)
      else:
        # JAX's Primitive.bind carries no annotations
        outs = eqn.primitive.bind(*invals, **jc.bind_params(eqn))  # type: ignore[no-untyped-call, unused-ignore]
        if not eqn.primitive.multiple_results:
          outs = [outs]
    if lapack is not None and lapack[i]:
      env.lapack_token = _lapack_order.token_after(env.lapack_token, outs)
    for j, v in outvars:
      vals[v] = outs[j]
  return [read(v) for v in jaxpr.outvars]


def _no_rule_error(eqn: jc.JaxprEqn) -> MaskingError:
  padded = []
  for i, v in enumerate(eqn.invars):
    shape = getattr(v.aval, "shape", ())
    axes = [f"axis {a} ({d})" for a, d in enumerate(shape) if jc.is_symbolic_dim(d)]
    if axes:
      # JAX's AbstractValue.str_short carries no annotations
      padded.append(f"operand {i} {v.aval.str_short()}: "  # type: ignore[no-untyped-call, unused-ignore]
                    + ", ".join(axes))
  source = jc.source_line(eqn)
  message = no_rule_message(eqn.primitive.name, source, padded)
  why = why_unsupported(eqn.primitive.name)
  if why:
    message += f"\nWhy it has none: {why}"
  return MaskingError(message, primitive=eqn.primitive.name, source=source)


def mask_closed_jaxpr(closed: jc.ClosedJaxpr, env: MaskEnv, within: str = "") -> jc.ClosedJaxpr:
  """A concrete-shaped jaxpr computing `closed` masked at `env`'s padded sizes.

  Its inputs are the logical sizes (in `env.dim_names` order) followed by the
  padded inputs of `closed`; control-flow rules bind it in place of `closed`,
  passing `env.logical_values` as extra operands. Cached per padded size.
  """
  key = ("masked", id(closed), env.padded_key(), env.native is not None)
  hit = env.cache.get(key)
  if hit is not None and hit[0] is closed:
    cached: jc.ClosedJaxpr = hit[1]
    return cached
  k = len(env.dim_names)
  logical_aval = jc.shaped((), jc.dim_value_dtype())
  in_avals = [logical_aval] * k + [env.padded_aval(v.aval) for v in closed.jaxpr.invars]

  def masked(*args: Any) -> list[Any]:
    sub_env = env.with_logical(args[:k], within)
    return eval_jaxpr_masked(closed.jaxpr, closed.consts, args[k:], sub_env)

  result = jc.make_closed_jaxpr(masked, in_avals)
  env.cache[key] = (closed, result)
  return result


# --- what rules see ----------------------------------------------------------

class RuleContext:
  """Everything a rule needs about the equation it masks.

  Rules are called as `rule(ctx, *padded_args, **params)` with the equation's
  symbolic params, and return a list of padded outputs.
  """
  __slots__ = ("env", "eqn")

  def __init__(self, env: MaskEnv, eqn: jc.JaxprEqn):
    self.env = env
    self.eqn = eqn

  # avals and sizes
  @property
  def in_avals(self) -> list[Any]:
    return [v.aval for v in self.eqn.invars]

  @property
  def out_avals(self) -> list[Any]:
    return [v.aval for v in self.eqn.outvars]

  @property
  def primitive(self) -> jc.Primitive:
    return self.eqn.primitive

  def padded(self, d: Any) -> int:
    return self.env.padded(d, self.eqn)

  def logical(self, d: Any) -> Any:
    return self.env.logical(d)

  def padded_shape(self, shape: Sequence[Any]) -> tuple[int, ...]:
    return self.env.padded_shape(shape, self.eqn)

  def padded_params(self, params: dict[str, Any]) -> dict[str, Any]:
    """Params with every symbolic size replaced by its padded size.

    Only right for params that *are* sizes (shapes, slice sizes, lengths): a
    symbolic position or padding amount (a slice start, a pad's low side)
    depends on where the data is, and its rule must work it out from the
    logical sizes instead of binding it through here.
    """
    return {k: self._pad_value(v) for k, v in params.items()}

  def _pad_value(self, v: Any) -> Any:
    if jc.is_symbolic_dim(v):
      return self.padded(v)
    if not isinstance(v, (tuple, list)) or not _value_is_symbolic(v):
      return v
    items = [self._pad_value(x) for x in v]
    if hasattr(v, "_fields"):  # a NamedTuple such as GatherDimensionNumbers
      return type(v)(*items)
    return type(v)(items)

  def bind(self, *args: Any, **params: Any) -> list[Any]:
    """Binds this equation's primitive with padded params; returns a list."""
    prim = self.eqn.primitive
    # JAX's Primitive.bind and get_bind_params carry no annotations (strict only)
    out = prim.bind(*args, **prim.get_bind_params(self.padded_params(params)))  # type: ignore[no-untyped-call, unused-ignore]
    return list(out) if prim.multiple_results else [out]

  # dynamic axes and masks
  @staticmethod
  def is_dynamic(d: Any) -> bool:
    return jc.is_symbolic_dim(d)

  def valid_mask(self, aval: Any, axes: Sequence[int] | None = None) -> Any:
    """See `MaskEnv.valid_mask`."""
    return self.env.valid_mask(aval, axes, self.eqn)

  def fill_padding(self, x: Any, aval: Any, value: Any,
                   axes: Sequence[int] | None = None) -> Any:
    """See `MaskEnv.fill_padding`."""
    return self.env.fill_padding(x, aval, value, axes, self.eqn)

  def fill_padding_if(self, x: Any, aval: Any, value: Any, axes: Sequence[int]) -> Any:
    """See `MaskEnv.fill_padding_if`."""
    return self.env.fill_padding_if(x, aval, value, axes, self.eqn)

  def error(self, what: str, todo: str) -> MaskingError:
    source = jc.source_line(self.eqn)
    name = self.eqn.primitive.name
    return MaskingError(
        f"polyjit cannot mask '{name}' {source}: {what}\nWhat to do: {todo}",
        primitive=name, source=source)

  # sub-jaxprs
  def mask_jaxpr(self, closed: jc.ClosedJaxpr) -> jc.ClosedJaxpr:
    """See `mask_closed_jaxpr`; pass `self.logical_operands()` first."""
    return mask_closed_jaxpr(closed, self.env, self.eqn.primitive.name)

  def logical_operands(self) -> list[Any]:
    return list(self.env.logical_values)

  def eval_jaxpr(self, closed: jc.ClosedJaxpr, *args: Any) -> list[Any]:
    """Evaluates a sub-jaxpr inline, masked with this environment."""
    return eval_jaxpr_masked(closed.jaxpr, closed.consts, args, self.env)

  def eval_jaxpr_with(self, closed: jc.ClosedJaxpr, logical: Sequence[Any],
                      *args: Any) -> list[Any]:
    """`eval_jaxpr` with these logical sizes (values of an inner trace)."""
    return eval_jaxpr_masked(closed.jaxpr, closed.consts, args, self.env.with_logical(logical))

