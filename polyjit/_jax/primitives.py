"""JAX's primitives by name, and polyjit's own size primitives."""
from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable

from jax._src import ad_util as _ad_util
from jax._src import config as _config
from jax._src import core as _core
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir

from .core import JAX_VERSION, JaxprEqn, Primitive

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



# --- data-dependent sizes (issue 14) ------------------------------------------------

def size_primitive(name: str, abstract_eval: Callable[..., Any],
                   refuse_batching: Callable[[], Exception],
                   refuse_lowering: Callable[[], Exception]) -> Primitive:
  """A primitive whose output shape holds a size computed from its operand's
  data (a fresh symbolic dimension passed as a param). It has no
  implementation: only polyjit's masking interpreter evaluates it, so an
  equation of it anywhere else fails loudly; reaching a lowering (a jaxpr JAX
  cached inside a polyjit trace, compiled by plain JAX) raises
  `refuse_lowering()`. Its output is integer, so its derivative is zero.
  `jax.vmap` inside the traced function would need one size per example: it
  raises `refuse_batching()`."""
  prim = Primitive(name)
  # Primitive's methods are unannotated in JAX (a stub gap).
  prim.def_abstract_eval(abstract_eval)  # type: ignore[no-untyped-call, unused-ignore]

  def lower(ctx: Any, *args: Any, **params: Any) -> Any:
    raise refuse_lowering()

  _mlir.register_lowering(prim, lower)

  def batch(*args: Any, **params: Any) -> Any:
    raise refuse_batching()

  _batching.primitive_batchers[prim] = batch

  def jvp(primals: Any, tangents: Any, **params: Any) -> tuple[Any, Any]:
    out = prim.bind(*primals, **params)  # type: ignore[no-untyped-call, unused-ignore]
    # (`ad.Zero.from_primal_value`, used here before, exists in no audited JAX:
    # the probe of this row found it.)
    return out, _ad_util.p2tz(out)  # type: ignore[no-untyped-call, unused-ignore]

  _ad.primitive_jvps[prim] = jvp
  return prim


# --- traces that replay no cached sub-trace -----------------------------------------
#
# JAX caches the jaxpr of a `jax.jit` function (and of custom_vjp/custom_jvp
# functions) by its avals and `config.trace_context()`, and replays it on the
# next call at those avals. A replayed jaxpr that creates a data-dependent
# size repeats that size's name, so two selections would share one size
# (`_masking/data_dependent.py`). A config state of polyjit's own, included in
# the trace context, makes every cache miss while its value is one no earlier
# trace used: `uncached_calls()` gives a fresh value on entry and on each
# `renew()`.

_epoch_lock = threading.Lock()
_epoch_state: Any = None
_epochs = itertools.count(1)   # 0: the default, under which JAX caches as usual


def _epoch() -> Any:
  global _epoch_state
  with _epoch_lock:
    if _epoch_state is None:  # registered at first use: a JAX option of polyjit's own
      from .registry import SIZES, require  # (its probe, at its first use)
      require(SIZES)
      _epoch_state = _config.int_state(
          "polyjit_trace_epoch", 0,
          "polyjit: a value other than 0 keeps JAX's trace caches from replaying "
          "a sub-trace traced under another value (data-dependent sizes).",
          include_in_trace_context=True)
    return _epoch_state


@contextlib.contextmanager
def uncached_calls() -> Iterator[Callable[[], None]]:
  """Within the block, no jaxpr JAX cached before it (or before the last call
  of the `renew` it yields) is replayed: each traced function is traced again."""
  state = _epoch()

  def renew() -> None:
    state.set_local(next(_epochs))

  previous = state.swap_local(next(_epochs))
  try:
    yield renew
  finally:
    state.set_local(previous)


#: After JAX 0.11.0 `closed_call` and `call` are one primitive, `eval_jaxpr`.
EVAL_JAXPR_IS_THE_CALL = getattr(getattr(_core, "closed_call_p", None), "name", None) == "eval_jaxpr"


# --- scan's operand groups ----------------------------------------------------------
#
# JAX up to 0.11.0 names a scan's operand groups in its params (`num_consts`,
# `num_carry`); later JAX packs them into `ft_in`, a FlatTree of (consts,
# carry, xs) (`jax._src.flattree`). The masking rule reads and rewrites them here.

