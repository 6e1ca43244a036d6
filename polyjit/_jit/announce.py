"""What `pj.jit` says when a structure runs jax.jit's own programs.

Three causes, each said by the `Announcer` of one `pj.jit` function, per its
`fallback=` option: the function cannot be masked (`fall_back`: every shape
compiled exactly), one side of a size comparison fails traced (`side`: that
side's sizes exact), and a `jax.Array` of a dtype the x64 mode would not make
(`uncanonical`). Each is logged every time (the `polyjit` logger); with
`fallback='warn'` a `pj.FallbackWarning` is shown once per cause and
function; with `'error'` a fall-back raises instead (a failing side is
`planner.decide`'s to raise); `'silent'` leaves the log alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

import jax
import numpy as np

from .._masking.errors import FallbackWarning, MaskingError, PolyjitError, warn_user

if TYPE_CHECKING:
  from .plans import Structure

logger = logging.getLogger("polyjit")
logger.addHandler(logging.NullHandler())  # a library prints nothing unless asked


def first_line(error: Exception) -> str:
  """`error` as its type and the first line of its message."""
  text = str(error).strip()
  return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


class Announcer:
  """The fall-back messages of one `pj.jit` function (`name`), said per
  `fallback` ('warn', 'silent' or 'error'), each warning once per cause."""

  def __init__(self, name: str, fallback: str) -> None:
    self.name = name
    self.fallback = fallback
    self._warned: set[str] = set()

  def _say(self, message: str, cause: str) -> None:
    logger.warning("%s", message)
    if self.fallback == "warn" and cause not in self._warned:
      self._warned.add(cause)
      warn_user(message, FallbackWarning)

  def side(self, error: Exception) -> None:
    """A side whose sizes jax.jit runs (each its own program): said once."""
    reason = first_line(error)
    self._say(
        f"pj.jit({self.name}) compiles the sizes on one side of a size comparison "
        f"exactly, one program per shape, because the function fails traced there: "
        f"{reason}\nWhat to do: if the function is meant to work at those sizes, see the "
        f"full error with pj.jit({self.name}, fallback='error'); else pass "
        "fallback='silent'.", f"side: {reason}")

  def uncanonical(self, struct: Structure, leaves: Sequence[Any]) -> None:
    """A call with a `jax.Array` of a dtype that the x64 mode would not make
    runs jax.jit's own program (`args.uncanonical_array`): said once, per
    `fallback=`."""
    assert struct.uncanonical is not None
    x = leaves[struct.uncanonical]
    on = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined, unused-ignore]
    reason = (f"the argument {struct.leaf_names[struct.uncanonical]} is a {x.dtype} "
              f"jax.Array while jax_enable_x64 is {'on' if on else 'off'} (made under "
              f"jax.enable_x64({not on}))")
    message = (
        f"pj.jit({self.name}) runs these calls as jax.jit does, one program per shape: "
        f"{reason}, and jax.jit keeps its dtype, which polyjit's padded copy cannot.\n"
        "What to do: convert it (x.astype(jnp."
        f"{np.dtype(jax.dtypes.canonicalize_dtype(x.dtype)).name})), or set "
        "jax_enable_x64 for the whole program.")
    if self.fallback == "error":
      raise MaskingError(message)
    self._say(message, reason)

  def fall_back(self, struct: Structure, error: Exception) -> None:
    """Automatic mode cannot mask this structure: run exact shapes, and say so."""
    reason = first_line(error)
    if self.fallback == "error":
      if isinstance(error, PolyjitError):
        raise error
      raise MaskingError(f"pj.jit({self.name}) cannot run with dynamic sizes: {reason}") \
          from error
    struct.fall_back(reason)
    self._say(
        f"pj.jit({self.name}) cannot run with dynamic sizes, so it compiles every "
        f"distinct shape exactly, as jax.jit does: {reason}\nWhat to do: see the full "
        f"error with pj.jit({self.name}, fallback='error'); give polymorphic_shapes (and "
        "constraints) so that only the axes that really vary are dynamic; or pass "
        "fallback='silent' to accept compiling per shape.", reason)
