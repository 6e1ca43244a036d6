"""A bucket's template: a new size in a compiled bucket without binding or tracing.

A template keeps a bucket's plan (`plans.py`) with what a resized plan needs
that depends only on the bucket, worked out once: where each dimension is an
axis size (so the sizes are read off the shapes), the fixed axes, the order
and dtype of the program's size scalars, and which output dims are sizes.
`Template.plan_at` then makes the plan of a never-seen size (`Plan.resized`):
only the padding regions, the size scalars, the output shapes and the waste
are new. One vector with one dimension (the common case) takes a path
without loops. A template exists only where every dynamic axis is a bare
dimension (`Template.of`); an expression (`2*n`) needs binding.

Plans are duck-typed here (this module sits below `plans.py`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _jax as jc
from .._masking import dims as _dims


class Template:
  """A bucket's plan, kept so that a new size in that bucket needs no binding,
  tracing or constraint solving: only its logical sizes change.

  What a resized plan needs that depends only on the bucket is worked out
  here once (`plan_at` runs for every never-seen size): which leaves can
  differ from the padded shapes, the elements of the others, the dtype and
  order of the size scalars, and which output dims are sizes."""
  __slots__ = ("plan", "binding", "variant", "out_dims", "places", "fixed", "dims",
               "size_dtype", "dynamic_leaves", "fixed_elems", "padded_elems", "out_sizes",
               "single", "one_leaf")

  def __init__(self, plan: Any, binding: Any, variant: Any, out_dims: Any,
               places: dict[str, list[tuple[int, int]]], fixed: Any) -> None:
    self.plan = plan
    self.binding = binding
    self.variant = variant              # the sizes it serves must select it
    self.out_dims = out_dims            # per output leaf, its symbolic shape
    self.places = places                # dim -> [(leaf, axis)] where it is the axis size
    # (dim, leaf, axis) when one axis alone has the one dimension (`sizes`'s common case)
    self.single = None
    if len(places) == 1:
      (dim, where), = places.items()
      if len(where) == 1:
        self.single = (dim, *where[0])
    self.fixed = fixed                  # [((leaf, axis), size)] of the fixed axes
    self.dims = tuple(binding.dim_names)  # the order of the program's size arguments
    self.size_dtype = jc.dim_value_dtype()  # theirs, as when the program was built
    padded = plan.key.padded_shapes
    # Leaves without a dimension have their padded shape (`fits`): constant elements.
    self.dynamic_leaves = tuple(sorted({leaf for ps in places.values() for leaf, _ in ps}))
    self.fixed_elems = sum(math.prod(p) for i, p in enumerate(padded)
                           if i not in self.dynamic_leaves)
    self.padded_elems = sum(math.prod(p) for p in padded)
    # Per output leaf, each dim as an int, a dimension's name (a bare size) or
    # its expression; None when no output has a dynamic dim (the plan's own then).
    sizes = tuple(tuple(_out_size(d) for d in dims) for dims in out_dims)
    self.out_sizes = sizes if any(type(d) is not int for o in sizes for d in o) else None
    # (leaf, padded shape, dtype, dim) when the one dimension is the one axis of
    # one vector and no output has a dynamic dim: `plan_at`'s common case
    self.one_leaf = None
    if self.single is not None and self.out_sizes is None and self.single[2] == 0 \
        and len(padded[self.single[1]]) == 1:
      dim, leaf, _ = self.single
      self.one_leaf = (leaf, padded[leaf], plan.dtypes[leaf], dim)

  @classmethod
  def of(cls, plan: Any, binding: Any, variant: Any, out_dims: Any) -> Template | None:
    """The template of `plan`, or None when an axis is an expression (`2*n`,
    `n + 1`) whose sizes only binding can solve."""
    places: dict[str, list[tuple[int, int]]] = {}
    fixed: list[tuple[tuple[int, int], int]] = []
    for i, leaf in enumerate(binding.leaves):
      for axis, d in enumerate(leaf.symbolic_shape):
        if not jc.is_symbolic_dim(d):
          fixed.append(((i, axis), int(d)))
          continue
        form = _dims.linear_form(d)
        if form is None or form[1] != 0 or len(form[0]) != 1 or set(form[0].values()) != {1}:
          return None
        places.setdefault(next(iter(form[0])), []).append((i, axis))
    if set(places) != set(binding.dim_names):
      return None
    return cls(plan, binding, variant, out_dims, places, tuple(fixed))

  def sizes(self, shapes: Any) -> dict[str, int] | None:
    """Each dimension's size read off `shapes`; None when two places disagree
    or a size is 0 (empty: jax.jit's exact program serves it)."""
    single = self.single
    if single is not None:
      dim, leaf, axis = single
      n = shapes[leaf][axis]
      return {dim: n} if n else None
    logical: dict[str, int] = {}
    for dim, places in self.places.items():
      for leaf, axis in places:
        if logical.setdefault(dim, shapes[leaf][axis]) != shapes[leaf][axis]:
          return None
      if logical[dim] == 0:
        return None
    return logical

  def fits(self, shapes: Any) -> bool:
    """Whether the fixed axes of `shapes` are this template's."""
    for (i, a), n in self.fixed:  # (a plain loop: every never-seen size)
      if shapes[i][a] != n:
        return False
    return True

  def plan_at(self, shapes: Any, logical: dict[str, int]) -> Any:
    """The plan of this template's program for `shapes` (that it `fits`)
    with sizes `logical`."""
    plan = self.plan
    one = self.one_leaf
    if one is not None:  # (the loops below, for one vector: no list, no loop)
      i, p, dtype_i, dim = one
      n = shapes[i][0]
      return plan.resized((np.asarray(logical[dim], self.size_dtype),), plan.out_shapes,
                          ((i, p, dtype_i, (slice(0, n),)),) if n != p[0] else (),
                          1.0 - (self.fixed_elems + n) / self.padded_elems, plan.dynamic_outputs)
    padded = plan.key.padded_shapes
    dtypes = plan.dtypes
    pads: list[tuple[int, tuple[int, ...], Any, tuple[slice, ...]]] = []
    elems = self.fixed_elems
    for i in self.dynamic_leaves:  # (plain loops: every never-seen size)
      s = shapes[i]
      p = padded[i]
      if len(s) == 1:
        elems += s[0]
        if s != p:
          pads.append((i, p, dtypes[i], (slice(0, s[0]),)))
      else:
        elems += math.prod(s)
        if s != p:
          pads.append((i, p, dtypes[i], tuple([slice(0, n) for n in s])))
    waste = 1.0 - elems / self.padded_elems if self.padded_elems else 0.0
    dtype = self.size_dtype
    dims = self.dims
    values = ((np.asarray(logical[dims[0]], dtype),) if len(dims) == 1  # (no comprehension)
              else tuple([np.asarray(logical[v], dtype) for v in dims]))
    sizes = self.out_sizes
    if sizes is None:  # no output has a dynamic dim: the template's shapes
      return plan.resized(values, plan.out_shapes, tuple(pads), waste, plan.dynamic_outputs)
    outs = tuple(tuple([d if type(d) is int else logical[d] if type(d) is str
                        else _dims.evaluate_dim(d, logical) for d in o]) for o in sizes)
    dynamic = any(o != p for o, p in zip(outs, plan.padded_out, strict=True))
    return plan.resized(values, outs, tuple(pads), waste, dynamic)


def _out_size(d: Any) -> Any:
  """An output dim for `Template.plan_at`: an int, a dimension's name when it
  is that size alone, else the expression."""
  if not jc.is_symbolic_dim(d):
    return int(d)
  form = _dims.linear_form(d)
  if form is not None and form[1] == 0 and len(form[0]) == 1 and set(form[0].values()) == {1}:
    return next(iter(form[0]))
  return d
