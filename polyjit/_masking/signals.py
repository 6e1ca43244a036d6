"""A trace whose internal signal did not arrive is discarded, never used.

polyjit steers a trace of user code by raising exceptions into it from the
size hooks (`_jax/decisions.py`): `LeftSharedScope` (trace again in a fresh
scope), `variants._Settle` (trace again with a constraint), and its refusals
(`SizeValueError` for `int(n)`, a `MaskingError` for a question it cannot
answer); and JAX raises `InconclusiveDimensionOperation` for a comparison in
its own code that only symbolic sizes make undecidable, which polyjit settles
as a guard. Each travels up through the user's frames before polyjit's handler
gets it, and user code can stop it: a bare `except:`, `except BaseException`,
`contextlib.suppress`, an `__exit__` that returns True, a `return` in a
`finally`, a generator that swallows it, or `except TypeError` around
`int(x.shape[0])` (jax.jit would have taken the `try` side). The trace then
goes on along a path polyjit never chose, and its result is wrong with no
error.

So the hooks record every exception they raise into user code
(`jc.signal_raised`), and `answering(oracle)`, the block a trace of user code
runs in, checks on its way out that the first one arrived:

* it arrived (the block ends with it): nothing to do;
* it did not (the trace returned, or ended with another exception, the
  signal's wrapper `raise RuntimeError(...) from e` included): the trace is
  discarded. An internal signal is raised again in its place, so its handler
  acts as designed (a fresh scope, where no signal is needed; a settled
  constraint); a refusal reaches the user: as raised when the user's code
  wrapped it, and as a `MaskingError` that says the function caught it when
  the function went on.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .. import _jax as jc
from .errors import MaskingError, PolyjitError


def _in_chain(signal: BaseException, exc: BaseException) -> bool:
  """Whether `exc` is `signal` or was raised while handling it (`from e`)."""
  seen: set[int] = set()
  todo: list[BaseException | None] = [exc]
  while todo:
    e = todo.pop()
    if e is None or id(e) in seen:
      continue
    if e is signal:
      return True
    seen.add(id(e))
    todo += [e.__cause__, e.__context__]
  return False


def caught_error(signal: BaseException) -> MaskingError:
  """The error for a refusal that the function's own code caught and went past."""
  return MaskingError(
      "the function caught an error polyjit raised inside it and went on (an "
      "`except` that does not re-raise, a `finally` that returns, a context manager "
      "that suppresses, or a generator): the rest of that trace would compute "
      "what polyjit refused, not what jax.jit computes.\nWhat to do: let polyjit's "
      "errors through: catch narrower exceptions around a size (not TypeError, "
      "Exception or BaseException), or re-raise them first (`except "
      "pj.PolyjitError: raise`); then follow the advice of the error it caught:\n"
      f"{type(signal).__name__}: {signal}")


def _lost(signal: BaseException) -> BaseException:
  """Marks `signal` as one the function stopped (`lost`): a shared scope it
  was raised in may hold a helper's trace that went past it, and is dropped."""
  setattr(signal, "lost", True)
  return signal


def _counts(signal: BaseException) -> bool:
  """Whether a recorded exception must arrive. JAX's own inconclusive
  comparison is recorded too (polyjit settles it as a guard), but JAX may
  catch it itself and go on: it must arrive only once it reached user code."""
  return not isinstance(signal, jc.InconclusiveDimensionOperation) or jc.passed_user_code(signal)


@contextlib.contextmanager
def answering(oracle: Any) -> Iterator[None]:
  """`jc.size_decisions(oracle)`, checking that the first exception it raised
  into user code came back out of the block (module docstring)."""
  with jc.size_decisions(oracle) as raised:
    try:
      yield
    except (KeyboardInterrupt, SystemExit):
      raise
    except BaseException as exc:
      first = next((s for s in raised if s is exc or _counts(s)), None)
      if first is None or first is exc:
        raise
      signal = _lost(first)
      if isinstance(signal, PolyjitError) and not _in_chain(signal, exc):
        raise caught_error(signal) from signal
      raise signal from exc
    first = next((s for s in raised if _counts(s)), None)
    if first is not None:
      signal = _lost(first)
      if isinstance(signal, PolyjitError):
        raise caught_error(signal) from signal
      raise signal
