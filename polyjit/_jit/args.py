"""How `pj.jit` sees a call's arguments: static or dynamic, leaves, names, specs, donation.

`pj.jit` takes the arguments `jax.jit` takes. Static arguments (by position or
by name) are split off first: their values are part of the structure's key and
are filled back in when `fun` is traced (`bind_static`). The dynamic ones are
flattened into leaves, a `pj.Padded` being one leaf with its logical shape, and
each leaf is keyed by its (dtype, weak type) as `jax.jit` would see it.

Everything else here is per structure, computed once: each leaf's name for
messages and automatic dimension names (`x`, `batch['ids']`, `arg3` past the
signature), the per-leaf specs of explicit mode (`polymorphic_shapes` has one
spec per positional argument, broadcast over its pytree; keyword arguments are
fixed), and the leaves of the donated positions.

The hot path of a repeated call skips all of that: `call_signature` keys
positional arguments that are plain arrays or scalars by (dtype, weak type,
shape) each, and `pj.jit` maps that key straight to the call's plan.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence, TypeAlias

import jax
import numpy as np

from .. import _jax as jc
from .._masking import spec as _spec
from .._masking.errors import ShapeError
from .._masking.padding import Padded, is_padded

#: The static arguments of a call: ((position, value), ...), ((name, value), ...).
StaticKey: TypeAlias = tuple[tuple[tuple[int, Any], ...], tuple[tuple[str, Any], ...]]

NO_STATIC: StaticKey = ((), ())  # the static key of a call without static arguments


class ArgLayout:
  """The argument options of one `pj.jit` function, applied to its calls."""

  #: Whether `polymorphic_shapes` has one spec per parameter (from annotations,
  #: padded with None to the call's positional arguments); set by `pj.jit`.
  specs_per_parameter: bool = False

  def __init__(self, fun: Callable[..., Any], label: str, *, polymorphic_shapes: Any = None,
               static_argnums: int | Sequence[int] | None = None,
               static_argnames: str | Sequence[str] | None = None,
               donate_argnums: int | Sequence[int] | None = None,
               donate_argnames: str | Sequence[str] | None = None) -> None:
    self.fun = fun
    self.label = label                  # `pj.jit(name)`, for messages
    self.polymorphic_shapes = (None if polymorphic_shapes is None
                               else _as_tuple(polymorphic_shapes))
    self.static_argnums, self.static_argnames = infer_argnums_and_argnames(
        fun, static_argnums, static_argnames)
    self.donate_argnums, self.donate_argnames = infer_argnums_and_argnames(
        fun, donate_argnums, donate_argnames)
    self._params = _positional_params(fun)

  # --- every call ------------------------------------------------------------

  def flatten(self, args: Sequence[Any], kwargs: dict[str, Any]
              ) -> tuple[StaticKey, list[Any], Any]:
    """(static key, leaves, treedef) of a call; the static key is hashable."""
    static_key, dyn_args, dyn_kwargs = self._split(args, kwargs)
    leaves, treedef = jax.tree.flatten((dyn_args, dyn_kwargs), is_leaf=is_padded)
    return static_key, leaves, treedef

  def _split(self, args: Sequence[Any], kwargs: dict[str, Any]
             ) -> tuple[StaticKey, Sequence[Any], dict[str, Any]]:
    if not self.static_argnums and not self.static_argnames:
      return NO_STATIC, args, kwargs
    nums = {a % len(args) if a < 0 else a for a in self.static_argnums if -len(args) <= a < len(args)}
    static = [(i, args[i]) for i in sorted(nums)]
    static_kw = [(k, kwargs[k]) for k in sorted(kwargs) if k in self.static_argnames]
    dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
    static_key = (tuple(static), tuple(static_kw))
    try:
      hash(static_key)
    except TypeError:
      raise TypeError(
          f"static arguments of {self.label} must be hashable, got {static_key!r}; "
          "pass arrays as ordinary (non-static) arguments.") from None
    return static_key, dyn_args, dyn_kwargs

  @property
  def has_static(self) -> bool:
    return bool(self.static_argnums or self.static_argnames)

  # --- once per structure ----------------------------------------------------

  def bind_static(self, static_key: StaticKey) -> Callable[..., Any]:
    """`fun` with the static arguments filled in, taking the dynamic ones."""
    static_args, static_kwargs = dict(static_key[0]), dict(static_key[1])

    def bound(*dyn_args: Any, **dyn_kwargs: Any) -> Any:
      it = iter(dyn_args)
      n = len(dyn_args) + len(static_args)
      args = [static_args[i] if i in static_args else next(it) for i in range(n)]
      return self.fun(*args, **static_kwargs, **dyn_kwargs)
    return bound

  def leaf_names(self, treedef: Any, static_key: StaticKey) -> list[str]:
    """Each leaf's name: its parameter (or keyword) and its path inside it."""
    dummy = treedef.unflatten(list(range(treedef.num_leaves)))
    paths = jax.tree_util.tree_flatten_with_path(dummy)[0]
    positions = _dynamic_positions(treedef, static_key)
    names = []
    for path, _ in paths:
      group, key, rest = path[0].idx, path[1], path[2:]
      if group == 0:
        pos = positions[key.idx]
        base = self._params[pos] if pos < len(self._params) else f"arg{pos}"
      else:
        base = str(key.key)
      names.append(base + jax.tree_util.keystr(rest))
    return names

  def explicit_specs(self, treedef: Any, static_key: StaticKey) -> tuple[Any, ...]:
    """Per-leaf specs from `polymorphic_shapes` (keyword arguments: fixed)."""
    specs = self.polymorphic_shapes
    assert specs is not None, "explicit mode only"
    positions = _dynamic_positions(treedef, static_key)
    n_positional = len(positions) + len(static_key[0])
    if self.specs_per_parameter:  # one per parameter (annotations)
      specs = (tuple(specs) + (None,) * n_positional)[:n_positional]
    if len(specs) != n_positional:
      raise ShapeError(
          f"polymorphic_shapes has {len(specs)} spec(s) but {self.label} was called with "
          f"{n_positional} positional argument(s); give one spec per positional "
          "argument (None for an argument with a fixed shape).")
    args_tree, kwargs_tree = treedef.children()
    leaf_specs: list[Any] = []
    for pos, sub in zip(positions, args_tree.children(), strict=True):
      dummy = sub.unflatten([0] * sub.num_leaves)
      leaf_specs.extend(sub.flatten_up_to(
          jax.tree.broadcast(specs[pos], dummy, is_leaf=_spec.is_spec_leaf)))
    n_kwargs: int = kwargs_tree.num_leaves
    return tuple(leaf_specs) + (None,) * n_kwargs

  def donated_leaves(self, treedef: Any, static_key: StaticKey) -> tuple[int, ...]:
    """The indices of the leaves of the donated arguments (positional, and
    keyword arguments named in `donate_argnames`)."""
    if not self.donate_argnums and not self.donate_argnames:
      return ()
    static_nums = {i for i, _ in static_key[0]}
    positions = _dynamic_positions(treedef, static_key)
    out: list[int] = []
    start = 0
    args_tree, kwargs_tree = treedef.children()
    for child, pos in zip(args_tree.children(), positions, strict=True):
      if pos in self.donate_argnums and pos not in static_nums:
        out.extend(range(start, start + child.num_leaves))
      start += child.num_leaves
    names = kwargs_tree.node_data()[1]  # a dict's keys, in its flattening order
    for child, name in zip(kwargs_tree.children(), names, strict=True):
      if name in self.donate_argnames:
        out.extend(range(start, start + child.num_leaves))
      start += child.num_leaves
    return tuple(out)


