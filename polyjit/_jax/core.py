"""Accessors for JAX's versions, jaxpr data structures, the call path and
jaxprs (public through `jax.extend.core` where JAX makes them public)."""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Iterable

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
# (an import, not an assignment: on JAX 0.12 it names `Jaxpr` under another
# name, which mypy accepts as a type only when imported)
from jax.extend.core import ClosedJaxpr as ClosedJaxpr  # type: ignore[attr-defined, unused-ignore]
import numpy as np
from jax._src.array import ArrayImpl as _ArrayImpl
from jax._src.interpreters import pxla as _pxla
from jax._src import config as _config
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import mesh as _mesh
from jax._src.lib import guard_lib as _guard_lib
from jax._src.numpy import util as _np_util
from jax._src.interpreters import batching as _batching_internal
from jax._src.interpreters import partial_eval as _pe

# --- JAX versions: every difference between the supported lines is here ------
# Supported: JAX 0.10.x (the whole test suite, on 0.10.2) and 0.9.2 (a fast subset,
# tests/test_old_jax.py). What 0.9 lacks, detected by feature where possible:
# - InconclusiveDimensionOperation and jaxprs_in_params in jax.extend.core (0.10 made
#   them public; 0.9 has them in jax._src.core);
# - the primitives `mulhi`, `stack` and `unstack`: their rules are skipped there
#   (`_core.register`), so they are simply unsupported on 0.9.
JAX_VERSION = tuple(int(re.sub(r"\D.*", "", p) or 0) for p in jax.__version__.split(".")[:3])

try:
  from jaxlib.version import __version_info__ as _JAXLIB_VERSION
except ImportError:  # pragma: no cover
  _JAXLIB_VERSION = (0, 0, 0)
#: jaxlib 0.10.0 up to 0.11.0 split a large CPU LAPACK batch over XLA:CPU's
#: intra-op pool and block on it (`ParallelBatchMap`): independent LAPACK calls
#: can deadlock that pool (see `_masking/lapack_order.py`).
LAPACK_BATCHES_BLOCK_THE_POOL = (0, 10, 0) <= tuple(_JAXLIB_VERSION)[:3] < (0, 11, 1)
PRIMITIVES_NEWER_THAN_THIS_JAX = (frozenset({"mulhi", "stack", "unstack"})
                                  if JAX_VERSION < (0, 10) else frozenset())
_InconclusiveDimensionOperation = getattr(jex_core, "InconclusiveDimensionOperation",
                                          None) or _core.InconclusiveDimensionOperation
_jaxprs_in_params = getattr(jex_core, "jaxprs_in_params", None) or _core.jaxprs_in_params

# --- jaxpr data structures (public through jax.extend.core) -----------------

Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn
Literal = jex_core.Literal
Primitive = jex_core.Primitive
Tracer = jax.core.Tracer
max_dim = jax.core.max_dim
min_dim = jax.core.min_dim
InconclusiveDimensionOperation = _InconclusiveDimensionOperation

# --- the call path ------------------------------------------------------------

# The concrete type of a `jax.Array` on the device: `pj.jit`'s hot path keys a
# call by `type(x) is ARRAY_TYPE` (an exact type test is much cheaper than
# `isinstance(x, jax.Array)`, which goes through an ABC).
ARRAY_TYPE = _ArrayImpl


# What `jax.jit` keys its caches on besides the arguments: every configuration
# state that changes a trace (`jax_enable_x64`, `jax_numpy_dtype_promotion`,
# `jax_numpy_rank_promotion`, `jax_default_matmul_precision`,
# `jax_softmax_custom_jvp`, `jax.disable_jit()`, mesh contexts, ...), as one
# hashable tuple of the values in effect in this thread (C++, ~0.1 us). Every
# cache of polyjit's that holds a trace is keyed by it too: pj.jit's
# structures and hot plans, pj.mask's traces (`Masked._structure`, which
# pj.vmap's padded and packed paths trace through), pj.vmap's plans.
trace_context: Callable[[], tuple[Any, ...]] = _config.trace_context

