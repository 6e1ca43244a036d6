"""Source locations, and the one walker that tells the user's frames apart.

Whether a frame is the user's is decided by its file's path *components*: a
file is JAX's or polyjit's when it lies inside JAX's package directory or
polyjit's (`os.path.commonpath`), never by a string prefix, so that user code
in packages named `jax_md/`, `jaxopt/` or `polyjit_extras/` is the user's.
Every walk over frames (a traceback, the current stack) goes through
`traceback_frames`, `stack_outward` and `is_user_path` here.
"""
from __future__ import annotations

import functools
import linecache
import dis
import os
import re
import sys
import sysconfig
import types
import typing
from typing import Any, Iterator

from jax._src import core as _core
from jax._src import source_info_util as _siu

from .core import JaxprEqn

_JAX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(_core.__file__)))
# polyjit's own frames are not the user's: leave them out of source lines.
# (Registered with JAX by `install_patches()`.)
_POLYJIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _inside(path: str, directory: str) -> bool:
  try:
    return os.path.commonpath([path, directory]) == directory
  except ValueError:  # different drives (Windows), or a relative and an absolute path
    return False


@functools.lru_cache(maxsize=4096)
def is_polyjit_path(path: str) -> bool:
  """Whether a source file is part of polyjit (by path components)."""
  return _inside(os.path.abspath(path), _POLYJIT_DIR)


@functools.lru_cache(maxsize=4096)
def is_user_path(path: str) -> bool:
  """Whether a source file is the user's: inside neither JAX's package
  directory nor polyjit's (by path components, so `site-packages/jax_md/` is
  the user's although its path string starts with JAX's directory's)."""
  path = os.path.abspath(path)
  return not (_inside(path, _JAX_DIR) or _inside(path, _POLYJIT_DIR))


def passed_user_code(error: BaseException) -> bool:
  """Whether a raised exception travelled through a frame of user code (its
  traceback holds one): then user code caught it, or let it pass."""
  tb = error.__traceback__
  while tb is not None:
    if is_user_path(tb.tb_frame.f_code.co_filename):
      return True
    tb = tb.tb_next
  return False


def user_code_can_catch() -> bool:
  """Whether a frame of user code on the current stack, up to the polyjit
  trace that runs it, is inside a `try` or `with` block (or is a
  generator): an exception JAX raises now could be stopped there. Read from the code's exception table (`dis`'s private
  parser, Python 3.11+); True when it cannot be read."""
  parse = getattr(dis, "_parse_exception_table", None)
  seen_user = False
  for frame in stack_outward(1):
    code = frame.f_code
    if not is_user_path(code.co_filename):
      # polyjit's own frame outside the user's: the trace's entry, whose
      # callers (a test runner's `try`) never see what the trace raises
      if seen_user and is_polyjit_path(code.co_filename):
        break
      continue
    seen_user = True
    if parse is None:
      return True
    try:
      entries = parse(code)
    except Exception:
      return True
    if any(e.start <= frame.f_lasti < e.end for e in entries):
      return True
  return False


def stack_outward(depth: int) -> Iterator[types.FrameType]:
  """The current stack from the frame `depth` levels above the caller, outward."""
  frame: types.FrameType | None = sys._getframe(depth + 1)
  while frame is not None:
    yield frame
    frame = frame.f_back


def traceback_frames(error: BaseException) -> list[tuple[types.FrameType, int]]:
  """(frame, line number) of `error`'s traceback, outermost first."""
  tb, frames = error.__traceback__, []
  while tb is not None:
    frames.append((tb.tb_frame, tb.tb_lineno))
    tb = tb.tb_next
  return frames


def stacklevel_outside_polyjit() -> int:
  """The `stacklevel` that makes `warnings.warn`, called by the caller of this
  function, point at the first frame outside polyjit (the user's call)."""
  level = 2
  for frame in stack_outward(2):
    if not is_polyjit_path(frame.f_code.co_filename):
      break
    level += 1
  return level


def stacklevel_at_user_code() -> int:
  """Like `stacklevel_outside_polyjit`, but past JAX's frames too: the first
  frame of user code (where a transformation's rule runs, JAX's frames lie
  between polyjit's and the user's). The outermost frame if none is."""
  level = 2
  for frame in stack_outward(2):
    path = frame.f_code.co_filename
    if is_user_path(path) and not _inside(os.path.abspath(path), _STDLIB_DIR):
      return level
    level += 1
  return level - 1


# (contextlib's frames, between JAX's: not the user's line)
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"])


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


