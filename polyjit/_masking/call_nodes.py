"""The shell every call node shares (`_jax/calls.py`'s `CallNode`).

A node is a function of a fixed list of arrays, bound as one
`polyjit_masked_call` equation. The shell holds what every node does the same
way: its input avals, its `jaxpr` (traced from `impl` once, on first use:
abstract evaluation, eager evaluation and lowering read it), and no output
avals known without tracing. What the function *is* (`impl`) and what its
derivatives and batching are (`jvp`, `transpose`, `batch`) each node says:
the masked evaluation and its derivative paths (`calls.py`), a linear map
with its own transpose (`native._Linear`).
"""
from __future__ import annotations

from typing import Any

from .. import _jax as jc


class NodeShell:
  """In avals, a lazily traced `jaxpr` of `impl`, unknown out avals."""

  def __init__(self, in_avals: tuple[Any, ...]) -> None:
    self.in_avals = in_avals
    self._jaxpr: jc.ClosedJaxpr | None = None

  @property
  def jaxpr(self) -> jc.ClosedJaxpr:
    if self._jaxpr is None:
      self._jaxpr = jc.make_closed_jaxpr(lambda *a: self.impl(*a), list(self.in_avals))
    return self._jaxpr

  def out_avals(self) -> list[Any] | None:
    return None

  def impl(self, *args: Any) -> list[Any]:
    raise NotImplementedError

  def jvp(self, primals: list[Any], tangents: list[Any | None]
          ) -> tuple[list[Any], list[Any | None]]:
    raise NotImplementedError

  def transpose(self, cts: list[Any], args: list[Any | None]) -> list[Any | None]:
    raise NotImplementedError