# The thread-local contexts JAX keeps outside `config_states`, each in its
# trace context or jit key: `with mesh:`, `jax.set_mesh` (its abstract mesh
# and devices), `compute_on`, `set_xla_metadata`. A program lowered in a
# thread without `jax.set_mesh`'s raised "Please enter your `jit` into a mesh
# context". (`jax._src.mesh` on JAX 0.12, `jax._src.config` before.)
_CONTEXTS: tuple[Any, ...] = tuple(
    {id(c): c for c in (getattr(module, name, None) for module in (_config, _mesh)
                        for name in ("mesh_context_manager", "abstract_mesh_context_manager",
                                     "device_context", "compute_on_context_manager",
                                     "xla_metadata_context_manager"))
     if c is not None}.values())


def in_callers_config(fun: Callable[[], Any]) -> Callable[[], Any]:
  """`fun`, to be run in another thread under the configuration in effect in
  this one now. JAX keeps a context manager's value (`with
  jax.enable_x64():`, `jax.numpy_rank_promotion("raise")`, `jax.set_mesh`,
  ...) per thread, so a compile thread would otherwise lower a program under
  the global values: another program than this thread's trace (or none:
  float64 leaves under x64 off). `jax.config.update`'s values are global, and
  read when the compile starts they may no longer be the submitter's: a
  compile queued behind others, then `jax.config.update("jax_enable_x64",
  True)`, lowered an x64 program under the key of the call that asked for it
  under x64 off (its next call raised JAX's TypeError). So every option's
  value in effect now, thread-local or global, is set as the compile
  thread's own for the run of `fun`, and put back after: in that thread
  `trace_context()` is this one's (the probe checks it). Read at submission
  (~10 us, once per background compile)."""
  values = [(state, state.value) for state in (*_config.config_states.values(), *_CONTEXTS)]

  def run() -> Any:
    previous = [(state, state.swap_local(value)) for state, value in values]
    try:
      return fun()
    finally:
      for state, value in reversed(previous):
        state.set_local(value)
  return run


def jit_disabled() -> bool:
  """Whether `jax.disable_jit()` is in effect (then `pj.jit` runs `fun`
  eagerly, as `jax.jit` does; compiled programs refuse to run under it)."""
  return bool(getattr(jax.config, "jax_disable_jit"))  # (the stub lacks the flag)


def default_device() -> Any:
  """The device `jax.jit` runs a call of uncommitted arguments on:
  `jax_default_device`'s (`jax.default_device(...)` sets it) where it names
  one, else the first device."""
  chosen = getattr(jax.config, "jax_default_device")   # (a setting mypy's stubs lack)
  if chosen is None:
    return _first_device()
  # (devices are one object each: callers compare them with `is`)
  return jax.devices(chosen)[0] if isinstance(chosen, str) else chosen


@functools.lru_cache(maxsize=None)
def _first_device() -> Any:
  return jax.devices()[0]


def default_sharding() -> jax.sharding.SingleDeviceSharding:
  """Where `jax.jit` puts an uncommitted argument (a NumPy array)."""
  return _sharding_on(default_device())


@functools.lru_cache(maxsize=None)
def _sharding_on(device: Any) -> jax.sharding.SingleDeviceSharding:
  from .registry import CALL, require  # (the call path's probes, at its first use)
  require(CALL)
  return jax.sharding.SingleDeviceSharding(device)


def host_to_device(host: np.ndarray[Any, Any], sharding: jax.sharding.Sharding,
                   weak_type: bool = False) -> jax.Array:
  """`host` copied to the device of a single-device `sharding`, without
  `jax.device_put`'s per-call overhead (about 30 us against 5 us); other
  shardings go through `jax.device_put` (to the default device). An
  explicit transfer, as `jax.device_put`'s: allowed under
  `jax.transfer_guard("disallow")`. `weak_type`: the array is weakly typed
  (a slice of a weakly typed output keeps its type, as under `jax.jit`)."""
  if isinstance(sharding, jax.sharding.SingleDeviceSharding):
    aval = _core.ShapedArray(host.shape, host.dtype, weak_type=weak_type)
    out: jax.Array = explicitly(_pxla.batched_device_put, aval, sharding, [host],
                                list(sharding.device_set), False)
    return out
  placed: jax.Array = jax.device_put(host)
  return placed


