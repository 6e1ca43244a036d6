"""Native mode: a padded operand times a weight, batched as one flat contraction.

`x @ w` for one example, `x` padded along its leading (free) axis and `w` a
shared weight, is batched by `jax.vmap` into a contraction of `x[b, n, k]`
with `w[k, m]`, whose transpose for `w` contracts two axes (b and n) of `x`
and of the cotangent. XLA canonicalizes a contraction over several axes by
transposing one operand into [free, contracted] order: a copy of the whole
cotangent per weight, which a hand-written batch, flattened to `x[b*n, k]`,
does not make (its single contracted axis is read in place).

So the masked `dot_general` of such an operand pair is bound as a call node
(`_jax/calls.py`) that is bilinear, with JAX's own derivatives of the dot,
and whose batching over `x` alone merges the batch axis into `x`'s leading
axis (a reshape: free in XLA) instead: the batched program and its
transposes contract one axis, as the hand-written one does. Any other
batching (the weight batched too) is `jax.vmap` of the dot.

Only the case above is bound this way (`applies`): no batch dimensions, the
leading axis of `x` free and dynamic, `w` without padding, both inexact;
`native.step` has zeroed `x`'s padding before (so the dot needs no rule).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from .. import _jax as jc
from .call_nodes import NodeShell


def applies(eqn: jc.JaxprEqn) -> bool:
  (lhs_contract, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
  lhs: Any = eqn.invars[0].aval
  rhs: Any = eqn.invars[1].aval
  return (not lhs_batch and 0 not in lhs_contract and len(lhs.shape) >= 1
          and jc.is_symbolic_dim(lhs.shape[0])
          and not any(jc.is_symbolic_dim(d) for d in rhs.shape)
          and all(jnp.issubdtype(a.dtype, jnp.inexact) for a in (lhs, rhs)))


def bind(eqn: jc.JaxprEqn, x: Any, w: Any) -> Any:
  """`dot_general(x, w)` with `eqn`'s params, bound as a `_Dot` node."""
  params = jc.bind_params(eqn)

  def dot(a: Any, b: Any) -> Any:
    return eqn.primitive.bind(a, b, **params)  # type: ignore[no-untyped-call, unused-ignore]

  node = _Dot((jc.typeof(x), jc.typeof(w)), dot, flat=True)
  out: Any = jc.bind_call(node, [x, w])[0]
  return out


class _Dot(NodeShell):
  """A call node of `f(x, w)`, bilinear; `flat`: `f`'s output axis 0 is
  `x`'s axis 0, so a batch of `x` alone can be merged into it."""

  #: (a contraction: no LAPACK call to order, `lapack_order.py`)
  calls_no_lapack = True

  def __init__(self, in_avals: tuple[Any, ...], f: Callable[[Any, Any], Any], flat: bool
               ) -> None:
    super().__init__(in_avals)
    self.f, self.flat = f, flat

  def impl(self, *args: Any) -> list[Any]:
    return [self.f(*args)]

  def jvp(self, primals: list[Any], tangents: list[Any | None]
          ) -> tuple[list[Any], list[Any | None]]:
    outs = jc.bind_call(self, primals)
    x, w = primals
    tx, tw = tangents
    terms = [*([jc.bind_call(self, [tx, w])[0]] if tx is not None else []),
             *([jc.bind_call(self, [x, tw])[0]] if tw is not None else [])]
    if not terms:
      return outs, [None]
    return outs, [terms[0] if len(terms) == 1 else terms[0] + terms[1]]

  def transpose(self, cts: list[Any], args: list[Any | None]) -> list[Any | None]:
    x, w = args
    if (x is None) == (w is None):
      raise NotImplementedError("a bilinear call is linear in one argument at a time")
    aval = self.in_avals[0 if x is None else 1]
    # (the operand's own dtype: a float64 weight made under `jax.enable_x64()`,
    # used with x64 off, gets a float64 cotangent, as under jax.jit; a
    # jax.ShapeDtypeStruct would make it float32)
    spec = jc.shaped(aval.shape, aval.dtype)
    if x is None:
      (g,) = jax.linear_transpose(lambda a: self.f(a, w), spec)(cts[0])
      return [g, None]
    (g,) = jax.linear_transpose(lambda b: self.f(x, b), spec)(cts[0])
    return [None, g]

  def batch(self, dims: tuple[int | None, ...], avals: tuple[Any, ...], axis_size: int,
            axis_name: Any, spmd_axis_name: tuple[Any, ...] | None) -> "_Dot":
    f = self.f
    if self.flat and dims[0] is not None and dims[1] is None:
      dx = dims[0]

      def merged(x: Any, w: Any) -> Any:
        # (the batch axis merged into x's leading axis: one contraction)
        x = jnp.moveaxis(x, dx, 0)
        y = f(x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]), w)
        return y.reshape(x.shape[0], x.shape[1], *y.shape[1:])

      return _Dot(avals, merged, flat=True)
    vmapped = jax.vmap(f, in_axes=dims, axis_size=axis_size, axis_name=axis_name,
                       spmd_axis_name=spmd_axis_name)
    return _Dot(avals, vmapped, flat=False)
