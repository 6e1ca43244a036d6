"""Shape specs: parsing, solving padded sizes, and checking logical sizes.

A spec is a string in `jax.export`'s polymorphic-shape syntax ("n", "(n, _)",
"(m+1, 2*n)", "" for a scalar) or None (every dim fixed). `in_shapes` holds one
spec per positional argument, as a pytree prefix of the arguments.

Binding specs to padded arguments gives, for every dimension variable, its
padded size (solved from the arguments' shapes: "(m+1, n+1)" with shape (6, 5)
gives m=5, n=4) and, for every array leaf, its symbolic shape. The logical
sizes come separately, at call time, and may be traced.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence, TypeAlias

import jax
import numpy as np

from . import dims as _dims
from .. import _jax as jc
from .errors import ShapeError


#: One array's spec: a string in `jax.export`'s polymorphic-shape syntax
#: ("n", "(n, _)", "(m+1, 2*n)", "" for a scalar), or None (every dim fixed).
Spec: TypeAlias = "str | None"

#: A pytree of `Spec`s that is a prefix of the argument (or output) it
#: describes: one spec for a whole dict of arrays, or one per leaf.
SpecTree: TypeAlias = Any

#: `in_shapes` / `polymorphic_shapes`: one `SpecTree` per positional argument
#: (a list or tuple), or one `Spec` (`pj.mask`: for every argument).
ArgSpecs: TypeAlias = "Spec | Sequence[SpecTree]"

#: Dimension name -> its logical size: a Python int or an int scalar array,
#: possibly traced.
LogicalEnv: TypeAlias = "Mapping[str, int | np.integer[Any] | np.ndarray | jax.Array]"


def is_spec_leaf(x: object) -> bool:
  return x is None or isinstance(x, str)


@dataclasses.dataclass(frozen=True)
class LeafSpec:
  """One flat argument: where it is, its padded shape, its symbolic shape."""
  where: str                  # "argument 0", "argument 1 at ['w']"
  spec: str | None
  padded_shape: tuple[int, ...]
  symbolic_shape: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Binding:
  """The result of binding specs to padded arguments."""
  scope: jc.SymbolicScope
  leaves: tuple[LeafSpec, ...]
  dim_names: tuple[str, ...]          # sorted; the order of logical values
  padded: dict[str, int]

  def padded_key(self) -> tuple[tuple[str, int], ...]:
    return tuple((k, self.padded[k]) for k in self.dim_names)


_scopes: dict[tuple[str, ...], jc.SymbolicScope] = {}


def make_scope(constraints: str | Sequence[str]) -> jc.SymbolicScope:
  """The scope for a set of constraints, for parsing specs and checking sizes
  against constraints (shared: it never reaches a trace of user code)."""
  if isinstance(constraints, str):
    constraints = (constraints,)
  key = tuple(constraints)
  scope = _scopes.get(key)
  if scope is None:
    scope = _scopes.setdefault(key, fresh_scope(key))
  return scope


def fresh_scope(constraints: str | Sequence[str]) -> jc.SymbolicScope:
  """A new scope, never shared: for a trace of user code that asks size
  questions (`scopes.py` lends shared scopes to the others).

  JAX's trace caches (a `jax.jit` helper, a `lax.scan`/`lax.cond` body,
  `jax.checkpoint`, `eqx.filter_jit`) are keyed by avals, and symbolic avals of
  one scope compare equal across traces. A helper that branched on a size in
  one trace (its answer recorded there) would then be replayed in another with
  that answer, unrecorded, possibly on the other side. Avals of different
  scopes never compare equal, so no size decision crosses from one trace into
  another. The price: JAX retraces its own jitted jnp helpers once per trace.
  """
  if isinstance(constraints, str):
    constraints = (constraints,)
  try:
    return jc.SymbolicScope(tuple(constraints))
  except Exception as e:
    raise ShapeError(f"invalid constraints {list(constraints)!r}: {e}") from None


def parse_shape(spec: str | None, like: tuple[int | None, ...], scope: jc.SymbolicScope,
                where: str) -> tuple[Any, ...]:
  """Parses one spec against a padded shape; raises ShapeError on mismatch."""
  if spec is None:
    return tuple(like)
  rank = spec_rank(spec)
  if rank is not None and rank != len(like):
    raise ShapeError(
        f"{where}: the spec {spec!r} has {rank} dim{'s' * (rank != 1)} but the argument "
        f"has shape {tuple(like)} ({len(like)} dim{'s' * (len(like) != 1)}): a spec names "
        "every axis of its argument (`_` for a fixed one).")
  try:
    shape = tuple(jc.symbolic_shape(spec, scope=scope, like=tuple(like)))
  except Exception as e:
    raise ShapeError(
        f"{where}: cannot use the spec {spec!r} for an array of shape "
        f"{tuple(like)}: {e}") from None
  if len(shape) != len(like):
    raise ShapeError(
        f"{where}: the spec {spec!r} has {len(shape)} dims but the argument has "
        f"shape {tuple(like)} ({len(like)} dims).")
  return shape


def spec_rank(spec: str) -> int | None:
  """How many dims a spec string names, or None when it has `...` (any rank)
  or is not well formed (JAX's parser then says why). Counted here so that a
  rank mismatch is reported as one, not as JAX's "syntax error"."""
  text = spec.strip()
  if "..." in text:
    return None
  if text.startswith("(") and text.endswith(")"):
    text = text[1:-1]
  dims, depth, current = [], 0, ""
  for ch in text:
    depth += (ch == "(") - (ch == ")")
    if depth < 0:
      return None
    if ch == "," and depth == 0:
      dims.append(current)
      current = ""
    else:
      current += ch
  dims.append(current)
  if dims[-1].strip() == "":  # "(n,)" and "()"
    dims.pop()
  if depth != 0 or any(d.strip() == "" for d in dims):
    return None
  return len(dims)


def _leaf_paths(tree: Any) -> list[str]:
  paths, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [jax.tree_util.keystr(p) for p, _ in paths]


def bind(in_shapes: ArgSpecs, args: Sequence[Any], scope: jc.SymbolicScope,
         arg_names: Sequence[str] | None = None, *, check: bool = True) -> Binding:
  """Binds `in_shapes` (one spec per argument) to padded `args`.

  With `check`, the padded sizes must satisfy the scope's constraints.
  """
  if not isinstance(args, (list, tuple)):
    raise TypeError(f"expected the arguments as a list or tuple, got {type(args).__name__}")
  if in_shapes is None or isinstance(in_shapes, str):
    in_shapes = [in_shapes] * len(args)
  if not isinstance(in_shapes, (list, tuple)) or len(in_shapes) != len(args):
    n_specs = len(in_shapes) if isinstance(in_shapes, (list, tuple)) else 1
    raise ShapeError(
        f"in_shapes must hold one spec per positional argument: got {n_specs} "
        f"spec(s) for {len(args)} argument(s).")
  leaves: list[LeafSpec] = []
  for i, (spec_tree, arg) in enumerate(zip(in_shapes, args, strict=True)):
    name = arg_names[i] if arg_names else f"argument {i}"
    try:
      specs = jax.tree.broadcast(spec_tree, arg, is_leaf=is_spec_leaf)
    except Exception as e:
      raise ShapeError(
          f"{name}: the spec {spec_tree!r} is not a pytree prefix of the "
          f"argument: {e}") from None
    # Up to the argument's structure: a None in the argument (an optional
    # bias) is an empty subtree, not a spec.
    # (ignore: jaxlib ships no type stub for PyTreeDef, mypy sees none of its methods)
    spec_leaves = jax.tree.structure(arg).flatten_up_to(specs)  # type: ignore[attr-defined]
    arg_leaves = jax.tree.leaves(arg)
    paths = _leaf_paths(arg)
    for spec, leaf, path in zip(spec_leaves, arg_leaves, paths, strict=True):
      where = name + (f" at {path}" if path else "")
      like = tuple(np.shape(leaf))
      sym = parse_shape(spec, like, scope, where)
      leaves.append(LeafSpec(where, spec, like, sym))
  padded = _solve(leaves)
  # The trace assumed the constraints; shapes evaluated at padded sizes that
  # break them could be inconsistent.
  if check:
    check_constraints(padded, scope, what="padded")
  return Binding(scope, tuple(leaves), tuple(sorted(padded)), padded)


def _solve(leaves: Sequence[LeafSpec]) -> dict[str, int]:
  """Solves every dimension variable's padded size from the padded shapes."""
  eqns = []  # (expr, size, where)
  for leaf in leaves:
    for axis, (d, size) in enumerate(zip(leaf.symbolic_shape, leaf.padded_shape, strict=True)):
      if jc.is_symbolic_dim(d):
        eqns.append((d, size, f"{leaf.where} axis {axis}"))
  solved: dict[str, int] = {}
  origin: dict[str, str] = {}
  progress = True
  while progress:
    progress = False
    for d, size, where in eqns:
      unknown = _dims.dim_vars(d) - solved.keys()
      if len(unknown) != 1:
        continue
      var, = unknown
      form = _dims.linear_form(d)
      if form is None:
        continue
      coeffs, const = form
      rest = const + sum(c * solved[v] for v, c in coeffs.items() if v != var)
      k = coeffs[var]
      value, rem = divmod(size - rest, k)
      if rem or value < 1:
        raise ShapeError(
            f"{where} has padded size {size}, which its spec '{d}' cannot "
            f"match with a whole {var} >= 1.")
      solved[var] = value
      origin[var] = f"{where} (size {size})"
      progress = True
  all_vars = set().union(*(_dims.dim_vars(d) for d, _, _ in eqns)) if eqns else set()
  missing = all_vars - solved.keys()
  if missing:
    raise ShapeError(
        f"cannot solve the padded size of {sorted(missing)} from the argument "
        "shapes: give each dimension variable an axis of its own, alone or as "
        "a linear term such as '2*n' or 'n+1'.")
  for d, size, where in eqns:
    got = _dims.evaluate_dim(d, solved)
    if got != size:
      src = ", ".join(f"{v}={solved[v]} from {origin[v]}"
                      for v in sorted(_dims.dim_vars(d)))
      raise ShapeError(
          f"inconsistent padded sizes: {where} has size {size}, but its spec "
          f"'{d}' gives {got} with {src}. Pad every occurrence of a dimension "
          "to the same size.")
  return solved


def is_concrete(x: object) -> bool:
  return not isinstance(x, jc.Tracer)


def logical_values(logical_env: Mapping[str, Any], binding: Binding) -> tuple[Any, ...]:
  """Logical sizes in `binding.dim_names` order, as int scalars (maybe traced).

  Concrete values are checked here: each must be in [0, padded], every spec
  expression must fit its padded axis, and the scope's constraints must hold.
  Traced values cannot be checked; they are the caller's promise.
  """
  if not hasattr(logical_env, "keys"):
    raise TypeError(
        "logical_env must be a mapping from dimension names to sizes, e.g. "
        f"{{'n': 3}}; got {type(logical_env).__name__}")
  names = set(binding.dim_names)
  given = set(logical_env.keys())
  if names - given:
    raise ShapeError(
        f"logical_env is missing sizes for {sorted(names - given)}; it must map "
        f"every dimension variable of the specs: {sorted(names)}.")
  if given - names:
    raise ShapeError(
        f"logical_env has sizes for {sorted(given - names)}, which no spec "
        f"mentions (the specs use {sorted(names)}).")
  dtype = jc.dim_value_dtype()
  concrete: dict[str, int] = {}
  values = []
  for name in binding.dim_names:
    v = logical_env[name]
    if is_concrete(v):
      arr = np.asarray(v)
      if arr.shape != () or not np.issubdtype(arr.dtype, np.integer):
        raise ShapeError(
            f"the logical size of '{name}' must be an integer scalar, got {v!r}.")
      iv = int(arr)
      if not 0 <= iv <= binding.padded[name]:
        raise ShapeError(
            f"the logical size {name}={iv} does not fit: it must be between 0 "
            f"and its padded size {binding.padded[name]}.")
      concrete[name] = iv
      values.append(np.asarray(iv, dtype))
    else:
      if v.shape != () or not np.issubdtype(v.dtype, np.integer):
        raise ShapeError(
            f"the logical size of '{name}' must be an integer scalar, got {v}.")
      values.append(v if v.dtype == dtype else v.astype(dtype))
  if len(concrete) == len(names):
    _check_concrete(concrete, binding)
  return tuple(values)


def _check_concrete(sizes: dict[str, int], binding: Binding) -> None:
  for leaf in binding.leaves:
    for axis, (d, size) in enumerate(zip(leaf.symbolic_shape, leaf.padded_shape, strict=True)):
      if jc.is_symbolic_dim(d):
        logical = _dims.evaluate_dim(d, sizes)
        if not 0 <= logical <= size:
          raise ShapeError(
              f"{leaf.where} axis {axis}: spec '{d}' with {sizes} gives logical "
              f"size {logical}, which does not fit the padded size {size}.")
  check_constraints(sizes, binding.scope)


def violated_constraint(sizes: dict[str, int], scope: jc.SymbolicScope) -> str | None:
  """The first of the scope's constraints that concrete sizes violate."""
  for text, kind, diff in jc.scope_constraints(scope):
    value = _dims.evaluate_dim(diff, sizes)
    if (kind == "eq" and value != 0) or (kind == "ge" and value < 0):
      return text
  return None


def check_constraints(sizes: dict[str, int], scope: jc.SymbolicScope,
                      what: str = "logical") -> None:
  """Raises ShapeError when concrete sizes violate the scope's constraints."""
  text = violated_constraint(sizes, scope)
  if text is not None and what == "padded":
    raise ShapeError(
        f"the padded sizes {sizes} violate the constraint '{text}', which the function "
        "needs on this side of a comparison between sizes (`min(n, m)`, `abs(n - m)`, "
        "`n <= m`, a slice bound) or declared: the padded sizes must be on the same side "
        "as the logical ones.\nWhat to do: pad the arguments so that their padded sizes "
        "compare as the logical sizes do (or satisfy the declared constraint), or call "
        "through pj.jit, or with traced sizes (jax.jit around pj.mask), which choose "
        "padded sizes that do.")
  if text is not None:
    raise ShapeError(f"the {what} sizes {sizes} violate the constraint '{text}'.")