def scan_counts(params: dict[str, Any]) -> tuple[int, int]:
  """(number of consts, number of carries) of a scan equation's params."""
  ft_in = params.get("ft_in")
  if ft_in is None:
    return int(params["num_consts"]), int(params["num_carry"])
  consts, carry, _ = ft_in.unpack()
  return len(consts), len(carry)


def with_scan_counts(params: dict[str, Any], num_consts: int, num_carry: int,
                     num_xs: int) -> dict[str, Any]:
  """`params` (without `jaxpr` and `length`) for a scan with these operand groups."""
  new = dict(params)
  if "ft_in" in new:
    _ft = importlib.import_module("jax._src.flattree")  # (JAX after 0.11.0 only)
    new["ft_in"] = _ft.pack((_ft.nones(num_consts), _ft.nones(num_carry), _ft.nones(num_xs)))
  else:
    new["num_consts"], new["num_carry"] = num_consts, num_carry
  return new


# --- JAX's "hi" primitives (0.12 and later) -----------------------------------------
#
# JAX 0.12 binds some operations (searchsorted, nonzero, ...) as one
# `call_hi_primitive` equation whose `_prim` param is an object that knows its
# own rules, and `_prim.expand(*args)` its implementation in ordinary
# primitives. The masking rule evaluates that expansion, masked.

#: Whether jax.numpy binds hi primitives (JAX 0.12 and later; 0.10 has the
#: primitive but jax.numpy does not bind it, so it gets no rule, nor a row, there).
NUMPY_BINDS_HI_PRIMITIVES = JAX_VERSION >= (0, 12)


def hi_primitive_expansion(params: dict[str, Any]) -> Callable[..., list[Any]]:
  """The implementation of a `call_hi_primitive` equation in ordinary
  primitives, as a function of its flat operands returning a flat list."""
  from .registry import JAXPRS, require
  require(JAXPRS)
  import jax   # (this module otherwise needs no public JAX)
  prim = params["_prim"]

  def expand(*flat: Any) -> list[Any]:
    args = jax.tree_util.tree_unflatten(prim.in_tree, flat)
    return list(prim.out_tree.flatten_up_to(prim.expand(*args)))
  return expand


# --- primitives with rules of polyjit's own (packed block-diagonal products) -------

def ruled_primitive(name: str, impl: Callable[..., Any], abstract_eval: Callable[..., Any],
                    jvp: Callable[..., Any], transpose: Callable[..., Any],
                    batch: Callable[..., Any], multiple_results: bool = False
                    ) -> Any:   # (a Primitive: its bind untyped)
  """A primitive whose value is `impl` (plain JAX: run eagerly and lowered as
  its trace) and whose JVP, transpose and batching are polyjit's: JAX's
  differentiation and `jax.vmap` re-bind it (or call the rules' plain JAX)
  instead of looking inside `impl`. `jvp(primals, tangents, **params)` gets
  symbolic zero tangents as `patches.is_zero_tangent` says; `transpose(ct, *args, **params)`
  gets the linear operands as `is_undefined_primal` says; `multiple_results`:
  `impl` and `abstract_eval` return lists."""
  prim = Primitive(name)
  prim.multiple_results = multiple_results
  # Primitive's methods are unannotated in JAX (a stub gap).
  prim.def_impl(impl)  # type: ignore[no-untyped-call, unused-ignore]
  prim.def_abstract_eval(abstract_eval)  # type: ignore[no-untyped-call, unused-ignore]
  _mlir.register_lowering(prim, _mlir.lower_fun(impl, multiple_results=multiple_results))
  _ad.primitive_jvps[prim] = jvp
  _ad.primitive_transposes[prim] = transpose
  _batching.primitive_batchers[prim] = batch
  return prim


def is_undefined_primal(x: Any) -> bool:
  """A transpose rule's linear operand (`ad.UndefinedPrimal`)."""
  return bool(_ad.is_undefined_primal(x))  # type: ignore[no-untyped-call, unused-ignore]


def shaped_array(shape: Any, dtype: Any) -> Any:
  """An abstract value of `shape` and `dtype` (an abstract evaluation's result)."""
  return _core.ShapedArray(tuple(shape), dtype)
