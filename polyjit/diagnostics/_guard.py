"""`pj.assert_max_compiles`: a compile budget for tests and serving.

As a decorator it counts the backend compiles each call of the function causes
(measured with `jax.monitoring`, in the calling thread) and raises
`pj.CompileLimitError` from the call that goes over the budget, naming the
arguments whose shapes were new and the shapes they had before. As a context
manager it watches every `jax.jit` function in the block (see `pj.watch`) and
raises at the end of the block. After warm-up, `with pj.assert_max_compiles(0):`
forbids any compile.
"""

from __future__ import annotations

import functools
import inspect
from types import TracebackType
from typing import Any, Callable, ContextManager, Literal

import jax
import numpy as np

from .._caching.compiles import count_compiles
from .._masking.errors import CompileLimitError
from .._jit.function import JitFunction
from ._watch import WatchReport, watch


class assert_max_compiles:
  """Raise `pj.CompileLimitError` when more than `n` compiles happen."""

  def __init__(self, n: int) -> None:
    if n < 0:
      raise ValueError(f"the compile budget must be >= 0, got {n}")
    self.n = n
    self.compiles = 0
    self._watch: ContextManager[WatchReport] | None = None
    self._report: WatchReport | None = None

  # --- decorator -------------------------------------------------------------

  def __call__(self, fun: Callable[..., Any]) -> Callable[..., Any]:
    seen: dict[str, list[Any]] = {}
    names = _parameter_names(fun)
    name = getattr(fun, "__name__", "function")

    @functools.wraps(fun)
    def guarded(*args: Any, **kwargs: Any) -> Any:
      with count_compiles(this_thread_only=True) as compiles:
        out = fun(*args, **kwargs)
      shapes = _argument_shapes(names, args, kwargs)
      new = {k: v for k, v in shapes.items() if v not in seen.get(k, [])}
      self.compiles += len(compiles)
      if self.compiles > self.n:
        raise CompileLimitError(_message(name, self.compiles, self.n, new, seen, fun))
      for k, v in shapes.items():
        if v not in seen.setdefault(k, []):
          seen[k].append(v)
      return out

    guarded.compile_budget = self  # type: ignore[attr-defined]  # read by tests and users
    return guarded

  # --- context manager -------------------------------------------------------

  def __enter__(self) -> WatchReport:
    self._watch = watch()
    self._report = self._watch.__enter__()
    return self._report

  def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
               traceback: TracebackType | None) -> Literal[False]:
    assert self._watch is not None and self._report is not None, "__exit__ before __enter__"
    self._watch.__exit__(kind, error, traceback)
    if kind is not None:
      return False
    total = sum(f.compiles for f in self._report.functions.values())
    if total > self.n:
      details = []
      for f in self._report.functions.values():
        axes = "; ".join(f"argument `{p}` axis {a} took sizes {sorted(s)}"
                         for (p, a), s in sorted(f.varying.items()))
        details.append(f"{f.name} compiled {f.compiles} time(s)" + (f": {axes}" if axes else ""))
      raise CompileLimitError(
          f"{total} compiles in a block limited to {self.n}: " + "; ".join(details) +
          ".\nWhat to do: warm the functions up before the block, or use pj.jit "
          "so that new sizes reuse a bucket's program.")
    return False


def _parameter_names(fun: Callable[..., Any]) -> list[str]:
  try:
    return list(inspect.signature(fun).parameters)
  except (TypeError, ValueError):
    return []


def _argument_shapes(names: list[str], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> dict[str, Any]:
  named = {(names[i] if i < len(names) else f"arg{i}"): a for i, a in enumerate(args)}
  named.update(kwargs)
  return {k: jax.tree.map(lambda x: tuple(np.shape(x)), v) for k, v in named.items()}


def _advice(fun: Callable[..., Any]) -> str:
  """What to do, for what `fun` already is."""
  if isinstance(fun, JitFunction):
    return ("it is already a pj.jit function, so each new bucket (or a call it could not "
            "mask) compiles once: see pj.explain on it for each compile's cause; precompile "
            "the buckets before the budgeted calls (f.precompile(..., sizes=...)), choose "
            "coarser buckets (buckets=...), or raise the budget to the buckets your sizes need")
  if hasattr(fun, "lower") and hasattr(fun, "trace"):  # a jax.jit function
    return ("if that argument's size varies, use pj.jit in place of jax.jit (new sizes "
            "then reuse a bucket's program), or pad it yourself")
  return ("if that argument's size varies, decorate the function (or the jax.jit functions "
          "it calls) with pj.jit (new sizes then reuse a bucket's program), or pad it yourself")


def _message(name: str, compiles: int, budget: int, new: dict[str, Any],
             seen: dict[str, list[Any]], fun: Callable[..., Any]) -> str:
  parts = []
  for arg, shape in new.items():
    before = seen.get(arg)
    parts.append(f"argument `{arg}` had the new shape {shape}" +
                 (f" (before: {', '.join(map(str, before[-5:]))})" if before else ""))
  culprit = "; ".join(parts) if parts else "no argument had a new shape"
  return (f"{name} compiled {compiles} time(s), over its budget of {budget}: {culprit}.\n"
          f"What to do: {_advice(fun)}.")
