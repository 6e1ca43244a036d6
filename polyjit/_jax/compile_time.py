"""Code under `jax.ensure_compile_time_eval()` at a symbolic size.

`jax.ensure_compile_time_eval()` turns on JAX's eager constant folding: inside
it, an operation none of whose operands is a tracer is evaluated at once
instead of staged. NumPyro runs its argument validation that way
(`Distribution.validate_args`, on with `numpyro.enable_validation()` or
`validate_args=True`): a constraint on a traced parameter gives a traced
result, which NumPyro leaves unchecked (as under `jax.jit`), while constant
parameters are checked at once. At a symbolic size some operations without
tracer operands cannot be evaluated: `dim_as_value` (a size used as a value,
as JAX's indexing does to normalise an index by `x.shape[0]`), whose eager
rule raises, and `jnp.tri(n, n)`, `jnp.arange(n)`, a constant broadcast to
`(n,)`, whose programs have symbolic shapes. So NumPyro's validation of a
`MultivariateNormal` (`jnp.tril(scale_tril)` in its `lower_cholesky` check)
failed under polyjit where it works under `jax.jit`.

While polyjit traces, `jax.ensure_compile_time_eval` (the public name, which
NumPyro and user code call; JAX's own code calls `core.ensure_compile_time_eval`
and is untouched) is swapped (`swaps.SWAP_SITES`) for `staging_sizes`: JAX's
own context manager, which also, for the block's duration, wraps
`DynamicJaxprTrace.process_primitive` (installed by the first such block
over all threads, restored by the last; the wrapper does nothing in a thread
not inside such a block). In such a block an operation JAX evaluates eagerly
that fails, and whose parameters or operands involve a symbolic size, is
staged instead (bound again with constant folding off): its value is the
same as `jax.jit` would compute there if the size were concrete, only
traced. Everything computed from it is then traced too, so a check that
depends on a size is left to the program, as NumPyro does for a traced
parameter. Constants, and anything else that evaluates, are still evaluated
and checked at once; an eager failure without a symbolic size is raised as
before.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from jax._src import config as _config
from jax._src import core as _core
from jax._src.interpreters import partial_eval as _pe

from .core import ClosedJaxpr
from .swaps import register_spellings

_local = threading.local()
_lock = threading.Lock()
_users = 0                       # open staging blocks, all threads
_saved: list[Any] = []           # JAX's process_primitive while wrapped


def _symbolic_in(value: Any, depth: int = 0) -> bool:
  """Whether a primitive's parameter or operand involves a symbolic size."""
  if depth > 6:
    return False
  if _core.is_symbolic_dim(value):  # type: ignore[attr-defined, unused-ignore]
    return True
  if isinstance(value, (tuple, list)):
    return any(_symbolic_in(v, depth + 1) for v in value)
  if isinstance(value, dict):
    return any(_symbolic_in(v, depth + 1) for v in value.values())
  if isinstance(value, ClosedJaxpr):  # (jax.extend's: core's own moved after 0.11)
    value = value.jaxpr
  if isinstance(value, _core.Jaxpr):
    return any(_symbolic_in(getattr(v.aval, "shape", ()), depth + 1)
               for v in [*value.invars, *value.outvars]
               if isinstance(v, _core.Var)) or any(
        _symbolic_in(getattr(v.aval, "shape", ()), depth + 1)
        or _symbolic_in(e.params, depth + 1)
        for e in value.eqns for v in e.outvars)
  shape = getattr(value, "shape", None)
  return isinstance(shape, tuple) and any(_core.is_symbolic_dim(d)  # type: ignore[attr-defined, unused-ignore]
                                          for d in shape)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
  def process_primitive(self: Any, primitive: Any, tracers: Any, params: Any, /) -> Any:
    if not getattr(_local, "depth", 0) or not _config.eager_constant_folding.value:
      return original(self, primitive, tracers, params)
    try:
      return original(self, primitive, tracers, params)
    except Exception:
      if any(isinstance(x, _core.Tracer) for x in tracers) or not (
          _symbolic_in(params) or _symbolic_in(list(tracers))):
        raise
    with _config.eager_constant_folding(False):
      return original(self, primitive, tracers, params)
  setattr(process_primitive, "_polyjit_wrapped", original)
  return process_primitive


@contextlib.contextmanager
def staging_sizes(original: Callable[[], Any]) -> Iterator[None]:
  """`jax.ensure_compile_time_eval()` in which what cannot be evaluated at a
  symbolic size is staged (see the module docstring)."""
  global _users
  with _lock:
    if _users == 0:
      _saved[:] = [_pe.DynamicJaxprTrace.process_primitive]
      _pe.DynamicJaxprTrace.process_primitive = _wrap(_saved[0])  # type: ignore[method-assign]
    _users += 1
  depth = getattr(_local, "depth", 0)
  _local.depth = depth + 1
  try:
    with original():
      yield
  finally:
    _local.depth = depth
    with _lock:
      _users -= 1
      if _users == 0:
        _pe.DynamicJaxprTrace.process_primitive = _saved.pop()  # type: ignore[method-assign]


register_spellings({_core.ensure_compile_time_eval: staging_sizes})
