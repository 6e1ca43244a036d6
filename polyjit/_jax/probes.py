"""The probes of the JAX internals polyjit relies on (rows of `registry.ROWS`).

Each probe is cheap (microseconds to a few milliseconds): the internal exists,
has the signature polyjit calls it with, and behaves as assumed on a tiny
case. Probes of kind "patch" and of what every trace reads run before
`install_patches()` installs anything; the others at their feature's first use
(`registry.require`). docs/jax-boundary.md is the audit of these rows against
JAX's source at 0.9.2, 0.10.2, 0.11.0 and the newest snapshot.
"""
from __future__ import annotations

import functools
import gc
import importlib
import inspect
import math
import threading
from typing import Any

import jax
import numpy as np
from jax import export as _export
from jax._src import ad_util as _ad_util
from jax._src import config as _config
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import source_info_util as _siu
from jax._src.array import ArrayImpl as _ArrayImpl
from jax._src.export import shape_poly as _shape_poly
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import partial_eval as _pe
from jax._src.interpreters import pxla as _pxla
from jax._src.numpy import util as _np_util

from .core import (InconclusiveDimensionOperation, Tracer, default_sharding, host_to_device,
                   in_callers_config,
                   transfers_guarded,
                   is_dropvar, max_dim, replay_unsafe_effects, shaped, subjaxprs_in_params)
from .messages import transfer_refused
from .primitives import (bind_params, is_undefined_primal, primitive, ruled_primitive,
                         shaped_array)
from .registry import (AD, CALL, DECISIONS, DIMS, INLINE, JAXPRS, PROGRAMS, SIZES, SOURCE,
                       SWAPS, internal)
from .swaps import ARRAY_GETITEM, CONV_1D, TRIU_SIZE, site_plan


#: Primitives whose JVP or transpose polyjit wraps (`_masking/autodiff.py`,
#: `_masking/rules/windows.py`, `_masking/rules/fft.py`).
WRAPPED_JVPS = ("cumprod", "cummax", "cummin", "cumlogsumexp", "reduce_prod",
                "triangular_solve")
WRAPPED_TRANSPOSES = ("conv_general_dilated", "fft")


def _params(fn: Any) -> list[str]:
  return list(inspect.signature(fn).parameters)


def _ab() -> tuple[Any, Any]:
  a, b = _export.symbolic_shape("a, b")
  return a, b


# --- size comparisons in user code (patches) ---------------------------------------

@internal("shape_poly._DimExpr.__eq__", DECISIONS, "patch",
          "wrapped to ask the oracle when an equality of sizes cannot be proven")
def _dimexpr_eq() -> None:
  a, b = _ab()
  assert (a == b) is False and (a == a) is True and (a + 0 == a) is True
  assert isinstance(Tracer, type)


@internal("shape_poly._geq_decision(e1, e2, cmp_str)", DECISIONS, "patch",
          "wrapped to ask the oracle when `>=` of sizes is inconclusive")
def _geq_decision() -> None:
  assert _params(_shape_poly._geq_decision) == ["e1", "e2", "cmp_str"]
  a, b = _ab()
  assert (a >= 1) is True
  try:
    _ = a >= b
  except InconclusiveDimensionOperation:
    return
  raise AssertionError("`a >= b` did not raise InconclusiveDimensionOperation")


@internal("shape_poly._DimExpr.__ne__, __bool__, __hash__, __int__, __index__, __float__",
          DECISIONS, "patch",
          "every other question Python asks of a size goes to the oracle or is refused "
          "with the user's line (issue 22): `!=` through `==`, truth, hashing "
          "(membership), conversions to Python numbers")
def _dimexpr_questions() -> None:
  a, b = _ab()
  assert (a != b) is True and (a != a) is False
  assert bool(a) is True and isinstance(hash(a), int) and hash(a) == hash(a + 0)
  try:
    int(a)
  except InconclusiveDimensionOperation:
    pass
  else:
    raise AssertionError("int() of a symbolic size did not raise")
  assert not hasattr(type(a), "__index__") or getattr(type(a).__index__, "__name__", "") == "convert"
  assert _shape_poly._DimExpr._to_constant(a) is None


