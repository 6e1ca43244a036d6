"""jaxtyping annotations as polymorphic specs.

A function annotated with jaxtyping (`x: Float[Array, "n d"]`) already says
which axes share a size. `pj.jit` reads the annotations of its positional
parameters and uses them as `polymorphic_shapes`: every named dimension is a
dimension variable (the same name in two annotations is the same variable),
so the first call compiles a bucket instead of its exact shapes. The rest of
an annotation maps to what `pj.mask`'s syntax can say:

  "n", "seq_len"     a dimension variable (dynamic)
  "n+1", "2*n"       the same expression of variables (jax.export's syntax)
  "3", "_", "_foo"   a fixed size, taken from the argument
  "#n"               fixed (broadcastable: it may be 1 where n is not)
  "... ", "*batch"   at the end: the remaining axes, fixed; elsewhere the
                     argument's rank is unknown here, so it is left fixed

Only annotations with at least one dimension variable count; a function
without any is left to automatic mode. Explicit `polymorphic_shapes` win
over annotations. Keyword arguments stay fixed, as in explicit mode.

`pj.shapecheck(f)` traces `f` from its annotations alone (every positional
parameter without a default needs one, with a fixed rank; anonymous dims get
fresh names; parameters with defaults keep them) and
compares the result with the return annotation (an array annotation or a
tuple of them): shapes and dtypes, without running anything.

jaxtyping is optional: without it no annotation is recognised, and
`pj.shapecheck(f)` says how to install it.
"""

from __future__ import annotations

import inspect
import itertools
import re
import sys
import typing
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np

from .. import _jax as jc
from .._masking import spec as _spec
from .._masking.errors import ShapeError
from .._masking.mask import check_out_shape
from .._masking.trace import trace_flat



def _jaxtyping(load: bool = False) -> Any:
  """The jaxtyping module, or None. Not imported with polyjit (about 10 ms of
  CPU time after JAX's import): a function annotated with its types
  was defined after its import, so for reading annotations the module is
  looked up where it already is; `load` (`pj.shapecheck(f)`) imports it."""
  module = sys.modules.get("jaxtyping")
  if module is None and load:
    try:
      import jaxtyping as module
    except ImportError:  # optional
      return None
  return module

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*$")
_EXPR = re.compile(r"[A-Za-z0-9_+\-* ()]+$")
_VARIADIC = "..."


def is_array_annotation(annotation: Any) -> bool:
  """Whether `annotation` is a jaxtyping array type such as Float[Array, "n"]."""
  jaxtyping = _jaxtyping()
  return (jaxtyping is not None and isinstance(annotation, type)
          and issubclass(annotation, jaxtyping.AbstractArray))


def _tokens(annotation: Any) -> list[str]:
  return str(getattr(annotation, "dim_str", "")).split()


def _classify(token: str) -> tuple[str, str]:
  """(kind, text) of one jaxtyping dimension: kind is "name", "expr", "fixed",
  "broadcast" or "variadic"."""
  token = token.lstrip("?")
  if token == "..." or token.startswith("*"):
    return "variadic", token.lstrip("*#")
  if token.startswith("#"):
    return "broadcast", token[1:]
  if token.startswith("_") or token.isdigit():
    return "fixed", token
  if _NAME.match(token):
    return "name", token
  if _EXPR.match(token):
    return "expr", token
  return "fixed", token


def annotation_spec(annotation: Any) -> str | None:
  """The `pj.jit` spec of a jaxtyping array annotation; None when it has no
  dimension variable (or cannot give one an axis)."""
  if not is_array_annotation(annotation):
    return None
  dims = [_classify(t) for t in _tokens(annotation)]
  variadic = [i for i, (kind, _) in enumerate(dims) if kind == "variadic"]
  if variadic and variadic != [len(dims) - 1]:
    return None  # the rank is unknown before the call: every axis fixed
  parts = []
  for kind, text in dims:
    parts.append({"name": text, "expr": text, "variadic": _VARIADIC}.get(kind, "_"))
  if not any(kind in ("name", "expr") for kind, _ in dims):
    return None
  return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _signature(fun: Callable[..., Any]) -> inspect.Signature | None:
  for eval_str in (True, False):  # string annotations (PEP 563) resolved if possible
    try:
      return inspect.signature(fun, eval_str=eval_str)
    except (NameError, TypeError, ValueError, SyntaxError):
      continue
  return None


