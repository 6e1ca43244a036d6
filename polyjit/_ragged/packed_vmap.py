"""`pj.vmap` over a `PackedRagged`: the packed evaluation, or the padded one.

`pj.vmap(fun)(params, packed)` traces `fun` once for one example with a
symbolic length (`pj.mask`'s trace, the dim named as `pj.vmap` names it) and
evaluates it on the packed rows (`packed_eval.py`): per-example outputs come
back stacked in the examples' order, length-dependent outputs as a `pj.Ragged`
(one padded row per example, as over the padded batch: the same type,
`.lengths` and `to_list()`), shared-parameter gradients through JAX's own derivative
of the packed evaluation (exact by the tail invariant there).

Empty examples (a batch built with some) have no token in the rows: the
packed evaluation keeps its values for them out of every derivative
(`Layout.off_empty`), and their outputs are `fun`'s at size 0, the trace the
padded `pj.vmap` takes for them (`_empty_examples`).

When the packed layout cannot run `fun` exactly (`Unpackable`: a loop whose
step reads the whole sequence, a `custom_vjp`, size comparisons that give
`fun` several traces), the call runs as `pj.vmap` over the
padded batch instead (one row per example, `row_length` long), with a
`pj.PerformanceWarning` that names the op and the user's line: slower,
never wrong.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc
from .._masking import empty as _empty, size_range as _size_range
from .._masking.errors import PerformanceWarning, ShapeError, warn_user_code
from .._masking.mask import Masked
from .arguments import describe, example_struct, leading_dynamic_axes, leaf_axes
from . import (packed_contractions, packed_custom, packed_pair_shapes,  # noqa: F401
               packed_pairs, packed_remat, packed_scan)   # (they fill rule tables)
from .packed_eval import eval_packed
from .packed_values import EXAMPLE, PAIR, SHARED, TOKEN, UNPACKED, Unpackable, V
from .packed_layout import Layout
from .packing import PackedRagged, is_packed
from .ragged import Ragged

DIM = "n0_0"


def _spec() -> str:
  return f"({DIM}, ...)"


class PackedRunner:
  """The packed path of one `pj.vmap`ped function (cached per structure)."""

  def __init__(self, fun: Callable[..., Any], in_axes: Any, out_axes: Any,
               unpacked: Callable[..., Any]) -> None:
    self.fun = fun
    self.in_axes = in_axes
    self.out_axes = out_axes
    self.unpacked = unpacked    # pj.vmap's own run over padded arguments
    self._masked: dict[Any, Masked] = {}
    self.jitted = jax.jit(self.run)

  def run(self, *args: Any) -> Any:
    flat, treedef = jax.tree.flatten(args, is_leaf=is_packed)
    axes = leaf_axes(self.in_axes, args, len(flat), is_packed, "a pj.PackedRagged")
    packed = [x for x in flat if is_packed(x)]
    if len(packed) != 1 or any(isinstance(x, Ragged) for x in flat):
      raise TypeError("pj.vmap over packed examples takes one PackedRagged argument "
                      "(put every per-token array of an example in it: "
                      "pj.Ragged.from_list([(tok, tgt), ...], packing=...)) and no pj.Ragged.")
    batch = packed[0]
    for x, a in zip(flat, axes, strict=True):
      if is_packed(x) and a != 0:
        raise TypeError("pj.vmap maps a PackedRagged over its examples: its in_axes must be 0.")
      if not is_packed(x) and a is not None and np.shape(x)[a] != batch.num_examples:
        raise ValueError(f"an argument has {np.shape(x)[a]} entries on its mapped axis "
                         f"{a}, but the packed batch holds {batch.num_examples} examples.")
    try:
      return self._packed(treedef, flat, axes, batch)
    except Unpackable as e:
      warn_user_code(
          f"pj.vmap({getattr(self.fun, '__name__', self.fun)}) runs this packed batch "
          f"unpacked, one padded row per example (exact, but without packing's "
          f"savings): {e}.\nWhat to do: pass the batch unpacked (no packing=) to "
          "silence this, or write that step with ops that have packed rules "
          "(docs/guide/packing.md lists them).", PerformanceWarning)
      return self._unpacked(treedef, flat, batch)

  # --- packed --------------------------------------------------------------

  def _masked_for(self, treedef: Any, packed: tuple[bool, ...]) -> Masked:
    """`pj.mask(fun)` with the packed argument's leaves of length `n0_0`."""
    masked = self._masked.get((treedef, packed))
    if masked is None:
      specs = [_spec() if p else None for p in packed]
      masked = self._masked[(treedef, packed)] = Masked(self.fun,
                                                        list(treedef.unflatten(specs)))
    return masked

  def _packed(self, treedef: Any, flat: list[Any], axes: list[Any], batch: PackedRagged
              ) -> Any:
    masked = self._masked_for(treedef, tuple(is_packed(x) for x in flat))
    row_length = batch.row_length
    def struct(a: Any) -> Any:   # (its dtype as it is: `arguments.example_struct`)
      t = jc.typeof(a)
      return jc.shaped((row_length, *a.shape[2:]), t.dtype, t.weak_type)
    example = [jax.tree.map(struct, x.data) if is_packed(x)
               else example_struct(x, a, None) for x, a in zip(flat, axes, strict=True)]
    example_args = list(treedef.unflatten(example))
    variants = masked.variants(example_args)
    for variant in variants:   # an output pj.vmap cannot return: its error, run packed or not
      _check_outputs(variant.traced)
    if len(variants) > 1:
      raise Unpackable(None, f"{getattr(self.fun, '__name__', 'the function')} compares "
                       "the example's length, so each example may take another trace")
    traced = variants[0].traced
    layout = Layout(DIM, (batch.lengths, batch.starts, batch.segments, batch.positions),
                    batch.rows, row_length, may_be_empty=not batch.nonempty)
    tokens = layout.tokens
    inputs: list[V] = [V(SHARED, c) for c in traced.consts]
    for x, a in zip(flat, axes, strict=True):
      if is_packed(x):
        for leaf in jax.tree.leaves(x.data):
          val = jnp.reshape(leaf, (tokens, *leaf.shape[2:]))
          dim = traced.in_avals[len(inputs)].shape[0]   # (the symbolic n0_0)
          inputs.append(V(TOKEN, layout.select(val, 0, dim), 0, dim, guarded=True))
      elif a is None:
        inputs.append(V(SHARED, x))
      else:
        inputs.append(V(EXAMPLE, jnp.moveaxis(jnp.asarray(x), a, 0)))
    outs = [self._output(o, layout, batch)
            for o in eval_packed(traced.jaxpr, [], inputs, layout)]
    if layout.may_be_empty:
      outs = _empty_examples(masked, example_args, flat, axes, traced, outs, layout)
    return jax.tree.unflatten(traced.out_tree, outs)

  def _output(self, o: V, layout: Layout, batch: PackedRagged) -> Any:
    if self.out_axes != 0:
      raise TypeError("pj.vmap over packed examples supports out_axes=0 only.")
    if o.kind == EXAMPLE:
      return o.val
    if o.kind == SHARED:
      return jnp.broadcast_to(o.val, (layout.examples, *jnp.shape(o.val)))
    if o.kind == PAIR or (o.kind == UNPACKED and o.dim is None):
      raise Unpackable(None, "an output with several axes along the example")
    if o.axis != 0:
      raise Unpackable(None, "an output whose length-dependent axis is not its first")
    # as over the padded batch: a pj.Ragged, one row per example, padded to the
    # size at row_length (the unpacked batch's own when row_length is its bucket)
    data = o.val if o.kind == UNPACKED else layout.unpack(o.val, 0, o.dim)
    return Ragged._make(data, layout.size(o.dim), None, 1)

  # --- unpacked --------------------------------------------------------------

  def _unpacked(self, treedef: Any, flat: list[Any], batch: PackedRagged) -> Any:
    layout = Layout(DIM, (batch.lengths, batch.starts, batch.segments, batch.positions),
                    batch.rows, batch.row_length)
    def unpack(leaf: Any) -> Any:
      tokens = jnp.reshape(leaf, (layout.tokens, *leaf.shape[2:]))
      return layout.unpack(tokens, 0, DIM)
    padded = [Ragged._make(jax.tree.map(unpack, x.data), x.lengths, None, 1, x.nonempty)
              if is_packed(x) else x for x in flat]
    return self.unpacked(*treedef.unflatten(padded))


