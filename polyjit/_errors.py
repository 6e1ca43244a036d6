"""Exception types and the long messages that explain them.

Every error polyjit raises says what happened, where (the argument, axis or
primitive, and the user's source line), and what to do about it.
"""

from __future__ import annotations


class PolyjitError(Exception):
  """Base class of polyjit's errors."""


class ShapeError(PolyjitError, ValueError):
  """Shapes or sizes that do not fit the declared polymorphic specs."""


class MaskingError(PolyjitError, NotImplementedError):
  """A computation polyjit cannot run exactly on padded arrays.

  Attributes:
    primitive: the name of the JAX primitive that could not be masked.
    source: the user's source line that emitted it.
  """

  def __init__(self, message: str, *, primitive: str | None = None,
               source: str | None = None):
    super().__init__(message)
    self.primitive = primitive
    self.source = source


def no_rule_message(prim_name: str, source: str, padded: list[str]) -> str:
  padded_txt = "; ".join(padded) if padded else "(sizes in its parameters)"
  return (
      f"polyjit cannot mask the primitive '{prim_name}' {source}: it has no "
      f"masking rule, and its operands have padded axes: {padded_txt}.\n"
      "Running it on padded data could let padding change the result, so "
      "polyjit refuses instead of guessing.\n"
      "What to do: declare the affected axes with a fixed size (\"_\" in the spec, "
      "or None for the whole argument) if they do not really vary; or compute this "
      "step outside the masked function; or use pj.jit, whose automatic mode "
      "falls back to exact shapes. The coverage table (docs/coverage.md) lists "
      "what is supported.")


class CompileLimitError(PolyjitError, RuntimeError):
  """A function compiled more often than `pj.assert_max_compiles` allows."""