def _positional(sig: inspect.Signature) -> list[inspect.Parameter]:
  return [p for p in sig.parameters.values()
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def annotated_specs(fun: Callable[..., Any]) -> tuple[str | None, ...] | None:
  """One spec per positional parameter of `fun` from its jaxtyping annotations,
  or None when no annotation names a dimension."""
  if _jaxtyping() is None:
    return None
  sig = _signature(fun)
  if sig is None:
    return None
  specs = tuple(annotation_spec(p.annotation) for p in _positional(sig))
  return specs if any(s is not None for s in specs) else None


# --- pj.shapecheck(f) --------------------------------------------------------------

def _dtype(annotation: Any) -> np.dtype[Any]:
  """A dtype the annotation accepts, for tracing (float32 where it may)."""
  allowed = getattr(annotation, "dtypes", None)
  if not isinstance(allowed, (tuple, list)):
    return np.dtype(np.float32)  # Shaped: any dtype
  for preferred in ("float32", "int32", "bool", "uint32", "complex64"):
    if preferred in allowed:
      return np.dtype(preferred)
  for name in allowed:
    try:
      return np.dtype(jax.dtypes.canonicalize_dtype(jax.numpy.dtype(name)))
    except TypeError:
      continue
  return np.dtype(np.float32)


def _shape_text(annotation: Any, what: str, fresh: Iterator[str]) -> str:
  """A spec naming every dim (anonymous ones get fresh names) for shapecheck."""
  parts = []
  for token in _tokens(annotation):
    kind, text = _classify(token)
    if kind == "variadic":
      raise ShapeError(
          f"pj.shapecheck: {what} is annotated {annotation.__name__}, whose rank is not "
          "fixed ('...' or '*name'); shapecheck traces with one shape per argument. What "
          "to do: give the specs yourself, pj.shapecheck(in_shapes, out_shape)(f).")
    parts.append(text if kind in ("name", "expr", "broadcast") or text.isdigit()
                 else next(fresh))
  return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _out_spec(annotation: Any, aval: Any) -> str | None:
  """The spec to compare an output with: unnamed dims take the traced ones."""
  dims = [_classify(t) for t in _tokens(annotation)]
  n_variadic = sum(kind == "variadic" for kind, _ in dims)
  extra = len(aval.shape) - (len(dims) - n_variadic)
  if n_variadic > 1 or extra < 0 or (extra and not n_variadic):
    return None  # a rank mismatch
  parts, axis = [], 0
  for kind, text in dims:
    count = extra if kind == "variadic" else 1
    for _ in range(count):
      actual = aval.shape[axis]
      parts.append(text if kind in ("name", "expr") or text.isdigit() else str(actual))
      axis += 1
  return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _out_annotations(annotation: Any) -> list[Any] | None:
  """The array annotations of a return annotation: one, or a tuple of them."""
  if is_array_annotation(annotation):
    return [annotation]
  if typing.get_origin(annotation) is tuple:
    args = typing.get_args(annotation)
    if args and all(is_array_annotation(a) for a in args):
      return list(args)
  return None


def check_annotated(fun: Callable[..., Any], constraints: Sequence[str] = ()) -> Callable[..., Any]:
  """`pj.shapecheck(f)`: traces `f` from its jaxtyping annotations and checks
  the return annotation. Returns `f`."""
  name = getattr(fun, "__name__", "function")
  if _jaxtyping(load=True) is None:
    raise ShapeError(f"pj.shapecheck({name}) reads jaxtyping annotations, and jaxtyping "
                     "is not installed: pip install jaxtyping, or give the specs "
                     "yourself, pj.shapecheck(in_shapes, out_shape)(f).")
  sig = _signature(fun)
  params = _positional(sig) if sig is not None else []
  scope = _spec.fresh_scope(constraints)
  fresh = (f"_anon{i}" for i in itertools.count())
  avals = []
  for p in params:
    if p.default is not p.empty:
      break  # this and the remaining parameters keep their defaults
    if not is_array_annotation(p.annotation):
      raise ShapeError(
          f"pj.shapecheck({name}): parameter '{p.name}' has no jaxtyping array annotation "
          "(such as Float[Array, \"n d\"]), so its shape is unknown. What to do: annotate "
          "it, or give the specs yourself, pj.shapecheck(in_shapes, out_shape)(f).")
    text = _shape_text(p.annotation, f"parameter '{p.name}'", fresh)
    try:
      shape = jc.symbolic_shape(text, scope=scope)
    except Exception as e:
      raise ShapeError(f"pj.shapecheck({name}): parameter '{p.name}': cannot use the "
                       f"annotation {p.annotation.__name__} as a shape: {e}") from None
    avals.append(jc.shaped(tuple(shape), _dtype(p.annotation)))
  outs = _out_annotations(sig.return_annotation if sig is not None else None)
  if outs is None:
    raise ShapeError(f"pj.shapecheck({name}): the return annotation is not a jaxtyping "
                     "array annotation or a tuple of them, so there is nothing to check "
                     "it against. What to do: annotate the result, or give out_shape, "
                     "pj.shapecheck(in_shapes, out_shape)(f).")
  box = []

  def flat_fun(*args: Any) -> list[Any]:
    out, tree = jax.tree.flatten(fun(*args))
    box.append(tree)
    return out

  traced = trace_flat(flat_fun, avals, ())
  traced.out_tree = box[0]
  where = f"pj.shapecheck({name}) against its annotations"
  if traced.out_tree.num_leaves != len(outs):
    raise ShapeError(f"{where}: it returns {traced.out_tree.num_leaves} array(s), the return "
                     f"annotation declares {len(outs)}.")
  specs = [_out_spec(a, aval) for a, aval in zip(outs, traced.out_avals, strict=True)]
  for i, (a, aval, spec) in enumerate(zip(outs, traced.out_avals, specs, strict=True)):
    if spec is None:
      raise ShapeError(f"{where}: output {i} has rank {len(aval.shape)} (shape "
                       f"{tuple(map(str, aval.shape))}) but is annotated {a.__name__}.")
  try:
    check_out_shape(traced.out_tree.unflatten(specs), traced, scope)
  except ShapeError as e:
    raise ShapeError(f"{where}: {e}") from None
  for i, (a, aval) in enumerate(zip(outs, traced.out_avals, strict=True)):
    allowed = getattr(a, "dtypes", None)
    if isinstance(allowed, (tuple, list)) and str(aval.dtype) not in allowed:
      raise ShapeError(f"{where}: output {i} has dtype {aval.dtype}, which "
                       f"{a.__name__} does not allow.")
  return fun