# JAX's transfer guard tells explicit transfers (`jax.device_put`,
# `jax.device_get`) from implicit ones (a NumPy array passed to a program) by a
# thread-local flag that `jax.device_put` sets around its work
# (`config.explicit_device_put_scope`); polyjit sets the same flag around its
# own transfers (size scalars, its host buffers, the inline client's
# crossings), so that its calls run under `jax.transfer_guard("disallow")` as
# `jax.jit`'s do. Set directly: 0.16 us against the context manager's 1 us.
_guard_state = _guard_lib.thread_local_state


def explicitly(fn: Callable[..., Any], *args: Any) -> Any:
  """`fn(*args)` with the host-to-device transfers it makes counted as
  explicit (as inside `jax.device_put`)."""
  state = _guard_state()
  prev = state.explicit_device_put
  state.explicit_device_put = True
  try:
    return fn(*args)
  finally:
    state.explicit_device_put = prev


def explicitly_read(fn: Callable[..., Any], *args: Any) -> Any:
  """`fn(*args)` with the device-to-host reads it makes counted as explicit
  (as inside `jax.device_get`)."""
  state = _guard_state()
  prev = state.explicit_device_get
  state.explicit_device_get = True
  try:
    return fn(*args)
  finally:
    state.explicit_device_get = prev


def transfers_guarded() -> bool:
  """Whether JAX's host-to-device transfer guard is set in this thread
  (`jax.transfer_guard(...)` or its flags, other than "allow")."""
  value = _config.transfer_guard_host_to_device.value
  return value is not None and value != "allow"


def guard_user_uploads(values: Iterable[Any]) -> None:
  """Puts the user's host values among `values` (NumPy arrays, scalars: what
  `jax.jit` uploads implicitly) to JAX's transfer guard as the implicit
  transfers `jax.jit` makes of them: refused under "disallow", logged under
  "log". polyjit uploads its padded copies of them explicitly (its host
  buffers), so without this the user's guard would never see them. Called
  only while a guard is set (`transfers_guarded`); each upload is dropped."""
  sharding: Any = None
  for v in values:
    if isinstance(v, (jax.Array, jax.core.Tracer)) or not hasattr(v, "__array__") \
        and not isinstance(v, (int, float, complex, bool)):
      continue
    host = np.asarray(v)
    if host.dtype.kind not in "biufc":
      continue
    host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype), copy=False)
    if sharding is None:
      sharding = jax.sharding.SingleDeviceSharding(default_device())
    _pxla.batched_device_put(_core.ShapedArray(host.shape, host.dtype), sharding, [host],
                             list(sharding.device_set), False)


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
  """The abstract value (shape, dtype, weak type) of a concrete argument, or
  of an example made by `shaped` (kept as it is: see `make_closed_jaxpr`)."""
  if isinstance(x, _core.ShapedArray):
    return x
  return jax.typeof(x)


def make_closed_jaxpr(fun: Callable[..., Any], avals: list[Any]) -> ClosedJaxpr:
  """Traces `fun(*flat_args) -> list` to a ClosedJaxpr at the given avals.

  An aval of a dtype that this x64 mode would not make (float64 or int64 with
  x64 off: a `jax.Array` made under `jax.enable_x64()`) is traced as it is,
  as jax.jit traces such an array: the jaxpr takes the float64 value and
  converts it where JAX's own functions would (`jnp.sum`, `x * 0.1`) or
  keeps it (`lax.add`, `x * x`). A `jax.ShapeDtypeStruct` would make it
  float32, and the masked program would then take float32 where the data
  holds float64. Every other aval goes through `jax.ShapeDtypeStruct` (a
  symbolic shape, a weak type)."""
  # jax.ShapeDtypeStruct's __init__ is unannotated in JAX (a stub gap).
  specs = [shaped(a.shape, a.dtype, a.weak_type) if uncanonical(a.dtype) else
           jax.ShapeDtypeStruct(  # type: ignore[no-untyped-call, unused-ignore]
               a.shape, a.dtype, weak_type=a.weak_type)
           for a in avals]
  # (jax.make_jaxpr takes an abstract value as it is: `core.shaped_abstractify`)
  return jax.make_jaxpr(fun)(*specs)