@internal("shape_poly._DimExpr.__class__ (the class namespace)", DECISIONS, "patch",
          "a size answers `int` to user code's isinstance while polyjit traces, as "
          "jax.jit's Python int does (`size_class.py`): a plain class whose namespace "
          "is a dict, with no `__class__` of its own and no `__getattribute__`")
def _dimexpr_class() -> None:
  cls = _shape_poly._DimExpr
  a, _ = _ab()
  assert type(a) is cls and cls.__mro__ == (cls, object), cls.__mro__
  namespace = gc.get_referents(cls.__dict__)
  assert len(namespace) == 1 and isinstance(namespace[0], dict)
  own = namespace[0].get("__class__")   # none, or polyjit's (installed after this probe)
  assert own is None or getattr(own.fget, "__module__", "") == "polyjit._jax.size_class", own
  assert cls.__getattribute__ is object.__getattribute__
  assert a.__class__ is cls and not isinstance(a, int)


@internal("shape_poly._bounds_decision, BoundsPrecision.BEST", DECISIONS, "read",
          "bounds of a size difference (is an equality already decided?)")
def _bounds() -> None:
  a, _ = _ab()
  lo, hi = _shape_poly._bounds_decision(a - 1, _shape_poly.BoundsPrecision.BEST)
  assert (lo, hi) == (0, math.inf), (lo, hi)


@internal("SymbolicScope._explicit_constraints (cmp, debug_str, diff), Comparator",
          DECISIONS, "read", "the constraints a scope was made with")
def _constraints() -> None:
  scope = _export.SymbolicScope(["a >= 2"])
  c, = scope._explicit_constraints
  assert c.cmp == _shape_poly.Comparator.GEQ and "a >= 2" in c.debug_str
  assert str(c.diff) == "a - 2", str(c.diff)
  assert {c.name for c in _shape_poly.Comparator} >= {"EQ", "GEQ"}


# --- symbolic dimensions (reads) ---------------------------------------------------

@internal("_DimExpr._get_vars/_sorted_terms/_factors/_evaluate/_from_var/scope, "
          "factor var/operation/operands", DIMS, "read",
          "polyjit's own algebra on dimension expressions (`_masking/dims.py`)")
def _dimexpr_structure() -> None:
  a, b = _ab()
  e: Any = 2 * a * b + a // 3 + 1
  assert e._get_vars() == {"a", "b"}
  ops = {f.operation for term, _ in e._sorted_terms for f, _ in term._factors if f.var is None}
  assert ops == {"floordiv"}, ops
  q: Any = a // 3
  for term, _ in q._sorted_terms:
    (f, exponent), = term._factors
    assert exponent == 1
    assert tuple(str(o) for o in f.operands) == ("a", "3"), f.operands
  assert e._evaluate({"a": 6, "b": 1}) == 15
  assert _shape_poly._DimExpr._from_var("a", a.scope) == a
  dtype: Any = _core.dim_value_dtype()  # type: ignore[no-untyped-call, unused-ignore]
  assert np.dtype(dtype) in (np.dtype(np.int32), np.dtype(np.int64))


# --- source lines ------------------------------------------------------------------

@internal("source_info_util.register_exclusion(path)", SOURCE, "patch",
          "polyjit's frames are left out of JAX's source lines")
def _register_exclusion() -> None:
  assert _params(_siu.register_exclusion) == ["path"]


@internal("source_info_util.current_name_stack/user_context/summarize, "
          "JaxprEqn.source_info/ctx.manager", SOURCE, "read",
          "ops emitted for an equation keep its source location")