def infer_argnums_and_argnames(fun: Callable[..., Any], argnums: int | Sequence[int] | None,
                               argnames: str | Sequence[str] | None
                               ) -> tuple[tuple[int, ...], tuple[str, ...]]:
  """`jax.jit`'s rule for static and donated arguments: given only positions,
  the names of those parameters count too (the argument may be passed by
  keyword); given only names, so do their positions (it may be passed
  positionally); given both, each is taken as it is."""
  nums = _normalize_argnums(argnums)
  names = tuple(_as_tuple(argnames)) if argnames is not None else ()
  if argnums is not None and argnames is not None:
    return nums, names
  try:
    params = list(inspect.signature(fun).parameters.values())
  except (TypeError, ValueError):
    return nums, names
  if argnames is None:
    names = tuple(p.name for i, p in enumerate(params)
                  if p.kind == p.POSITIONAL_OR_KEYWORD and (i in nums or i - len(params) in nums))
  else:
    nums = tuple(i for i, p in enumerate(params)
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name in names)
  return nums, names


def note_fixed_kwargs(error: BaseException, treedef: Any, names: Sequence[str],
                      label: str) -> None:
  """Adds to a masking `error` in explicit mode that keyword arguments are
  fixed, when the call had keyword array arguments: a keyword array whose
  length matches a dynamic one's (`x * w` with `w=`) cannot be masked."""
  n_kwargs = treedef.children()[1].num_leaves
  if not n_kwargs:
    return
  kw = ", ".join(names[len(names) - n_kwargs:])
  error.add_note(
      f"({label} was called with keyword array arguments ({kw}); polymorphic_shapes "
      "gives specs to the positional arguments only, so keyword arguments keep their "
      "exact shapes (fixed). If one has a dynamic axis, pass it positionally with a "
      "spec, e.g. polymorphic_shapes=['n', 'n'] for f(x, w); or bind it with "
      "functools.partial outside pj.jit if it is fixed.)")


def refuse_jit_options(**options: Any) -> None:
  """Raises for the `jax.jit` keywords `pj.jit` cannot honour, saying why."""
  if options.get("device") is not None or options.get("backend") is not None:
    raise TypeError(
        "pj.jit does not take device= or backend= (jax.jit deprecated them): polyjit "
        "compiles for where its arguments live. What to do: put the arguments there "
        "(jax.device_put(x, device)), or give in_shardings=.")
  if options.get("compiler_options"):
    raise TypeError(
        "pj.jit does not take compiler_options=: its programs are compiled once per "
        "bucket and shared through the executable cache, whose key does not hold XLA "
        "options. What to do: set them process-wide (XLA_FLAGS, jax.config), or use "
        "jax.jit for this function.")


