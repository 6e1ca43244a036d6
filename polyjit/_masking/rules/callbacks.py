"""Host callbacks see unpadded values: slice on the host, call, pad back.

A callback's Python function was written for unpadded arrays, like the rest
of `fun`. Given padded ones it would compute on garbage, and return results of
the padded shape only by accident. So a callback with a dynamic axis is
re-issued with a host function (`_Unpadded`) that also receives the logical
sizes: it slices every operand to its unpadded shape, calls the user's
function, checks that the results have the unpadded shapes and dtypes the
callback declared (as JAX checks the declared ones), and pads them back. The
user's function sees exactly the values the unpadded program would pass it.

* `pure_callback`, `io_callback`: as above. Under `jax.vmap` of the masked
  function the host function runs once per example (`vmap_method=
  "sequential"`), since every example has its own sizes. An io_callback runs
  once per call, in program order, as unpadded; gradients of the masked
  function replay its forward pass and so refuse io_callback (`_masking/mask.py`).
* `debug_callback` (`jax.debug.callback`), `debug_print` (`jax.debug.print`):
  issued as a `jax.debug.callback` whose host function re-binds the original
  primitive on the unpadded values, so JAX formats and prints them as usual.
  Under `jax.grad` of a masked function they run twice (the forward pass and
  its replay), as JAX allows for debug effects under `jax.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import dims as _dims
from ... import _jax as jc
from ..core import RuleContext, register


@dataclasses.dataclass(frozen=True)
class _Unpadded:
  """A host function: unpads its operands, calls `call`, pads the results.

  Frozen, so equal callbacks compare equal and JAX's caches of compiled
  callback programs hit from one call to the next.
  """
  call: Callable[..., Any]
  dim_names: tuple[str, ...]
  in_shapes: tuple[Any, ...]          # symbolic shapes of the operands
  out_shapes: tuple[Any, ...]         # symbolic shapes of the results
  out_padded: tuple[Any, ...]         # their padded shapes
  out_dtypes: tuple[Any, ...]

  def __call__(self, *flat: Any) -> Any:
    k = len(self.dim_names)
    sizes = {name: int(v) for name, v in zip(self.dim_names, flat[:k], strict=True)}
    args = [_unpad(x, shape, sizes) for x, shape in zip(flat[k:], self.in_shapes, strict=True)]
    outs = self.call(*args)
    if not self.out_shapes:
      return ()
    return tuple(_pad_result(i, y, shape, padded, dtype, sizes) for i, (y, shape, padded, dtype)
                 in enumerate(zip(outs, self.out_shapes, self.out_padded, self.out_dtypes, strict=True)))


def _logical(shape: Any, sizes: Any) -> tuple[int, ...]:
  return tuple(_dims.evaluate_dim(d, sizes) for d in shape)


def _unpad(x: Any, shape: Any, sizes: Any) -> Any:
  if not any(jc.is_symbolic_dim(d) for d in shape):
    return x
  index = tuple(slice(0, s) for s in _logical(shape, sizes))
  if isinstance(x, jax.Array):  # the type and device the callback would get
    return jax.device_put(np.asarray(x)[index], x.sharding)
  return np.asarray(x)[index]


def _pad_result(i: Any, y: Any, shape: Any, padded: Any, dtype: Any, sizes: Any) -> Any:
  y = np.asarray(y)
  y = y.astype(jax.dtypes.canonicalize_dtype(y.dtype), copy=False)
  logical = _logical(shape, sizes)
  if y.shape != logical or y.dtype != dtype:
    raise RuntimeError(
        f"Incorrect output for return value #{i} of a callback in a masked "
        f"function: expected {np.dtype(dtype).name}{list(logical)} (the unpadded "
        f"shape), got {y.dtype.name}{list(y.shape)}")
  out = np.zeros(padded, dtype)
  out[tuple(slice(0, s) for s in logical)] = y
  return out


def _host(ctx: RuleContext, call: Any, out_avals: Any=()) -> _Unpadded:
  return _Unpadded(
      call=call, dim_names=ctx.env.dim_names,
      in_shapes=tuple(tuple(a.shape) for a in ctx.in_avals),
      out_shapes=tuple(tuple(a.shape) for a in out_avals),
      out_padded=tuple(ctx.padded_shape(a.shape) for a in out_avals),
      out_dtypes=tuple(a.dtype for a in out_avals))


def _sizes(ctx: RuleContext) -> list[Any]:
  return [jnp.asarray(v, jc.dim_value_dtype()) for v in ctx.logical_operands()]


@register("pure_callback", "io_callback")
def _result_callback(ctx: RuleContext, *args: Any, callback: Any, result_avals: Any,
                     **params: Any) -> list[Any]:
  host = _host(ctx, callback, result_avals)
  padded = tuple(jc.shaped(p, a.dtype) for p, a in zip(host.out_padded, result_avals, strict=True))
  if "vmap_method" in params:  # one example, with its own sizes, at a time
    params = dict(params, vmap_method="sequential")
  return ctx.bind(*_sizes(ctx), *args, callback=host, result_avals=padded, **params)


@register("debug_callback")
def _debug_callback(ctx: RuleContext, *args: Any, callback: Any, **params: Any) -> list[Any]:
  return ctx.bind(*_sizes(ctx), *args, callback=_host(ctx, callback), **params)


@register("debug_print")
def _debug_print(ctx: RuleContext, *args: Any, ordered: Any, partitioned: Any,
                 **params: Any) -> list[Any]:
  reprint = functools.partial(ctx.primitive.bind, ordered=ordered,
                              partitioned=partitioned, **params)
  jax.debug.callback(ordered=ordered, partitioned=partitioned)(
      _host(ctx, reprint), *_sizes(ctx), *args)
  return []
