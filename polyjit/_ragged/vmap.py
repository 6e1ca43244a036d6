"""`pj.vmap`: `jax.vmap` over `pj.Ragged` arguments, example by example.

    batch = pj.Ragged.from_list([x1, x2, x3])       # examples of different lengths
    ys = pj.vmap(fun)(batch)                        # fun written for one example
    ys.to_list()                                    # == [fun(x1), fun(x2), fun(x3)]

Design
------
`pj.vmap(fun)` masks `fun` (`pj.mask`) with one dimension variable per ragged
axis of each `Ragged` argument (`n{i}_{j}`: the i-th `Ragged` among the
arguments, axis j; its data leaves share them, and so do Ragged arguments
whose lengths `fun` needs equal: `sharing.py`), and `jax.vmap`s the
masked function over the padded data and the per-example lengths; other
arguments follow `in_axes` exactly as in `jax.vmap`. Each example therefore
runs with its own logical size, and results and gradients are exact (see
`_masking/mask.py`). Outputs whose symbolic shape mentions a size come back
as `Ragged` (their lengths evaluated per example); the others are stacked. The
masked function is cached per argument structure (and trace context, as
`jax.jit`'s traces) and the whole call is one `jax.jit`, so a new batch in
the same buckets neither retraces nor compiles.

Which Ragged arguments share their size variables is decided once per
argument structure from `fun` itself (`sharing.py`, which also checks the
lengths on every call); the flat arguments' axes, paths and batch size are
`arguments.py`'s.

Padded-out examples
-------------------
Rows past `num_examples` must never count. Two rules make that hard to get
wrong:

* They run as copies of example 0 (data, lengths and every batched argument),
  so they compute finite values even where the padding holds NaN or a length
  of 0 would be invalid; their outputs get zero cotangents, and 0 times a
  finite derivative is exactly 0, so they add nothing to any gradient.
* When the batch is padded, *every* output comes back as a `Ragged`, per-
  example scalars included (a `Ragged` with no ragged axes): `.mean()` and
  `.sum()` then count real examples only, while `jnp.mean(out)` is a
  TypeError rather than a silently wrong mean. Without batch padding,
  per-example scalars are an ordinary array, and its `.mean()` is right too.
  So `pj.vmap(loss)(params, batch).mean()` is correct either way.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Hashable, Sequence, TypeAlias, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from .._masking import dims as _dims
from .._masking.errors import MaskingError, ShapeError
from .._masking import verify as _verify
from .._masking.mask import Masked
from .._sharding import placement as _sharding
from .arguments import (aval_key, batch_and_count, broadcast, check_counts, describe,
                        example_struct, first_for_padded, host_lengths, leaf_axes,
                        leading_dynamic_axes, pad_ragged_axes, split_lengths)
from .ragged import Ragged, is_concrete, is_ragged
from .plan import Plan
from .packed_vmap import PackedRunner
from .packing import is_packed
from .sharing import Groups, find_groups, group_padded, may_share
from . import bounds as _bounds

#: `pj.vmap`'s `in_axes`, as in `jax.vmap`: an int, None, or a list or tuple
#: with one pytree prefix (of ints and Nones) per positional argument.
InAxes: TypeAlias = "int | None | Sequence[Any]"

#: `pj.vmap`'s `out_axes`, as in `jax.vmap`: a pytree prefix of the outputs
#: whose leaves are ints or None.
OutAxes: TypeAlias = Any


def _hashable(tree: Any) -> tuple[tuple[Any, ...], Any]:
  leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: x is None)
  return tuple(leaves), treedef


def _unhashable(key: tuple[tuple[Any, ...], Any]) -> Any:
  leaves, treedef = key
  return treedef.unflatten(leaves)


class RaggedVmapped:
  """The result of `pj.vmap`: call it like the `jax.vmap`ped function."""

  def __init__(self, fun: Callable[..., Any], in_axes: InAxes, out_axes: OutAxes) -> None:
    self.fun = fun
    # A list is not a prefix of the positional-argument tuple: as in jax.vmap.
    self.in_axes = tuple(in_axes) if isinstance(in_axes, list) else in_axes
    self.out_axes = out_axes
    self._masked: dict[Any, Masked] = {}
    self._plans: dict[Any, Plan] = {}
    self._bounded = False   # some plan learned a bound on the lengths (`bounds.py`)
    functools.update_wrapper(self, fun, updated=())

    def run(*args: Any) -> Any:
      return self._run(*args)

    # Compile events and profiles then name the user's function.
    run.__name__ = run.__qualname__ = f"vmap_{getattr(fun, '__name__', 'fun')}"
    self._jitted = jax.jit(run)
    # Packed batches (`packed_vmap.py`): their own program, and this one's run
    # for the calls that go unpacked.
    self._packed = PackedRunner(fun, self.in_axes, out_axes, self._run)

  def __repr__(self) -> str:
    return f"pj.vmap({getattr(self.fun, '__name__', self.fun)!r})"

  def __call__(self, *args: Any) -> Any:
    leaves = jax.tree.leaves(args, is_leaf=lambda x: is_ragged(x) or is_packed(x))
    if any(is_packed(x) for x in leaves):
      return self._packed.jitted(*args)
    raggeds = [x for x in leaves if is_ragged(x)]
    if not raggeds:
      return jax.vmap(self.fun, self.in_axes, self.out_axes)(*args)
    check_counts(raggeds)
    if ((may_share(raggeds) or self._bounded or not self._plans)
        and all(is_concrete(r.lengths) for r in raggeds)):
      # Concrete lengths: a mismatch, or a length `fun` fails at (a bound
      # learned from `fun`, `bounds.py`), is a pj.ShapeError here, before
      # running. (After the first plan, only where some plan learned a bound;
      # the program checks again, for traced lengths and a first call of
      # another structure: `Plan.check_bounds_in_program`.)
      treedef, leaves, paths, axes = self._flatten(args)
      batch_and_count(leaves, axes, paths)
      plan = self._plan(treedef, leaves, axes, paths)
      if plan.shares or plan.learned:
        lengths = host_lengths([x for x in leaves if is_ragged(x)])
        plan.check_on_host(lengths)
        plan.check_bounds(lengths)
    if (_verify.enabled() and self.out_axes == 0
        and all(is_concrete(r.lengths) for r in raggeds)):
      _, leaves, _, axes = self._flatten(args)
      return self._checked(args, leaves, axes)
    return self._jitted(*args)

  def _checked(self, args: tuple[Any, ...], leaves: list[Any], axes: list[Any]) -> Any:
    """The checking mode (`_masking/verify.py`): each example's outputs agree
    with `fun` on that example unpadded (concrete lengths only)."""
    with _verify.Inside():
      result = self._jitted(*args)
    if any(isinstance(x, jc.Tracer) for x in jax.tree.leaves((args, result))):
      return result
    treedef = jax.tree.structure(args, is_leaf=is_ragged)
    examples = [x.to_list() if is_ragged(x) else None for x in leaves]
    count = len(next(e for e in examples if e is not None))
    outs = [x.to_list() if is_ragged(x) else x
            for x in jax.tree.leaves(result, is_leaf=is_ragged)]
    out_tree = jax.tree.structure(result, is_leaf=is_ragged)
    for b in range(count):
      example = [jax.tree.map(jnp.asarray, e[b]) if e is not None
                 else (x if axis is None else jnp.take(jnp.asarray(x), b, axis=axis))
                 for x, axis, e in zip(leaves, axes, examples, strict=True)]
      inputs = jax.tree.unflatten(treedef, example)
      want = self.fun(*inputs)
      got = jax.tree.unflatten(out_tree, [o[b] if isinstance(o, list) else np.asarray(o)[b]
                                          for o in outs])
      _verify.compare(repr(self), f"example {b}", got, want, inputs)
    return result

  def _flatten(self, args: tuple[Any, ...]) -> tuple[Any, list[Any], list[str], list[Any]]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(args, is_leaf=is_ragged)
    paths, leaves = [describe(p) for p, _ in flat], [x for _, x in flat]
    return treedef, leaves, paths, leaf_axes(self.in_axes, args, len(leaves))

  def _run(self, *args: Any, examples: Any = None) -> Any:
    """`fun` mapped over the batch; `examples` (a grouped batch's block: the
    original index of each row) is what a length mismatch error names."""
    treedef, leaves, paths, axes = self._flatten(args)
    batch, count = batch_and_count(leaves, axes, paths)
    keep = None if count is None else jnp.arange(batch) < count
    plan = self._plan(treedef, leaves, axes, paths)
    masked, names = plan.masked, plan.names

    datas: list[Any] = []
    lengths: list[Any] = []
    plains: list[Any] = []
    plain_axes: list[Any] = []
    for x, axis in zip(leaves, axes, strict=True):
      if is_ragged(x):
        data = first_for_padded(x.data, 0, keep)
        datas.append(pad_ragged_axes(data, plan.padded[len(lengths)]))
        lengths.append(first_for_padded(x.lengths, 0, keep))
      else:
        plains.append(first_for_padded(x, axis, keep))
        plain_axes.append(axis)
    # Arguments that share size variables: their lengths, checked equal in the
    # program (a mismatch is never silent), are the group's first member's.
    lengths = plan.check_in_program(lengths, examples)
    lengths = plan.check_bounds_in_program(lengths, examples)   # (`bounds.py`)
    sizes = [split_lengths(l, r.ragged_axes)
             for l, r in zip(lengths, [x for x in leaves if is_ragged(x)], strict=True)]
    kinds = [is_ragged(x) for x in leaves]
    # Every example known to be non-empty: no empty paths, whose selection
    # would make shared parameters per-example under vmap (issue 32).
    nonempty = all(x.nonempty for x in leaves if is_ragged(x))

    def per_example(datas: list[Any], sizes: list[list[Any]], plains: list[Any]
                    ) -> tuple[Any, list[list[Any]]]:
      sources = (iter(datas), iter(plains))
      example = treedef.unflatten([next(sources[0] if r else sources[1]) for r in kinds])
      env = {name: s for ns, ss in zip(names, sizes, strict=True)
             for name, s in zip(ns, ss, strict=True)}
      outs, computed, shapes = masked.call_with_shapes(list(example), env,
                                                       may_be_empty=not nonempty)
      env = env if computed is None else computed   # with data-dependent sizes
      traced = masked.trace(list(example))
      out_paths = [describe(p, "output")
                   for p, _ in jax.tree_util.tree_flatten_with_path(outs)[0]]
      lengths = [_out_lengths(a, env, p)
                 for a, p in zip(traced.out_avals, out_paths, strict=True)]
      if shapes is not None:   # sizes that may be 0: each path's own (`_masking/empty.py`)
        lengths = [s[:len(l)] for l, s in zip(lengths, shapes, strict=True)]
      return outs, lengths

    mapped = jax.vmap(per_example, in_axes=(0, 0, plain_axes), out_axes=(self.out_axes, 0))
    try:
      # A batch on an Explicit mesh runs with its axes Auto (`_sharding/placement.py`).
      outs, out_lengths = _sharding.on_auto_axes(mapped, (datas, sizes, plains))
    except (MaskingError, ShapeError) as e:
      if plan.note:
        e.add_note(plan.note)
      raise
    return self._assemble(outs, out_lengths, count, keep)

  def _masked_for(self, treedef: Any, ks: tuple[int | None, ...], groups: Groups,
                  constraints: tuple[str, ...] = (), keep: bool = False
                  ) -> tuple[Masked, list[list[str]]]:
    """`pj.mask(fun)` for this argument structure and sharing (cached), and
    the dim names of each Ragged argument: `n{i}_{j}`, i the first member of
    its group."""
    head = {o: g[0] for g in groups for o in g}
    numbers = np.cumsum([k is not None for k in ks]) - 1
    names = [[f"n{head[i]}_{j}" for j in range(k)]
             for i, k in zip(numbers, ks, strict=True) if k is not None]
    key = (treedef, ks, groups, constraints)
    masked = self._masked.get(key)
    if masked is None:
      it = iter(names)
      specs = [_spec(next(it)) if k is not None else None for k in ks]
      masked = Masked(self.fun, list(treedef.unflatten(specs)), constraints=constraints)
      if not constraints or keep:  # the probes' are used once
        self._masked[key] = masked
    return masked, names

  def _plan(self, treedef: Any, leaves: list[Any], axes: list[Any],
            paths: list[str]) -> Plan:
    """Which Ragged arguments share their size variables (cached per argument
    structure, shapes, dtypes and trace context): none, unless `fun` needs their lengths
    equal (`sharing.py` says how that is found)."""
    ks = tuple(x.ragged_axes if is_ragged(x) else None for x in leaves)
    raggeds = [x for x in leaves if is_ragged(x)]
    # (and JAX's configuration, as jax.jit keys on it: the probes trace `fun`)
    key = (treedef, ks, tuple(aval_key(x, a) for x, a in zip(leaves, axes, strict=True)),
           jc.trace_context())
    plan = self._plans.get(key)
    if plan is not None:
      return plan
    # Each probe learns the bounds `fun` needs on the lengths (`bounds.py`).
    learned: dict[tuple[Groups, tuple[str, ...]], tuple[tuple[str, ...], Any]] = {}

    def probe(groups: Groups, constraints: Sequence[str],
              padded: Sequence[tuple[int, ...]]) -> BaseException | None:
      seen: list[BaseException] = []

      def once(cons: tuple[str, ...]) -> BaseException | None:
        error = self._probe(treedef, leaves, axes, groups, cons, padded)
        seen.extend([error] if error is not None else [])
        return error
      bound, error = _bounds.learn(once, tuple(constraints))
      learned[(groups, tuple(constraints))] = (bound, seen[0] if seen else None)
      return error

    groups, error = find_groups(probe, raggeds)
    if (groups, ()) not in learned:   # (the plain trace is cached for the call)
      probe(groups, (), group_padded(groups, raggeds))
    bound, bound_error = learned[(groups, ())]
    masked, names = self._masked_for(treedef, ks, groups, bound, keep=True)
    fun_name = getattr(self.fun, "__name__", None) or repr(self.fun)
    plan = Plan(masked, names, fun_name, groups, raggeds,
                [p for x, p in zip(leaves, paths, strict=True) if is_ragged(x)], error,
                learned=bound, learned_from=bound_error if bound else None)
    self._bounded = self._bounded or bool(bound)
    self._plans[key] = plan
    return plan

  def _probe(self, treedef: Any, leaves: list[Any], axes: list[Any], groups: Groups,
             constraints: Sequence[str], padded: Sequence[tuple[int, ...]]
             ) -> BaseException | None:
    """Traces `fun` with these groups, constraints and padded sizes (no
    program is built): its error, or None."""
    ks = tuple(x.ragged_axes if is_ragged(x) else None for x in leaves)
    masked, _ = self._masked_for(treedef, ks, groups, tuple(constraints))
    it = iter(padded)
    example = [example_struct(x, a, next(it) if is_ragged(x) else None)
               for x, a in zip(leaves, axes, strict=True)]
    box: list[BaseException] = []

    def probe(example: Any) -> tuple[()]:
      try:
        masked.trace(list(treedef.unflatten(example)))
      except Exception as e:  # noqa: BLE001  (the real call raises it again)
        box.append(e)
      return ()

    jax.eval_shape(probe, example)
    return box[0] if box else None

  def _assemble(self, outs: Any, out_lengths: list[list[Any]], count: Any,
                keep: jax.Array | None) -> Any:
    tree: Any  # (a PyTreeDef, which jaxlib ships no type stub for)
    leaves, tree = jax.tree.flatten(outs)
    axes = broadcast(self.out_axes, outs, len(leaves), "out_axes")
    result: list[Any] = []
    for x, lengths, axis in zip(leaves, out_lengths, axes, strict=True):
      if not lengths and keep is None:
        result.append(x)
        continue
      if axis != 0:
        raise TypeError(
            f"pj.vmap returns this output as a pj.Ragged (it {_why(lengths)}), whose "
            f"examples are stacked on axis 0, but out_axes gives {axis}: use "
            "out_axes=0 for it.")
      column = [jnp.where(keep, s, 0) if keep is not None else s for s in lengths]
      stacked = (column[0] if len(column) == 1
                 else jnp.stack(column, axis=1) if column
                 else jnp.zeros((x.shape[0], 0), jnp.int32))
      result.append(Ragged._make(x, stacked, count, len(lengths)))
    return tree.unflatten(result)



def _why(lengths: Sequence[Any]) -> str:
  return ("depends on the example's length" if lengths
          else "is per example, and the batch is padded")


def _spec(names: list[str]) -> str | None:
  return "(" + ", ".join([*names, "..."]) + ")" if names else None


def _out_lengths(aval: Any, env: dict[str, Any], where: str) -> list[Any]:
  """Per example: the logical size of each leading dynamic axis of an output."""
  return [_dims.evaluate_dim(d, env) for d in aval.shape[:leading_dynamic_axes(aval, where)]]


def vmap(fun: Callable[..., Any], in_axes: InAxes = 0, out_axes: OutAxes = 0) -> RaggedVmapped:
  """`jax.vmap` that also maps over `pj.Ragged` arguments, example by example.

  Args:
    fun: a function written for one unpadded example.
    in_axes: as in `jax.vmap` (an int, None, or a tuple with one pytree prefix
      per positional argument). A `pj.Ragged` argument is mapped over its
      examples (its entry must be 0), each with its own logical lengths;
      other arguments are mapped or shared (None, e.g. model parameters) as
      `jax.vmap` does.
    out_axes: as in `jax.vmap`; must be 0 for outputs that come back as
      `pj.Ragged`.

  Returns:
    A function of the same arguments. An output whose shape depends on an
    example's length comes back as a `pj.Ragged` (lengths per example); one
    that does not is stacked into an ordinary array, unless the batch itself
    is padded (`Ragged.from_list(..., batch_buckets=...)`): then it is a
    `pj.Ragged` with no ragged axes, so that `.mean()` and `.sum()` count real
    examples only. `pj.vmap(loss)(params, batch).mean()` is the mean loss in
    both cases. Results and gradients equal those of `fun` on each unpadded
    example. Without `pj.Ragged` arguments this is `jax.vmap`.

  Ragged arguments that `fun` needs with equal lengths (tokens and targets
  from two `Ragged.from_list` calls) share their sizes, and a call whose
  lengths differ raises a `pj.ShapeError` naming both arguments and the
  first differing example; arguments `fun` accepts with different lengths
  (queries and keys) keep their own (`polyjit/_ragged/sharing.py`).

  The returned function is cached per (fun, in_axes, out_axes), and each call
  is one `jax.jit` of the masked function, so batches in the same buckets
  reuse one compiled program.
  """
  return shared_vmap(RaggedVmapped, fun, in_axes, out_axes)


_V = TypeVar("_V", bound="RaggedVmapped")


def shared_vmap(cls: type[_V], fun: Callable[..., Any], in_axes: InAxes,
                out_axes: OutAxes) -> _V:
  """`cls(fun, in_axes, out_axes)`, the same instance for the same arguments."""
  if not callable(fun):
    raise TypeError(f"pj.vmap expects a callable, got {type(fun).__name__}")
  ins, outs = _hashable(in_axes), _hashable(out_axes)
  try:
    hash((fun, ins, outs))
  except TypeError:  # an unhashable function: no reuse across pj.vmap calls
    return cls(fun, in_axes, out_axes)
  instance = _cached_vmap(cast(Hashable, cls), fun, ins, outs)  # (mypy: a class hashes)
  assert isinstance(instance, cls)  # (made by `cls` itself)
  return instance


# Calling pj.vmap(f) again for the same f (in an eager loop) must not retrace
# and recompile: instances are shared. Bounded, like JAX's own trace caches,
# because each holds its function and compiled programs.
@functools.lru_cache(maxsize=128)
def _cached_vmap(cls: Any, fun: Callable[..., Any], in_axes: Any,  # cls: a RaggedVmapped class
                 out_axes: Any) -> RaggedVmapped:
  instance: RaggedVmapped = cls(fun, _unhashable(in_axes), _unhashable(out_axes))
  return instance