def _eqn_source() -> None:
  eqn, = jax.make_jaxpr(lambda x: x + 1)(1.0).jaxpr.eqns
  _siu.current_name_stack() + eqn.source_info.name_stack
  assert "name_stack" in _params(_siu.user_context)
  with _siu.user_context(eqn.source_info.traceback, name_stack=_siu.current_name_stack()):
    with eqn.ctx.manager:
      pass
  assert isinstance(_siu.summarize(eqn.source_info), str)


@internal("source_info_util.current().traceback.frames (file_name, function_name)", SOURCE,
          "read", "a JAX derivative rule's size question names the jnp function it came "
          "from (`frames.current_source_line`); an error path: None if it changed")
def _current_source() -> None:
  traceback: Any = _siu.current().traceback   # (None outside a trace: not here)
  frames = traceback.frames
  assert frames and isinstance(frames[0].file_name, str)
  assert isinstance(frames[0].function_name, str)


@internal("api_util.InternalFloatingPointError", CALL, "read",
          "what a compiled program's jax_debug_nans/infs check raises: pj.jit runs the "
          "call again with the checks off and checks the valid region (`float_checks.py`)")
def _internal_floating_point_error() -> None:
  from .float_checks import InternalFloatingPointError
  from jax._src import api_util
  assert InternalFloatingPointError is api_util.InternalFloatingPointError
  assert issubclass(InternalFloatingPointError, Exception)


# --- differentiation rules (patches) -----------------------------------------------

@internal("ad.primitive_jvps", AD, "patch",
          "JVPs of cumulative ops, reduce_prod, triangular_solve wrapped (`_masking/autodiff.py`)")
def _jvps() -> None:
  for name in WRAPPED_JVPS:
    prim = primitive(name)
    assert prim is not None and callable(_ad.primitive_jvps.get(prim)), name


@internal("ad.primitive_transposes entries as functools.partial(driver, *rules)", AD, "patch",
          "transposes of conv_general_dilated and fft wrapped (`_masking/rules/windows.py`, `fft.py`)")
def _transposes() -> None:
  for name in WRAPPED_TRANSPOSES:
    prim = primitive(name)
    assert prim is not None, name
    entries = [t.get(prim) for t in (_ad.primitive_transposes,
                                     getattr(_ad, "fancy_transposes", {}))]
    assert any(isinstance(e, functools.partial) for e in entries), (name, entries)


@internal("jax._src.numpy.linalg._det (a jax.custom_jvp)", AD, "patch",
          "the JVP of jnp.linalg.det wrapped (`_masking/autodiff.py`)")
def _det() -> None:
  fn = getattr(importlib.import_module("jax._src.numpy.linalg"), "_det")
  assert isinstance(fn, jax.custom_jvp) and callable(fn.jvp)


@internal("ad.Zero, ad_util.p2tz, core.primal_dtype_to_tangent_dtype", AD, "read",
          "symbolic zero tangents (the JVP of polyjit's size primitive)")
def _zero() -> None:
  z = _ad_util.p2tz(np.int32(1))  # type: ignore[no-untyped-call, unused-ignore]
  assert isinstance(z, _ad.Zero) and z.aval.dtype == jax.dtypes.float0  # type: ignore[attr-defined, unused-ignore]
  assert _core.primal_dtype_to_tangent_dtype(np.dtype(np.int32)) == jax.dtypes.float0  # type: ignore[no-untyped-call, unused-ignore]


@internal("Primitive.def_impl/def_abstract_eval, mlir.lower_fun, ad.primitive_jvps, "
          "ad.primitive_transposes(ct, *UndefinedPrimal or values), ad.is_undefined_primal, "
          "batching.primitive_batchers, core.ShapedArray", AD, "read",
          "a primitive with rules of polyjit's own: the packed block-diagonal products "
          "(`primitives.ruled_primitive`, `_ragged/packed_block_dot.py`)")