def _dynamic_positions(treedef: Any, static_key: StaticKey) -> list[int]:
  """The original positions of the dynamic positional arguments."""
  static_nums = {i for i, _ in static_key[0]}
  n_dynamic = len(treedef.children()[0].children())
  total = n_dynamic + len(static_nums)
  return [i for i in range(total) if i not in static_nums]


def _as_tuple(x: Any) -> tuple[Any, ...]:
  return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def _normalize_argnums(nums: int | Sequence[int] | None) -> tuple[int, ...]:
  if nums is None:
    return ()
  return tuple(int(n) for n in _as_tuple(nums))


def _positional_params(fun: Callable[..., Any]) -> list[str]:
  try:
    params = inspect.signature(fun).parameters.values()
  except (TypeError, ValueError):
    return []
  return [p.name for p in params
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


# --- the hot path -------------------------------------------------------------

_PYTHON_SCALARS = (bool, int, float, complex)
_NUMPY_SCALARS = tuple(np.dtype(c).type for c in "?bhilqBHILQefdgFD")
_SCALAR_TYPES = frozenset(_PYTHON_SCALARS + _NUMPY_SCALARS)


def call_signature(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
  """A hashable key of positional arguments that are all arrays or scalars,
  one entry per argument, or None (containers, `pj.Padded`, tracers, other
  types): the general path then. Equal keys mean equal shapes and equally
  typed leaves, so they mean the same structure and the same plan. A
  `jax.Array` is keyed by its abstract value (dtype, weak type, shape, as
  jax.jit keys it): one attribute read, where its three properties cost 1 us."""
  key: list[Any] = []
  for x in args:
    t = type(x)
    if t is jc.ARRAY_TYPE:
      key.append(x.aval)
    elif t is np.ndarray:
      key.append((x.dtype, x.shape))
    elif t in _SCALAR_TYPES:
      key.append(t)  # the type fixes dtype, weak type and shape ()
    else:
      return None
  return tuple(key)


def rank_signature(key: tuple[Any, ...]) -> tuple[Any, ...]:
  """A `call_signature` with each shape replaced by its rank: equal for calls
  of one structure whose sizes differ."""
  return split_signature(key)[0]


def split_signature(key: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[tuple[int, ...], ...]]:
  """(`rank_signature(key)`, each argument's shape (scalars: ())), in one
  pass: every never-seen size needs both."""
  ranks: list[Any] = []
  shapes: list[tuple[int, ...]] = []
  for k in key:
    if type(k) is tuple:  # a NumPy array's (dtype, shape)
      shape = k[-1]
      ranks.append(k[:-1] + (len(shape),))
      shapes.append(shape)
    elif type(k) is type:  # a scalar's type
      ranks.append(k)
      shapes.append(())
    else:  # a jax.Array's abstract value
      ranks.append((k.dtype, k.weak_type, k.ndim))
      shapes.append(tuple(k.shape))
  return tuple(ranks), tuple(shapes)


# --- leaves --------------------------------------------------------------------

def uncanonical_array(leaves: Sequence[Any]) -> int | None:
  """The position of the first `jax.Array` whose dtype the x64 mode of this
  call would not make (a float64 array made under `jax.enable_x64(True)`,
  passed with x64 off), or None. jax.jit keeps such an array's dtype; a
  padded copy of it (made on the host in the canonical dtype) could not."""
  for i, x in enumerate(leaves):
    if type(x) is jc.ARRAY_TYPE and jc.uncanonical(x.dtype):
      return i
  return None


def aval_key(x: Any) -> tuple[np.dtype[Any], bool] | None:
  """(dtype, weak_type) of an argument as jax.jit sees it; None for a tracer.

  The hot path of every call: the common types are handled without building
  an abstract value.
  """
  if isinstance(x, np.ndarray) or isinstance(x, np.generic):
    return (jc.canonical_dtype(x.dtype), False)
  if isinstance(x, jc.Tracer):
    return None
  if type(x) is jc.ARRAY_TYPE:
    return (x.dtype, x.weak_type)
  if isinstance(x, Padded):  # under a transformation its data is a tracer: inline
    return None if isinstance(x.data, jc.Tracer) else (np.dtype(x.dtype), False)
  aval = jax.typeof(x)  # also typed PRNG keys: no weak_type, an extended dtype
  return (aval.dtype, bool(aval.weak_type))


def strip_padded(tree: Any) -> Any:
  """`tree` with each `pj.Padded` replaced by its logical slice."""
  return jax.tree.map(
      lambda x: x.data[tuple(slice(0, s) for s in x.shape)] if is_padded(x) else x,
      tree, is_leaf=is_padded)
