"""The class a size shows to user code while polyjit traces: `int`.

Under jax.jit a size (`x.shape[0]`, `len(x)`, `n // 2`, `x.size`) is a
Python int, so `isinstance(n, int)` is True and code branches on it:
`if isinstance(n, int): <path A> else: <path B>` (argument checks in
libraries, `isinstance(n, numbers.Integral)`, `functools.singledispatch`). A
symbolic size is JAX's `DimExpr`, which took path B: a trace that silently
computed something jax.jit never computes, a wrong answer.

Python's `isinstance(obj, cls)`, when `type(obj)` is not a subclass of
`cls`, asks `obj.__class__` (the hook `unittest.mock` uses); ABCs
(`numbers.Integral`) and `singledispatch` ask it as well. So `DimExpr` gets
a `__class__` property: while this thread is inside polyjit's trace (the
oracle of `decisions.size_decisions` is set) and the code that asked is the
user's (not JAX's nor polyjit's; `abc`, `typing` and `functools` ask on their
caller's behalf, so the caller is the one judged), it answers `int`, what
jax.jit's value would answer; everywhere else, the size's own class. What
user code then does with the size is what it does with `x.shape[0]`:
arithmetic stays symbolic, comparisons go to the oracle, and a conversion
to a Python number (`range(n)`, `int(n)`) is refused at the user's line.

Not answered: `type(n)` reads the C type, which no hook reaches, so
`type(n) is int` is still False while polyjit traces (it is with
`jax.export` too; docs/pitfalls.md says so, and the checking mode catches it).

`setattr(DimExpr, "__class__", ...)` cannot install it (type's own
`__class__` setter takes the value as the class's new metaclass), so the
property is written into the class's namespace dict and the type's
attribute caches are invalidated (`PyType_Modified`, CPython's public API).
The probe (`probes.py`) checks the class's layout first.
"""
from __future__ import annotations

import abc
import ctypes
import functools
import gc
import os
import sys
import typing
from typing import Any

from .dims import DimExpr
from .frames import is_user_path

# Modules whose functions ask `__class__` for their caller (`isinstance` with an ABC, a
# Protocol, `singledispatch`): their frames are passed over.
_ASKING_FOR_CALLER = frozenset(os.path.abspath(m.__file__) for m in (abc, typing, functools)
                               if m.__file__)

_THROUGH = "through"   # a module that asks for its caller
_user_file: dict[str, bool | str] = {}


def _asked_by_user() -> bool:
  frame = sys._getframe(2)   # 0: here; 1: the property; 2: the code that asked
  while frame is not None:
    filename = frame.f_code.co_filename
    kind = _user_file.get(filename)
    if kind is None:
      path = os.path.abspath(filename)
      kind = _THROUGH if path in _ASKING_FOR_CALLER else is_user_path(path)
      if os.path.isabs(filename):
        _user_file[filename] = kind
    if kind is not _THROUGH:
      return bool(kind)
    frame = frame.f_back   # type: ignore[assignment]
  return False


def install_size_class(state: Any) -> None:
  """Gives `DimExpr` the `__class__` above; `state.oracle` (a thread-local)
  is set while this thread is inside polyjit's trace. Idempotent."""
  namespace = gc.get_referents(DimExpr.__dict__)
  if len(namespace) != 1 or not isinstance(namespace[0], dict):
    raise LookupError("DimExpr's namespace is not a dict (probe: size_class)")
  if "__class__" in namespace[0]:
    return

  def __class__(self: Any) -> type:
    if state.oracle is not None and _asked_by_user():
      return int
    return type(self)

  namespace[0]["__class__"] = property(__class__)
  ctypes.pythonapi.PyType_Modified(ctypes.py_object(DimExpr))