def _ruled_primitive() -> None:
  calls: list[str] = []
  def jvp(primals: Any, tangents: Any) -> Any:
    calls.append("jvp")
    return prim.bind(*primals), prim.bind(*tangents)
  def transpose(ct: Any, x: Any) -> Any:
    calls.append("transpose")
    assert is_undefined_primal(x)
    return [2 * ct]
  def batch(args: Any, dims: Any) -> Any:
    calls.append("batch")
    return prim.bind(*args), dims[0]
  prim = ruled_primitive("polyjit_probe_double", lambda x: 2 * x,
                         lambda x: shaped_array(x.shape, x.dtype), jvp, transpose, batch)
  x = jax.ShapeDtypeStruct((3,), np.float32)  # type: ignore[no-untyped-call, unused-ignore]
  # (traced and lowered, never compiled: compile counts are user-visible)
  jax.jit(lambda x: prim.bind(x).sum()).lower(x)
  jax.make_jaxpr(jax.grad(lambda x: prim.bind(x).sum()))(x)
  jax.make_jaxpr(lambda x: jax.jvp(prim.bind, (x,), (x,)))(x)
  jax.make_jaxpr(jax.vmap(prim.bind))(jax.ShapeDtypeStruct((3, 1), np.float32))  # type: ignore[no-untyped-call, unused-ignore]
  assert {"jvp", "transpose", "batch"} <= set(calls), calls


@internal("batching.primitive_batchers", SIZES, "patch",
          "polyjit's own size primitive refuses jax.vmap")
def _batchers() -> None:
  table = _batching.primitive_batchers
  add = primitive("add")
  assert callable(getattr(table, "__setitem__", None)) and add is not None


@internal("config.int_state(include_in_trace_context=), State.swap_local/set_local, "
          "config.trace_context in jax.jit's trace cache key", SIZES, "read",
          "a retrace of a function whose jax.jit helpers create data-dependent sizes "
          "replays no cached sub-trace (`primitives.uncached_calls`)",
          versions="0.9.2, 0.10.2 (the others not yet audited)")
def _trace_epoch() -> None:
  assert "include_in_trace_context" in _params(_config.int_state)
  assert all(hasattr(_config.State, m) for m in ("swap_local", "set_local"))
  traced: list[int] = []

  @jax.jit
  def helper(v: Any) -> Any:
    traced.append(1)
    return v + 1

  def twice(v: Any) -> Any:  # a state in the trace context: a cache miss
    helper(v)
    with _config.numpy_rank_promotion("allow" if _config.numpy_rank_promotion.value == "raise"
                                      else "raise"):
      return helper(v)
  jax.make_jaxpr(twice)(np.float32(1.0))
  assert len(traced) == 2, traced


# --- jaxprs (reads) -----------------------------------------------------------------

@internal("core.Primitive instances in jax._src modules, get_bind_params, DropVar, "
          "pe.convert_constvars_jaxpr, jaxprs_in_params, core.ShapedArray, "
          "effects.remat_allowed_effects", JAXPRS, "read",
          "the masking interpreter finds, reads and re-binds equations")
def _jaxprs() -> None:
  add = primitive("add")
  assert add is not None and add.name == "add"
  closed = jax.make_jaxpr(lambda p, x: jax.lax.cond(p, lambda y: y, lambda y: -y, x))(True, 1.0)
  eqn = closed.jaxpr.eqns[-1]
  assert len(list(subjaxprs_in_params(bind_params(eqn)))) == 2
  assert not is_dropvar(eqn.outvars[0])
  assert isinstance(_core.DropVar, type)
  assert callable(_pe.convert_constvars_jaxpr)
  assert shaped((2,), np.float32).shape == (2,)
  assert not list(replay_unsafe_effects(closed.jaxpr))
  assert callable(_effects.remat_allowed_effects.filter_not_in)


@internal("lax._convert_element_type(operand, new_dtype, weak_type=)", JAXPRS, "read",
          "a size used as a value keeps the weak type JAX gives it (`dim_as_value`'s "
          "rule, `rules/structural.py`)", versions="0.9.2, 0.10.2, 0.11.0, main (cec06d1)")
