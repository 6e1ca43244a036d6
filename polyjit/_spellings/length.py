"""`len(x)` of an array with a dynamic leading axis, while polyjit traces.

Python's `len()` calls `type(x).__len__` and converts what it returns to a
C integer, so no object JAX's `Tracer.__len__` could return would carry a
symbolic size through it: an `int` subclass comes out of `len()` as a plain
int, and a `_DimExpr` is refused ("cannot be interpreted as an integer"). What
`len(x)` means is `x.shape[0]`, and that is what polyjit traces with: a
symbolic size, which serves every size (`len(ts) > 0`, `loss / len(batch)`,
`jnp.arange(len(x))`, `lax.scan(..., length=len(x))` all work with it, as
they do with `x.shape[0]`).

So the name `len` itself is swapped, not the method: `builtins.len` is one of
`_jax.swaps.SWAP_SITES`, put in place by `trace_spellings()` for the duration
of a symbolic trace and restored after it (the last trace to leave restores
the builtin; nested traces are counted). Python code looks `len` up in the
builtins module when it runs (`LOAD_GLOBAL`), so code in any module sees the
swap, dynamax's and diffrax's included. The replacement answers
`x.aval.shape[0]` only when all of these hold, and otherwise calls the
builtin with the same argument, so its result and its errors are the
builtin's:

* the calling thread is inside a polyjit trace (the swap's wrapper checks a
  thread-local depth: another thread, during the trace, gets the builtin's
  answer);
* `x` is a JAX tracer of rank >= 1 whose leading size is symbolic (a size
  polyjit traces with); every other object, a concrete leading size
  included, gets the builtin's int;
* the caller is user code: not JAX's nor polyjit's own modules (JAX's
  internals ask `len()` for a Python int, and a symbolic answer there would
  change what they do; there the builtin's refusal stands as before).

Where the length must be a Python number, `range(len(x))`, `[0] * len(x)`,
`np.zeros(len(x))`, the symbolic size is converted with `__index__`, which
polyjit refuses at the user's line (`SizeValueError`, as `range(x.shape[0])`),
saying what to do. Not intercepted: a reference to the builtin taken before
the trace (`from builtins import len as _len`, `map(_len, ...)` bound
earlier) and C code's `PyObject_Size`; they get the builtin, which refuses
as before.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable
from typing import Any

from .. import _jax as jc


def length(original: Callable[[Any], int], obj: Any, /) -> Any:
  """`len(obj)`: a symbolic leading size of a traced array from user code."""
  if isinstance(obj, jc.Tracer):
    shape = getattr(getattr(obj, "aval", None), "shape", ())
    # frame 0: here; 1: the swap's wrapper; 2: the code that called `len`
    if (shape and jc.is_symbolic_dim(shape[0])
        and jc.is_user_path(sys._getframe(2).f_code.co_filename)):
      return shape[0]
  return original(obj)


jc.register_spellings({builtins.len: length})
