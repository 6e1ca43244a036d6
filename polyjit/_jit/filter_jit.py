"""`pj.filter_jit`: `eqx.filter_jit`'s semantics on `pj.jit`, without Equinox.

Equinox models are pytrees that hold arrays beside activation functions,
ints and flags, which `jax.jit` rejects. `eqx.filter_jit` splits every
argument (the function itself included, when it is a pytree such as a model)
into its array leaves, which are traced, and everything else, which is static:
part of the cache key, compared by hash and equality (functions by identity).
Here the same split feeds `pj.jit`: the array leaves are its dynamic
arguments, bucketed like any other, and the static part (the tree structure
plus the non-array leaves) is one hashable static argument.

Arrays are `jax.Array`, `np.ndarray` and `np.generic` (Equinox's `is_array`),
plus `pj.Padded`; Python scalars are static, as in Equinox.

Outputs follow Equinox too: array leaves come back from the program, every
other leaf is returned as the trace produced it. One case needs care under
masking: a size (`x.shape[0]`) returned as a Python int is a symbolic
dimension in a masked trace, so it is returned from the program as a value
and turned back into an int. Every other non-array output leaf travels in
the output's *tree structure* (`_StaticOut`, whose pytree aux data is the
value): the structure belongs to the trace, and each trace serves exactly the
sizes it was made for (a variant per side of a size comparison, a bucket, an
exact shape), so `x.shape[0] > 4` returned as a bool is right for every size,
with no side table that one trace could fill for another.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Literal, Unpack

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax as jc
from .._masking.errors import PolyjitError
from .function import JitFunction
from .options import JitOptions, with_signature
from .._masking.padding import is_padded

Donate = Literal["none", "all", "all-except-first"]


class StaticArgumentError(PolyjitError, TypeError):
  """A non-array leaf of a `pj.filter_jit` argument cannot be hashed."""


def is_array(x: Any) -> bool:
  """What `pj.filter_jit` traces: JAX and NumPy arrays and scalars, `pj.Padded`."""
  return isinstance(x, (jax.Array, np.ndarray, np.generic)) or is_padded(x)


class FilterJitFunction:
  """A function compiled by `pj.filter_jit`."""

  def __init__(self, fun: Callable[..., Any], *, donate: Donate = "none",
               **jit_kwargs: Unpack[JitOptions]) -> None:
    if not callable(fun):
      raise TypeError(f"pj.filter_jit expects a callable, got {type(fun).__name__}")
    if donate not in ("none", "all", "all-except-first"):
      raise ValueError(f"donate must be 'none', 'all' or 'all-except-first', got {donate!r}")
    self.fun = fun
    self.donate = donate
    if "static_argnums" in jit_kwargs:  # the split decides what is static
      raise TypeError("pj.filter_jit got multiple values for keyword argument 'static_argnums'")
    self._jit_kwargs: JitOptions = {**jit_kwargs, "static_argnums": 0}
    self._inner_named = _named(self._inner, fun)
    self._jit = JitFunction(self._inner_named, **self._jit_kwargs)
    self._donate_from = {"none": None, "all": 1, "all-except-first": 2}[donate]
    functools.update_wrapper(self, fun, updated=())

  def __repr__(self) -> str:
    return f"pj.filter_jit({getattr(self.fun, '__name__', self.fun)})"

  def __get__(self, obj: Any, objtype: Any = None) -> Any:  # methods: bind like a function would
    return self if obj is None else functools.partial(self, obj)

  @property
  def jit_function(self) -> JitFunction:
    """The `pj.jit` function that runs the calls (`pj.stats`, `pj.explain` read it)."""
    return self._jit

  def clear_cache(self) -> None:
    """Drops every compiled program, plan and trace."""
    self._jit.clear_cache()

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    static, dynamic = _partition((self.fun, args, kwargs))
    fun_dyn, args_dyn, kwargs_dyn = dynamic
    jit = self._jit_for(len(args))
    out = jit(static, fun_dyn, *args_dyn, **kwargs_dyn)
    return self._combine(static, out)

  def _jit_for(self, n_args: int) -> JitFunction:
    """The `pj.jit` function; with donation, one per number of positional args."""
    if self._donate_from is None:
      return self._jit
    donated = tuple(range(self._donate_from, n_args + 2))
    if self._jit.donate_argnums != donated:
      options: JitOptions = {**self._jit_kwargs, "donate_argnums": donated}
      self._jit = JitFunction(self._inner_named, **options)
    return self._jit

  def _inner(self, static: Any, fun_dyn: Any, *args_dyn: Any, **kwargs_dyn: Any) -> Any:
    treedef, static_leaves = static
    dyn_leaves = treedef.flatten_up_to((fun_dyn, args_dyn, kwargs_dyn))
    fun, args, kwargs = jax.tree.unflatten(treedef,
        [s if d is None else d for d, s in zip(dyn_leaves, static_leaves, strict=True)])
    out_leaves, out_tree = jax.tree.flatten(fun(*args, **kwargs), is_leaf=is_padded)
    leaves: list[Any] = []
    for x in out_leaves:
      if is_array(x):
        leaves.append(x)
      elif jc.is_symbolic_dim(x):   # a size, symbolic in a masked trace
        leaves.append(_SizeOut(jnp.asarray(x)))
      else:
        leaves.append(_StaticOut(x))
    return jax.tree.unflatten(out_tree, leaves)

  def _combine(self, static: Any, out: Any) -> Any:
    def restore(x: Any) -> Any:
      if isinstance(x, _StaticOut):
        return x.value
      if isinstance(x, _SizeOut):
        return int(x.size)
      return x
    return jax.tree.map(restore, out, is_leaf=lambda x: isinstance(x, (_StaticOut, _SizeOut)))


class _Value:
  """A static output value as pytree aux data: compared by value (identity
  where `==` does not give a bool), hashed by value (identity if unhashable)."""
  __slots__ = ("value",)

  def __init__(self, value: Any) -> None:
    self.value = value

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, _Value):
      return NotImplemented
    if self.value is other.value:
      return True
    try:
      return type(self.value) is type(other.value) and bool(self.value == other.value)
    except Exception:
      return False

  def __hash__(self) -> int:
    try:
      return hash((type(self.value), self.value))
    except TypeError:
      return id(self.value)


class _StaticOut:
  """A non-array output leaf, carried in the tree structure (no children)."""
  __slots__ = ("value",)

  def __init__(self, value: Any) -> None:
    self.value = value


class _SizeOut:
  """A size returned as an int: an int32 array child, turned back into an int."""
  __slots__ = ("size",)

  def __init__(self, size: Any) -> None:
    self.size = size


jax.tree_util.register_pytree_node(
    _StaticOut, lambda s: ((), _Value(s.value)), lambda aux, _: _StaticOut(aux.value))
jax.tree_util.register_pytree_node(
    _SizeOut, lambda s: ((s.size,), None), lambda _, children: _SizeOut(children[0]))


def filter_jit(fun: Callable[..., Any] | None = None, *, donate: Donate = "none",
               **jit_kwargs: Unpack[JitOptions]) -> Any:
  """`eqx.filter_jit`, bucketed: array leaves are traced and padded to size
  buckets, everything else is static.

  Usable as `pj.filter_jit(f)`, `@pj.filter_jit` or `@pj.filter_jit(donate=...)`.
  Every argument (and `fun` itself, when it is a pytree such as an Equinox
  model) is split into array leaves (`jax.Array`, `np.ndarray`, `np.generic`,
  `pj.Padded`), which are dynamic and bucketed as in `pj.jit`, and the rest,
  which is static: hashed and compared by value (functions by identity), a new
  value compiling a new program. Non-array outputs are returned as they are.

  Args:
    donate: "none", "all" (donate the array arguments' buffers) or
      "all-except-first", as in Equinox (keyword arguments are not donated).
    **jit_kwargs: `pj.jit`'s options (`buckets`, `constraints`, `fallback`,
      `cache_size`, `background_compile`); shapes are learned automatically.
  """
  if fun is None:
    return functools.partial(filter_jit, donate=donate, **jit_kwargs)
  return FilterJitFunction(fun, donate=donate, **jit_kwargs)


# --- splitting ------------------------------------------------------------------

def _partition(tree: Any) -> tuple[Any, Any]:
  """(static key, tree with only the array leaves, None elsewhere)."""
  leaves, treedef = jax.tree.flatten(tree, is_leaf=is_padded)
  dyn, static = [], []
  for x in leaves:
    array = is_array(x)
    dyn.append(x if array else None)
    static.append(None if array else x)
  key = (treedef, tuple(static))
  try:
    hash(key)
  except TypeError:
    raise _unhashable(tree) from None
  return key, jax.tree.unflatten(treedef, dyn)


def _unhashable(tree: Any) -> StaticArgumentError:
  paths = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_padded)[0]
  for path, x in paths:
    if is_array(x):
      continue
    try:
      hash(x)
    except TypeError:
      where = jax.tree_util.keystr(path[1:]) if len(path) > 1 else "the function"
      kind = {0: "the function", 1: "argument", 2: "keyword argument"}[path[0].idx]
      return StaticArgumentError(
          f"pj.filter_jit: {kind} leaf {where} is a {type(x).__name__}, which is neither "
          "an array (traced) nor hashable (static values are part of the cache key). "
          "What to do: pass it as a jax or NumPy array, make it hashable, or register "
          "its type as a pytree so that its arrays are leaves.")
  return StaticArgumentError("pj.filter_jit: the static part of the arguments is not hashable.")


def _positional_params(fun: Any) -> list[str]:
  try:
    params = inspect.signature(fun).parameters.values()
  except (TypeError, ValueError):
    return []
  return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


with_signature(filter_jit,
               inspect.Parameter("fun", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                 annotation="Callable[..., Any] | None"),
               inspect.Parameter("donate", inspect.Parameter.KEYWORD_ONLY, default="none",
                                 annotation="Donate"),
               taken=["static_argnums"])  # the split decides what is static


def _named(inner: Callable[..., Any], fun: Callable[..., Any]) -> Callable[..., Any]:
  """`inner` under `fun`'s name (program names, messages), with `fun`'s
  parameter names (leaf names and automatic dimension names follow them)."""
  name = getattr(fun, "__name__", None) or type(fun).__name__

  def named(*args: Any, **kwargs: Any) -> Any:
    return inner(*args, **kwargs)
  named.__name__ = named.__qualname__ = name
  named.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
      [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
       for n in ["static", "fun", *_positional_params(fun)]])
  return named