def _weak_convert() -> None:
  from .core import convert_weak
  for weak in (True, False):
    out = jax.eval_shape(lambda v: convert_weak(v, np.int32, weak), np.int8(3))
    assert (out.dtype, out.weak_type) == (np.int32, weak), out


@internal("core.shaped_abstractify returns a core.ShapedArray argument as it is "
          "(jax.make_jaxpr, jax.jit(f).trace, jax.eval_shape), its dtype not "
          "canonicalized; lax._convert_element_type to float64 with x64 off", JAXPRS, "read",
          "a float64 jax.Array made under jax.enable_x64() is traced as float64 with x64 "
          "off, as jax.jit traces it (`make_closed_jaxpr`, `jc.zeros`)",
          versions="0.9.2, 0.10.2, 0.11.0, main (cec06d1), 0.12.0.1")
def _abstract_values_as_given() -> None:
  from .core import convert_weak, make_closed_jaxpr, uncanonical
  with jax.enable_x64(False):
    f64 = np.dtype(np.float64)
    assert uncanonical(f64)
    closed = make_closed_jaxpr(lambda x: [x * x], [shaped((2,), f64)])
    assert closed.jaxpr.invars[0].aval.dtype == f64, closed  # type: ignore[attr-defined, unused-ignore]
    assert closed.jaxpr.outvars[0].aval.dtype == f64, closed  # type: ignore[attr-defined, unused-ignore]
    out = jax.eval_shape(lambda v: convert_weak(v, f64, False), np.float32(1))
    assert out.dtype == f64, out


@internal("call_hi_primitive's `_prim` (expand, in_tree, out_tree), Jaxpr.is_high, "
          "pe.lower_jaxpr2 (JAX 0.12 and later; absent before)", JAXPRS, "read",
          "JAX's hi primitives (searchsorted, nonzero) are masked through their "
          "expansion and expanded before polyjit's call is lowered",
          versions="0.12.0.1")
def _hi_primitives() -> None:
  closed = jax.make_jaxpr(lambda a, q: jax.numpy.searchsorted(a, q))(
      np.zeros(3, np.float32), np.zeros(2, np.float32))
  found = [e for e in _all_eqns(closed.jaxpr) if e.primitive.name == "call_hi_primitive"]
  if not found:
    return   # (a JAX without hi primitives: nothing is read)
  prim = found[0].params["_prim"]
  assert callable(prim.expand) and prim.in_tree.num_leaves == 2
  assert prim.out_tree.num_leaves == 1
  assert getattr(closed, "is_high", None) is not None and callable(_pe.lower_jaxpr2)


def _all_eqns(jaxpr: Any) -> list[Any]:
  out = []
  for eqn in jaxpr.eqns:
    out.append(eqn)
    for sub in subjaxprs_in_params(eqn.params):
      out.extend(_all_eqns(sub))
  return out


# --- the call path (reads) ---------------------------------------------------------

@internal("array.ArrayImpl, pxla.batched_device_put(aval, sharding, xs, devices, committed), "
          "config.trace_context, guard_lib.thread_local_state().explicit_device_put/get, "
          "config.transfer_guard_host_to_device, the guard's text \"Disallowed host-to-device transfer\"",
          CALL, "read",
          "the exact type of device arrays; a fast host-to-device copy; pj.jit keys "
          "structures and hot plans by what jax.jit keys on (x64, dtype promotion, ...); "
          "polyjit's own transfers are explicit, as jax.device_put's, so its calls run "
          "under jax.transfer_guard('disallow')",
          versions="0.10.2, main (cec06d1); the transfer guard's flag: 0.9.2 to main")
