"""The probes of JAX's message texts that polyjit reads (rows of `registry.ROWS`).

polyjit parses a few of JAX's error texts, always through `messages.py`, to
explain an error with what to do (an inconclusive comparison names the sizes
to bound; a refusal at a symbolic size says what to use instead). Each probe
provokes the error on a tiny case and checks that the parse still finds what it
needs; a text that changed fails its probe, never a user's call.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax import export as _export

from .core import InconclusiveDimensionOperation, shaped
from .messages import inconclusive_comparison, needs_concrete_size, trace_refusal_unchecked
from .probes import _ab
from .registry import REFUSALS, TEXTS, internal


@internal("InconclusiveDimensionOperation text \"comparison 'a' >= 'b' is inconclusive\"",
          TEXTS, "text", "names the sizes to bound in a constraint")
def _inconclusive_text() -> None:
  a, b = _ab()
  try:
    _ = a >= b
  except InconclusiveDimensionOperation as e:
    assert inconclusive_comparison(e) == ("a", ">=", "b"), str(e)
    return
  raise AssertionError("no InconclusiveDimensionOperation")


@internal("texts of JAX's NotImplementedError for lax.associative_scan and "
          "jax.random.permutation at a symbolic size", REFUSALS, "text",
          "the refusal is explained with what to do instead (`_masking/refusals.py`)")
def _refusal_texts() -> None:
  n, = _export.symbolic_shape("n")
  cases: list[tuple[Any, str]] = [
      (lambda x: jax.lax.associative_scan(jax.numpy.add, x), "associative_scan"),
      (lambda x: jax.random.permutation(jax.random.key(0), x), "permutation")]
  for fn, name in cases:
    try:
      jax.eval_shape(fn, shaped((n,), np.float32))
    except NotImplementedError as e:
      assert trace_refusal_unchecked(e) == name, str(e)
      continue
    raise AssertionError(f"JAX traced {name} at a symbolic size")


@internal("TypeError texts for a symbolic size used as an int (`range(n)`, `int(n)`)",
          TEXTS, "text", "the error says to keep sizes symbolic")
def _concrete_size_texts() -> None:
  n: Any
  n, = _export.symbolic_shape("n")
  uses: list[Any] = [range, int]
  for use in uses:
    try:
      use(n)
    except Exception as e:
      assert needs_concrete_size(e), (type(e).__name__, str(e))
      continue
    raise AssertionError(f"{use.__name__}(n) accepted a symbolic size")