def current_source_line() -> str | None:
  """The user's line of the equation JAX is transforming now (JAX keeps its
  source info current while it evaluates a jaxpr: a derivative rule of it
  runs there), 'file:line (function)', or None."""
  try:
    info = _siu.current()
    line = _siu.summarize(info)
    frames: list[tuple[str, str]] = (
        [(f.file_name, f.function_name) for f in info.traceback.frames]
        if info.traceback is not None else [])
  except Exception:  # pragma: no cover - defensive: never fail an error path
    return None
  if line and line != "unknown":
    return line
  # (JAX kept no user frame, only the library function the user called)
  for file_name, function_name in reversed(frames):
    path = file_name.replace(os.sep, "/")
    if "/jax/_src/" in path:
      module = "jax._src." + path.split("/jax/_src/")[-1].removesuffix(".py").replace("/", ".")
      for prefix, short in (("jax._src.numpy", "jnp"), ("jax._src.lax", "lax"),
                            ("jax._src.scipy", "jax.scipy"), ("jax._src.nn", "jax.nn")):
        if module.startswith(prefix):
          module = short + module[len(prefix):]
      return f"{module}.{function_name}"
  return None


def user_line_of(error: BaseException) -> str | None:
  """'file:line' of the innermost frame of `error`'s traceback that is not
  JAX's or polyjit's (the user's line that failed), or None."""
  found = None
  for frame, line in traceback_frames(error):
    if is_user_path(frame.f_code.co_filename):
      found = f"{os.path.abspath(frame.f_code.co_filename)}:{line}"
  return found


def library_function_of(error: BaseException) -> str | None:
  """The JAX function the user called when `error` was raised inside JAX
  (`jax.numpy.convolve`), or None when it was raised in user code."""
  frames = [frame for frame, _ in traceback_frames(error)]
  last_user = None
  for i, frame in enumerate(frames):
    if is_user_path(frame.f_code.co_filename):
      last_user = i
  if last_user is None or last_user == len(frames) - 1:
    return None
  for frame in frames[last_user + 1:]:
    module = frame.f_globals.get("__name__", "")
    if module == "polyjit" or module.startswith("polyjit."):
      return None
    if module in _WRAPPER_MODULES or module.startswith("jax._src.interpreters"):
      continue
    for prefix, short in (("jax._src.numpy", "jnp"), ("jax._src.lax", "lax"),
                          ("jax._src.scipy", "jax.scipy"), ("jax._src.nn", "jax.nn")):
      if module.startswith(prefix):
        return f"{short}.{frame.f_code.co_name}"
    return f"{module}.{frame.f_code.co_name}"
  return None  # only JAX's call machinery: the user's own line failed


def innermost_jax_function(error: BaseException) -> str | None:
  """The innermost JAX function (not its call machinery) in `error`'s
  traceback, as 'module.function' (`jax._src.lax.linalg.qr_jvp_rule`), or None."""
  found = None
  for frame, _ in traceback_frames(error):
    module = frame.f_globals.get("__name__", "")
    if (module.startswith("jax._src.") and module not in _WRAPPER_MODULES
        and not module.startswith("jax._src.interpreters")):
      found = f"{module}.{frame.f_code.co_name}"
  return found


# JAX functions that need a size as a Python int, by the call in the user's
# line that failed (JAX filters its own frames out of the traceback).
_STATIC_SIZE_CALLS = (
    (re.compile(r"\bscan\s*\((?s:.*)\blength\s*="), "lax.scan"),
    (re.compile(r"\breduce\s*\("), "lax.reduce"),
)


def static_size_user(error: BaseException) -> str | None:
  """`lax.scan` when the user's call that raised `error` is a scan with
  `length=`, `lax.reduce` when it is a `lax.reduce` (whose derivative, with a
  custom reducer, needs a plain-int length); else None."""
  tb, call = error.__traceback__, None
  while tb is not None:
    if is_user_path(tb.tb_frame.f_code.co_filename):
      call = tb
    tb = tb.tb_next
  if call is None:
    return None
  code = call.tb_frame.f_code
  try:
    line, end, col, end_col = list(code.co_positions())[call.tb_lasti // 2]
  except (IndexError, ValueError):
    return None
  if line is None or end is None or col is None or end_col is None:
    return None
  lines = [linecache.getline(code.co_filename, i) for i in range(line, end + 1)]
  if not lines or not lines[0]:
    return None
  lines[-1] = lines[-1][:end_col]
  lines[0] = lines[0][col:]
  text = "".join(lines)
  for pattern, name in _STATIC_SIZE_CALLS:
    if pattern.search(text):
      return name
  return None


# Frames of JAX's own call machinery (jit dispatch, traceback filtering).
_WRAPPER_MODULES = {"jax._src.traceback_util", "jax._src.pjit", "jax._src.api",
                    "jax._src.export.shape_poly", "jax._src.core",
                    "jax._src.linear_util", "jax._src.profiler", "jax._src.api_util"}


def current_user_line() -> str:
  """The innermost user frame of the current Python stack, as
  'file:line (function)'."""
  for frame in stack_outward(1):
    if is_user_path(frame.f_code.co_filename):
      return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
  return "unknown location"
