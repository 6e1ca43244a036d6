"""`jax_debug_nans` / `jax_debug_infs`: reading them, turning them off, and
JAX's internal error for a program's outputs.

Those flags check every output of a program, and every primitive run
eagerly. A masked program's padding holds values the user's program never
computes (a sort rule's NaN fill, 0/0 or log 0 of padding): the flags must
see only the valid region. polyjit runs its own evaluation with the checks
off where it can and checks what the user sees itself (`pj.jit`'s outputs
at their logical shapes, a masked call's outputs, whose padding it zeroes
while the flags are on: `_masking/calls.py`).

`InternalFloatingPointError` is what JAX raises from a compiled program's
output check (`dispatch.check_special`); `jax.jit` turns it into a
FloatingPointError by running the function again without `jit`. A program
called through `jax.stages.Compiled` (pj.jit's) lets it escape.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from jax._src import api_util as _api_util


class _NeverRaised(Exception):
  """Stands for `InternalFloatingPointError` in a JAX without it."""


InternalFloatingPointError: type[Exception] = getattr(
    _api_util, "InternalFloatingPointError", _NeverRaised)


def float_checks() -> tuple[bool, bool]:
  """(jax_debug_nans, jax_debug_infs) as set now (the context managers
  included): 0.1 us each."""
  config: Any = jax.config
  return bool(config.jax_debug_nans), bool(config.jax_debug_infs)


@contextlib.contextmanager
def float_checks_off() -> Iterator[None]:
  """Both checks off within the block (per thread, as JAX's own context
  managers are)."""
  with jax.debug_nans(False), jax.debug_infs(False):
    yield


def floats_found(values: Sequence[Any], nans: bool, infs: bool) -> str | None:
  """'nan' or 'inf' if one of `values` (arrays, scalars) holds what the
  checks look for, else None."""
  for value in values:
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
      continue
    host = np.asarray(value)
    if nans and np.isnan(host).any():
      return "nan"
    if infs and np.isinf(host).any():
      return "inf"
  return None
