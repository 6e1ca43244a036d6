"""Source locations: where an equation came from, which frames are the user's."""
from __future__ import annotations

import os
import typing
from typing import Any

from jax._src import core as _core
from jax._src import source_info_util as _siu

from .core import JaxprEqn

_JAX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(_core.__file__)))

def eqn_context(eqn: JaxprEqn) -> _EqnContext:
  """Context that gives ops emitted for `eqn` its source location and ctx."""
  name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
  return _EqnContext(eqn, name_stack)


class _EqnContext:
  __slots__ = ("_eqn", "_name_stack", "_managers")

  def __init__(self, eqn: JaxprEqn, name_stack: Any) -> None:
    self._eqn = eqn
    self._name_stack = name_stack
    self._managers: Any = None

  def __enter__(self) -> None:
    self._managers = (
        _siu.user_context(self._eqn.source_info.traceback,
                          name_stack=self._name_stack),
        self._eqn.ctx.manager)
    for m in self._managers:
      m.__enter__()

  def __exit__(self, *exc: Any) -> typing.Literal[False]:
    for m in reversed(self._managers):
      m.__exit__(*exc)
    return False


# polyjit's own frames are not the user's: leave them out of source lines.

# polyjit's own frames are not the user's: leave them out of source lines.
# (Registered with JAX by `install_patches()`.)
_POLYJIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_line(eqn: JaxprEqn | None) -> str:
  """Where an equation came from: 'at model.py:12 (loss)', or 'in `sort`'.

  When JAX kept no user frame (a library function called directly, or frames
  cut at a jit boundary), names the function the equation came from instead.
  """
  if eqn is None:
    return "at an unknown location"
  try:
    line = _siu.summarize(eqn.source_info)
  except Exception:  # pragma: no cover - defensive: never fail an error path
    line = ""
  if line and line != "unknown":
    return f"at {line}"
  name = str(_siu.current_name_stack() + eqn.source_info.name_stack)
  return f"in `{name}`" if name else "at an unknown location"


def user_line_of(error: BaseException) -> str | None:
  """'file:line' of the innermost frame of `error`'s traceback that is not
  JAX's or polyjit's (the user's line that failed), or None."""
  tb, found = error.__traceback__, None
  while tb is not None:
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if not (path.startswith(_JAX_DIR) or path.startswith(_POLYJIT_DIR)):
      found = f"{path}:{tb.tb_lineno}"
    tb = tb.tb_next
  return found


def library_function_of(error: BaseException) -> str | None:
  """The JAX function the user called when `error` was raised inside JAX
  (`jax.numpy.convolve`), or None when it was raised in user code."""
  tb, called = error.__traceback__, None
  last_user = None
  frames = []
  while tb is not None:
    frames.append(tb.tb_frame)
    tb = tb.tb_next
  for i, frame in enumerate(frames):
    path = os.path.abspath(frame.f_code.co_filename)
    if not (path.startswith(_JAX_DIR) or path.startswith(_POLYJIT_DIR)):
      last_user = i
  if last_user is None or last_user == len(frames) - 1:
    return None
  for frame in frames[last_user + 1:]:
    module = frame.f_globals.get("__name__", "")
    if module.startswith("polyjit"):
      return None
    if module in _WRAPPER_MODULES or module.startswith("jax._src.interpreters"):
      continue
    for prefix, short in (("jax._src.numpy", "jnp"), ("jax._src.lax", "lax"),
                          ("jax._src.scipy", "jax.scipy"), ("jax._src.nn", "jax.nn")):
      if module.startswith(prefix):
        return f"{short}.{frame.f_code.co_name}"
    return f"{module}.{frame.f_code.co_name}"
  return None  # only JAX's call machinery: the user's own line failed


# Frames of JAX's own call machinery (jit dispatch, traceback filtering).
_WRAPPER_MODULES = {"jax._src.traceback_util", "jax._src.pjit", "jax._src.api",
                    "jax._src.export.shape_poly", "jax._src.core",
                    "jax._src.linear_util", "jax._src.profiler", "jax._src.api_util"}


def current_user_line() -> str:
  """The innermost user frame of the current Python stack."""
  frame = _siu.user_frame(_siu.current().traceback)
  return _siu._summarize_frame(frame) if frame is not None else "unknown location"