_canonical_dtypes: dict[tuple[Any, bool], np.dtype[Any]] = {}


def canonical_dtype(dtype: Any) -> np.dtype[Any]:
  """JAX's dtype for a NumPy dtype (float64 -> float32 without x64), cached
  per x64 mode (`jax.enable_x64()` may change it between calls): the hot
  path of every pj.jit call (`_jit/args.aval_key`)."""
  key = (dtype, bool(jax.config.jax_enable_x64))  # type: ignore[attr-defined, unused-ignore]
  out = _canonical_dtypes.get(key)
  if out is None:
    out = _canonical_dtypes[key] = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
  return out


def uncanonical(dtype: Any) -> bool:
  """Whether `dtype` is one that this x64 mode would not make: a 64-bit
  NumPy dtype with x64 off (an array made under `jax.enable_x64()`; with x64
  on every NumPy dtype is its own canonical one)."""
  return isinstance(dtype, np.dtype) and dtype != canonical_dtype(dtype)


def zeros(shape: Any, dtype: Any) -> Any:
  """Zeros of `dtype` as it is: float64 with x64 off too (a jaxpr traced at a
  `jax.Array` made under `jax.enable_x64()`: `make_closed_jaxpr`), where
  `jnp.zeros` makes float32."""
  z = jnp.zeros(shape, dtype)
  return convert_weak(z, dtype, False) if uncanonical(dtype) else z


def convert_weak(x: Any, dtype: Any, weak_type: bool) -> Any:
  """`x` converted to `dtype` with the weak type given: a size used as a value
  (`dim_as_value`) is weakly typed in JAX, as a Python int is, and
  `lax.convert_element_type` (the public one) always gives a strong type."""
  from jax._src.lax import lax as _lax_internal
  return _lax_internal._convert_element_type(x, np.dtype(dtype), weak_type=weak_type)


def shaped(shape: Any, dtype: Any, weak_type: bool = False) -> Any:
  """An abstract array value with the given (possibly symbolic) shape."""
  return _core.ShapedArray(tuple(shape), dtype, weak_type=weak_type)


def replay_unsafe_effects(jaxpr: Jaxpr) -> list[Any]:
  """The effects of `jaxpr` that must not run twice: those `jax.checkpoint`
  refuses to replay (an io_callback's), unlike debug prints."""
  return _effects.remat_allowed_effects.filter_not_in(jaxpr.effects)



def promote_dtypes_inexact(*args: Any) -> Any:
  """JAX's numpy promotion to an inexact dtype, weak types included (the
  replacement of `jnp.interp` must promote exactly as JAX's does)."""
  return _np_util.promote_dtypes_inexact(*args)


def promote_dtypes(*args: Any) -> Any:
  """JAX's numpy promotion to a common dtype (`jnp.convolve` with a
  `preferred_element_type`)."""
  return _np_util.promote_dtypes(*args)


def custom_jvp_rule_jaxpr(eqn: JaxprEqn, zeros: list[bool]
                          ) -> tuple[ClosedJaxpr, list[bool]]:
  """The JVP of a `custom_jvp_call` equation with its custom rule, as JAX
  traces it (`custom_derivatives.lift_jvp`): a jaxpr from (the non-const
  inputs, the tangents not in `zeros`) to (outputs, the tangents not in the
  returned out zeros), at the equation's avals."""
  params = eqn.params
  thunk = params.get("jvp_jaxpr_fun", params.get("jvp_jaxpr_thunk"))
  if thunk is None:
    raise NotImplementedError("this JAX's custom_jvp_call has no JVP jaxpr param")
  call = getattr(thunk, "call_wrapped", thunk)
  jaxpr, consts, out_zeros = call(*zeros)
  return ClosedJaxpr(jaxpr, consts), list(out_zeros)


def vmap_trace_of(x: Any) -> Any:
  """The `jax.vmap` trace that maps `x` along an axis, or None (not mapped by
  the innermost vmap that sees it, or not traced)."""
  if (isinstance(x, _batching_internal.BatchTracer)
      and isinstance(x.batch_dim, int)):   # (else `NotMapped`)
    return x._trace
  return None