def _call_path() -> None:
  assert issubclass(_ArrayImpl, jax.Array)
  outside = _config.trace_context()
  with jax.enable_x64(not _config.enable_x64.value):  # x64 is part of it
    assert _config.trace_context() != outside
  assert _config.trace_context() == outside and hash(outside) == hash(_config.trace_context())
  assert _params(_pxla.batched_device_put)[:4] == ["aval", "sharding", "xs", "devices"]
  host = np.arange(3, dtype=np.int32)
  out = host_to_device(host, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  assert type(out) is _ArrayImpl and np.array_equal(np.asarray(out), host)
  # An explicit transfer passes a guard that refuses implicit ones, which it sees.
  # (no compile: a probe must not show up in the user's compile counts)
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  with jax.transfer_guard("disallow"):
    assert transfers_guarded()
    host_to_device(host, sharding)
    try:
      _pxla.batched_device_put(shaped(host.shape, host.dtype), sharding, [host],
                               list(sharding.device_set), False)
    except Exception as e:  # (jaxlib's JaxRuntimeError: its class moved between versions)
      assert transfer_refused(e), str(e)
    else:
      raise AssertionError("an implicit transfer passed jax.transfer_guard('disallow')")
  assert not transfers_guarded()


@internal("config.trace_context: jax_enable_x64, jax_numpy_rank_promotion, "
          "jax_default_matmul_precision, jax_softmax_custom_jvp are part of it",
          JAXPRS, "read",
          "pj.mask's traces (which pj.vmap's padded and packed paths trace through) and "
          "pj.vmap's plans are keyed by what jax.jit keys its traces on, so a trace made "
          "under one configuration never serves a call under another",
          versions="0.10.2, 0.12.0.1")
def _trace_context_keys() -> None:
  outside = _config.trace_context()
  precision = _config.default_matmul_precision.value
  for changed in (jax.enable_x64(not _config.enable_x64.value),
                  _config.numpy_rank_promotion(
                      "raise" if _config.numpy_rank_promotion.value != "raise" else "allow"),
                  _config.default_matmul_precision("float32" if precision != "float32" else "bfloat16"),
                  _config.softmax_custom_jvp(not _config.softmax_custom_jvp.value)):
    with changed:
      assert _config.trace_context() != outside
  assert _config.trace_context() == outside and hash(outside) == hash(_config.trace_context())


@internal("config.config_states, State.value/get_local/swap_local/set_local, config_ext.unset, "
          "the mesh contexts (config or mesh: mesh_context_manager, "
          "abstract_mesh_context_manager, device_context, ...) outside config_states "
          "(a context manager's value is the thread's own)", CALL, "read",
          "a program compiled in a background thread (background_compile, a cost-aware "
          "bucket compiled while calls go on, precompile, a hot shape's program) is "
          "lowered under the configuration of the thread that asked for it",
          versions="0.10.2, 0.12.0.1")
def _caller_config() -> None:
  state = _config.numpy_rank_promotion
  other = "raise" if state.get_global() != "raise" else "allow"   # (what a new thread does not see)
  seen: list[Any] = []

  def read() -> None:
    seen.append(state.value)
  unset: list[bool] = []

  def wrapped_then_unset() -> None:
    wrapped()
    unset.append(state.get_local() is _config.config_ext.unset)   # (put back after)
  with state(other):
    assert state.get_local() == other
    wrapped = in_callers_config(read)
    for target in (read, wrapped_then_unset, read):
      thread = threading.Thread(target=target)
      thread.start()
      thread.join()
  assert seen[0] != other and seen[1] == other and seen[2] == seen[0], seen
  assert unset == [True], unset
  # every thread-local context JAX keys traces on is carried over: the
  # thread's trace context is the submitter's (`jax.set_mesh` is kept outside
  # config_states)
  contexts: list[Any] = []
  with jax.set_mesh(jax.make_mesh((1,), ("polyjit_probe",))), state(other):
    here = _config.trace_context()
    thread = threading.Thread(target=in_callers_config(
        lambda: contexts.append(_config.trace_context())))
    thread.start()
    thread.join()
  assert contexts == [here]


# --- spellings swapped during traces -----------------------------------------------

@internal("numpy.util.promote_dtypes_inexact/promote_dtypes, jax.max_dim, jax.Tracer", SWAPS,
          "read", "the replacement of jnp.interp promotes as JAX does; sizes' max")
def _spelling_reads() -> None:
  # (abstractly: a probe never compiles, since compile counts are user-visible)
  x = jax.eval_shape(lambda v: _np_util.promote_dtypes_inexact(v)[0], shaped((), np.int32))
  assert x.dtype == np.float32 or x.dtype == np.float64
  y = jax.eval_shape(lambda u, v: _np_util.promote_dtypes(u, v)[0], shaped((), np.int32),
                     shaped((), np.float32))
  assert y.dtype == np.float32
  assert max_dim(3, 5) == 5


@internal("DynamicJaxprTrace.process_primitive(self, primitive, tracers, params), "
          "config.eager_constant_folding, core.is_symbolic_dim, jax.ensure_compile_time_eval",
          SWAPS, "swap", "what cannot be evaluated at a symbolic size under "
          "jax.ensure_compile_time_eval is staged in a trace (NumPyro's validation; "
          "`compile_time.py`)")
def _compile_time_staging() -> None:
  assert _params(_pe.DynamicJaxprTrace.process_primitive)[:4] == [
      "self", "primitive", "tracers", "params"]
  assert isinstance(_config.eager_constant_folding.value, bool)
  n, = _export.symbolic_shape("n")
  assert _core.is_symbolic_dim(n) and not _core.is_symbolic_dim(3)


# --- JAX's spellings (its message texts: probes_texts.py) ---------------------------

@internal("the functions at swaps.SWAP_SITES (jnp.searchsorted, lax_numpy.searchsorted, "
          "jnp.interp/linspace/diff, lax.fori_loop, jnp.nonzero, lax_numpy.nonzero, "
          "jnp.flatnonzero/argwhere/where/compress/extract/unique, indexing.rewriting_take, "
          "jnp.take_along_axis)",
          SWAPS, "swap", "replaced by exact spellings for the duration of a symbolic trace")
def _swap_sites() -> None:
  plan = site_plan()
  by_site = {(m.__name__, a): original for m, a, _, original, _ in plan}
  # The private globals are the functions JAX's Array methods and digitize call.
  assert by_site[("jax._src.numpy.lax_numpy", "searchsorted")] is by_site[("jax.numpy", "searchsorted")]
  assert by_site[("jax._src.numpy.lax_numpy", "nonzero")] is by_site[("jax.numpy", "nonzero")]
  assert _params(ARRAY_GETITEM)[:2] == ["arr", "idx"]
  assert _params(CONV_1D) == ["x", "y", "mode", "op", "precision", "preferred_element_type"]
  assert _params(TRIU_SIZE) == ["n", "m", "k"]
  # `_spellings/along_axis.py` passes these positionally (and reads the default
  # of `wrap_negative_indices` where JAX has it)
  along = by_site[("jax.numpy", "take_along_axis")]
  assert by_site[("jax._src.numpy.indexing", "take_along_axis")] is along
  assert _params(along)[:5] == ["arr", "indices", "axis", "mode", "fill_value"], _params(along)


@internal("jax.experimental.serialize_executable.serialize/deserialize_and_load; "
          "Lowered.as_text/in_tree/out_tree/args_info[]._aval/in_avals; Lowered._lowering."
          "compile_args[kept_var_idx, all_args_info, global_out_avals, in/out_shardings, "
          "in/out_layouts]; MeshExecutable._kept_var_idx/_all_args_info/out_avals; "
          "jax.config.values", PROGRAMS, "read",
          "polyjit's programs are kept on disk as serialized executables, keyed by the "
          "lowered text, the calling convention (every argument's type, pruned ones "
          "included, donation, results' weak types, trees) and the configuration, and "
          "checked on load (`compilation_cache.py`, `_caching/disk.py`)",
          versions="0.10.2, main (cec06d1)")
def _serialized_programs() -> None:
  from jax.experimental import serialize_executable as se
  assert "in_tree" in _params(se.deserialize_and_load), _params(se.deserialize_and_load)
  assert isinstance(jax.config.values, dict) and "jax_enable_x64" in jax.config.values
  assert _params(se.serialize) == ["compiled"], _params(se.serialize)
  # (no compile here: a probe must not show up in the user's compile counts;
  # lax, not jnp: `x * 2` traces jnp's multiply first, half of this probe's
  # time in a second process, where it runs at the first program loaded)
  lowered = jax.jit(lambda x, unused: (jax.lax.mul(x, np.float32(2)), 1.0)).lower(
      np.float32(1), np.int8(1))
  assert "func.func" in lowered.as_text()
  assert lowered.in_tree is not None and lowered.out_tree is not None
  args = lowered._lowering.compile_args
  assert {"kept_var_idx", "all_args_info", "global_out_avals", "in_shardings",
          "out_shardings", "in_layouts", "out_layouts"} <= set(args), sorted(args)
  assert set(args["kept_var_idx"]) == {0}, args["kept_var_idx"]  # the unused one pruned
  assert [str(a.dtype) for a in args["all_args_info"].in_avals] == ["float32", "int8"]
  assert [a.weak_type for a in args["global_out_avals"]] == [False, True]
  infos = jax.tree_util.tree_leaves(lowered.args_info)
  assert [(str(i._aval.dtype), i.donated) for i in infos] == [("float32", False), ("int8", False)]
  assert len(jax.tree_util.tree_leaves(lowered.in_avals)) == 2
  # what a loaded program brings back (`MeshExecutable.__init__` sets them)
  names = set(_pxla.MeshExecutable.__init__.__code__.co_names)
  assert {"_kept_var_idx", "_all_args_info", "out_avals"} <= names, names


@internal("_jax.get_tfrt_cpu_client(asynchronous=...); serialize_executable.deserialize_and_load"
          "(backend=, execution_devices=); UnloadedMeshExecutable.host_callbacks/ordered_effects/"
          "unordered_effects/keepalive; Compiled._params.const_args, args_info[]._aval", INLINE, "read",
          "polyjit's small programs run on a synchronous CPU client of its own, loaded from "
          "their serialized bytes (`inline_cpu.py`); where a read fails there, the program "
          "runs on JAX's default client instead (the feature is off, nothing raises)",
          versions="0.10.2, main (cec06d1)")
def _inline_cpu() -> None:
  from jax._src.lib import _jax  # type: ignore[attr-defined, unused-ignore]
  from jax.experimental import serialize_executable as se
  assert "asynchronous" in (_jax.get_tfrt_cpu_client.__doc__ or ""), "no asynchronous option"
  assert {"backend", "execution_devices"} <= set(_params(se.deserialize_and_load))
  fields = set(getattr(_pxla.UnloadedMeshExecutable, "__annotations__", {}))
  assert {"host_callbacks", "ordered_effects", "unordered_effects", "keepalive"} <= fields, fields
  assert callable(_pxla.batched_device_put)


@internal("mlir.core_call_lowering, ad.primitive_jvps/primitive_transposes, "
          "batching.primitive_batchers, batching.AxisData(name, size, spmd_name), "
          "core.no_effects", AD, "patch",
          "the `polyjit_masked_call` primitive: a masked function with forward, "
          "transpose and batching rules (`calls.py`; the batching rule passes the "
          "vmap's axis size, name and spmd_axis_name on)")
def _masked_call_rules() -> None:
  import dataclasses
  from jax._src.interpreters import mlir
  assert {"name", "call_jaxpr"} <= set(_params(mlir.core_call_lowering))
  for table in (_ad.primitive_jvps, _ad.primitive_transposes, _batching.primitive_batchers):
    assert hasattr(table, "__setitem__"), type(table)
  fields = {f.name for f in dataclasses.fields(_batching.AxisData)}
  assert {"name", "size", "spmd_name"} <= fields, fields
  assert _core.no_effects is not None