def _check_outputs(traced: Any) -> None:
  """The ShapeError the padded `pj.vmap` raises for an output it cannot
  return (a length-dependent axis after a fixed one), raised before the
  packed evaluation: it would otherwise refuse the output (`Unpackable`) and
  warn that the call runs unpacked, only for that run to raise it."""
  outs = jax.tree.unflatten(traced.out_tree, list(traced.out_avals))
  for path, aval in jax.tree_util.tree_flatten_with_path(outs)[0]:
    try:
      leading_dynamic_axes(aval, describe(path, "output"))
    except ShapeError as e:
      e.add_note(f"(pj.vmap names the length of the packed examples {DIM}.)")
      raise


def _empty_examples(masked: Masked, example_args: list[Any], flat: list[Any],
                    axes: list[Any], traced: Any, outs: list[Any], layout: Layout
                    ) -> list[Any]:
  """`outs` with each empty example's outputs those of `fun` at size 0.

  The symbolic trace assumes sizes >= 1 (`_masking/empty.py`): `jnp.max` of
  it is defined, `x[1:]` is `n - 1` long. An empty example's outputs are
  therefore those of `fun` traced with the length 0 (the empty path the
  padded `pj.vmap` takes, the same trace): an empty sum 0, an empty mean NaN,
  a scan's final carry its initial one, and where JAX refuses `fun` at size 0
  (`jnp.max`, `x[0]`), every output poisoned (NaN, and NaN derivatives), as
  over the padded batch. The path runs once on the shared arguments; where
  `fun` takes per-example arguments, once per example on those of an empty
  example (a non-empty one runs the first empty one's: its outputs are
  discarded, and its derivatives are an empty example's own).
  """
  zero = frozenset({DIM})
  tree = jax.tree.structure(tuple(example_args))
  binding = masked.bind(example_args)
  padded = [tuple(o.data.shape[1:]) if isinstance(o, Ragged) else tuple(jnp.shape(o)[1:])
            for o in outs]
  run, usable = _empty.empty_path(masked, binding, tree, zero, padded, traced.out_avals)
  empty = layout.empty()
  first_empty = jnp.argmax(empty)
  # the arguments as leaves of `example_args` (the packed one: empty, (0, ...))
  kinds: list[tuple[str, Any]] = []
  own: list[Any] = []   # the per-example arguments, each example's own
  for x, a in zip(flat, axes, strict=True):
    if is_packed(x):
      kinds += [("empty", jnp.zeros((0, *leaf.shape[2:]), leaf.dtype))
                for leaf in jax.tree.leaves(x.data)]
    elif a is None:
      kinds += [("shared", leaf) for leaf in jax.tree.leaves(x)]
    else:
      moved = jnp.moveaxis(jnp.asarray(x), a, 0)
      own.append(moved)
      at = lax.broadcast_in_dim(empty, moved.shape, (0,))
      kinds.append(("example", lax.select(at, moved, jnp.broadcast_to(
          moved[first_empty], moved.shape))))
  mapped = [x for k, x in kinds if k == "example"]

  traced_ok: list[bool] = []

  def path(*per_example: Any) -> tuple[list[Any], list[Any]]:
    it = iter(per_example)
    xs = [next(it) if k == "example" else x for k, x in kinds]
    traced_ok.append(usable(xs, {}))   # (whether JAX traces `fun` at size 0)
    path_outs, shapes, _ = run(xs, {})
    return path_outs, shapes

  if mapped:
    path_outs, shapes = jax.vmap(path)(*mapped)
  else:
    path_outs, shapes = jax.tree.map(
        lambda y: jnp.broadcast_to(y, (layout.examples, *jnp.shape(y))), path())
  shared = [x for k, x in kinds if k == "shared"]
  result = []
  for o, p, shape in zip(outs, path_outs, shapes, strict=True):
    data = o.data if isinstance(o, Ragged) else o
    at = lax.broadcast_in_dim(empty, data.shape, (0,))
    data = lax.select(at, p.astype(data.dtype), data)
    if not traced_ok[0]:   # JAX refuses `fun` at size 0: poisoned where empty, with
      # NaN derivatives for the shared arguments and the example's own
      data, = jax.vmap(lambda ok, d, *mine: _size_range.poison([d], ok, [*shared, *mine]))(
          ~empty, data, *own)
    if isinstance(o, Ragged):
      lengths = jnp.where(empty, shape[:, 0].astype(o.lengths.dtype), o.lengths)
      result.append(Ragged._make(data, lengths, None, 1))
    else:
      result.append(data)
  return result
