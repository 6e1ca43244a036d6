"""`pj.shapecheck`: check a function's output shapes when it is decorated.

The function is traced once with symbolic shapes (no data, no compile), the
way `pj.mask` traces it, and the symbolic output shapes are compared with the
declared ones: `@pj.shapecheck(["n", "(n, m)"], "(n, m)")`. Input specs name
every dim (there is no argument to take a "_" from); a leaf is a spec string
(float32) or a (spec, dtype) pair.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

import jax
import jax.numpy as jnp

from .. import _jax as jc
from .._masking import spec as _spec
from .._jit.annotations import check_annotated
from .._masking.errors import ShapeError
from .._masking.mask import check_out_shape
from .._masking.trace import trace_flat

F = TypeVar("F", bound=Callable[..., Any])


def _is_leaf(x: object) -> bool:
  return (x is None or isinstance(x, str)
          or (isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)))


_FROM_ANNOTATIONS: Any = object()


def shapecheck(in_shapes: Sequence[Any] | Callable[..., Any] | None = None,
               out_shape: Any = _FROM_ANNOTATIONS, *,
               constraints: Sequence[str] = ()) -> Callable[..., Any]:
  """A decorator that checks `fun`'s output shapes symbolically, then returns it.

  `@pj.shapecheck(in_shapes, out_shape)` checks against the given specs;
  `@pj.shapecheck` (or `pj.shapecheck(f)`) against `f`'s jaxtyping
  annotations: argument shapes from the parameters', the result against the
  return annotation.
  """
  if out_shape is _FROM_ANNOTATIONS:
    if callable(in_shapes):
      return check_annotated(in_shapes, constraints)
    if in_shapes is None:
      return lambda fun: check_annotated(fun, constraints)
    raise TypeError("pj.shapecheck(in_shapes, out_shape): out_shape is missing (use "
                    "@pj.shapecheck alone to check jaxtyping annotations).")
  if in_shapes is None or callable(in_shapes):
    raise TypeError("pj.shapecheck(in_shapes, out_shape): in_shapes must be a sequence of "
                    "specs, one per argument.")
  specs: Sequence[Any] = in_shapes
  scope = _spec.fresh_scope(constraints)

  def decorate(fun: F) -> F:
    args = [jax.tree.map(lambda leaf: _abstract(leaf, scope), spec, is_leaf=_is_leaf)
            for spec in specs]
    leaves, in_tree = jax.tree.flatten(args)
    box: list[Any] = []

    def flat_fun(*flat: Any) -> list[Any]:
      out, out_tree = jax.tree.flatten(fun(*jax.tree.unflatten(in_tree, flat)))
      box.append(out_tree)
      return out

    traced = trace_flat(flat_fun, [jc.shaped(a.shape, a.dtype) for a in leaves], ())
    traced.out_tree = box[0]
    try:
      check_out_shape(out_shape, traced, scope)
    except ShapeError as e:
      raise ShapeError(f"{getattr(fun, '__name__', 'function')}: {e} (argument specs: "
                       f"{list(specs)!r})") from None
    return fun

  return decorate


def _abstract(leaf: Any, scope: Any) -> jax.ShapeDtypeStruct:
  spec, dtype = (leaf, jnp.float32) if isinstance(leaf, str) else leaf
  try:
    shape = jc.symbolic_shape(spec, scope=scope)
  except Exception as e:
    raise ShapeError(f"shapecheck: cannot use the spec {spec!r}: {e} (every dim needs "
                     "a name or a number here)") from None
  # jax.ShapeDtypeStruct's constructor carries no annotations (strict only)
  return jax.ShapeDtypeStruct(tuple(shape), dtype)  # type: ignore[no-untyped-call, unused-ignore]
