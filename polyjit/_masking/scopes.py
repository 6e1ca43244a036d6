"""Which symbolic scope a trace of user code runs in: shared while it asks nothing.

JAX's trace caches (a `jax.jit` helper, jnp's own jitted helpers, `lax.scan`
and `lax.cond` bodies, `jax.checkpoint`) are keyed by avals, and symbolic avals
of one scope compare equal across traces. A helper that branched on a size in
one trace (its answer recorded by that trace's oracle) would be replayed in
another trace of the same scope with that answer, unrecorded. Giving every
trace a fresh scope rules that out, but makes JAX retrace all of its jitted jnp
helpers in every trace (most of the tracing time of a small function).

So a scope is shared, on one condition that keeps every cache entry made in
it free of size decisions: **no size question is ever answered in a shared
scope.**

* A trace of user code borrows an idle scope for its constraints (`lend`), one
  trace at a time (so no other trace can meet its cache entries half made),
  and runs under `LeaveOnQuestion`: the first size question it asks (`n == 1`,
  `n > 3`, a hash of a size, an assumption about a data-dependent size), before
  it is answered, raises `LeftSharedScope` (a BaseException, so user code's
  `except Exception` does not swallow it). The trace is abandoned, its scope
  goes back clean (the cache entries it completed asked nothing), and the
  caller traces again in a fresh scope of its own with the real oracle, as
  before; the function is remembered as one that asks, and traces in fresh
  scopes from then on. User code that stops the exception (a bare `except:`,
  a `finally` that returns) cannot keep the trace: `signals.answering` raises
  it again, and the scope it was stopped in is dropped, not given back (a
  jitted helper may have cached a trace that went past it).
* Nor is a data-dependent size (`pj.nonzero`, `x[x > 0]`) ever created in a
  shared scope: its names (pj_dd0, ...) restart in every trace, so a cached
  helper that made one would hand its size to another trace's selection.
  `creating_size` leaves the shared scope, like a question, before it is made
  (found by review: a trace abandoned after making one left the helper's
  cached trace behind).
* Derivatives of a trace made in a shared scope (`SymbolicTrace.jvp/vjp`) run
  user code again only in custom_jvp/custom_vjp rules; they are traced under
  `refusing_questions()`, which raises MaskingError for a size question asked
  (or a data-dependent size made) there (outside polyjit's traces JAX would
  answer `==` False for sizes it cannot prove equal: a silent answer for one
  side), so those traces cannot leave an answer in the shared caches either.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

from .. import _jax as jc
from . import signals as _signals, spec as _spec
from .errors import MaskingError, expression_too_large

IDLE_PER_CONSTRAINTS = 4   # idle scopes kept per set of constraints (one per concurrent trace)


class LeftSharedScope(BaseException):
  """A trace in a shared scope asked a size question: trace it again in a fresh scope."""


class LeaveOnQuestion:
  """The oracle of a trace in a shared scope: the first question leaves it.

  `assume` passes through JAX's own questions that are not assumptions about
  data-dependent sizes (the real oracle answers None to them and JAX raises its
  own error, which a JAX internal may catch)."""

  def __init__(self, oracle: Any):
    self._oracle = oracle

  def __call__(self, decision: Any) -> bool:
    raise LeftSharedScope()

  def assume(self, expr: Any, text: str) -> bool | None:
    if self._oracle.assume(expr, text) is None:
      return None
    raise LeftSharedScope()

  def value_of(self, expr: Any, where: str) -> int:
    raise LeftSharedScope()

  def refuse_value(self, expr: Any, where: str, how: str) -> BaseException:
    return LeftSharedScope()

  def too_large(self, text: str, where: str) -> BaseException:
    return LeftSharedScope()   # (refused by the real oracle, in a fresh scope)


class _Pool:
  """Idle scopes per constraints; a lent scope is used by one trace at a time."""

  def __init__(self) -> None:
    self._idle: dict[tuple[str, ...], list[jc.SymbolicScope]] = {}
    self._lock = threading.Lock()
    self.made: weakref.WeakSet[jc.SymbolicScope] = weakref.WeakSet()  # every shared scope

  def lend(self, constraints: Sequence[str]) -> jc.SymbolicScope:
    key = tuple(constraints)
    with self._lock:
      idle = self._idle.get(key)
      if idle:
        return idle.pop()
    scope = _spec.fresh_scope(key)
    self.made.add(scope)
    return scope

  def give_back(self, scope: jc.SymbolicScope, constraints: Sequence[str]) -> None:
    with self._lock:
      idle = self._idle.setdefault(tuple(constraints), [])
      if len(idle) < IDLE_PER_CONSTRAINTS:
        idle.append(scope)


_pool = _Pool()
lend = _pool.lend
give_back = _pool.give_back


def creating_size(scope: jc.SymbolicScope) -> None:
  """Before a data-dependent size is made in `scope`: a shared scope is left."""
  if scope in _pool.made:
    raise jc.signal_raised(LeftSharedScope())


def trace_shared(in_scope: Callable[[jc.SymbolicScope, Any], Any], constraints: Sequence[str],
                 oracle: Any) -> tuple[Any, jc.SymbolicScope] | None:
  """(trace, scope) of `in_scope(scope, oracle)`, a trace of user code, in a
  shared scope; None if it asked a size question (then trace it again in a
  fresh scope, `spec.fresh_scope`, with `oracle`)."""
  scope, traced, clean = lend(constraints), None, True
  try:
    traced = in_scope(scope, LeaveOnQuestion(oracle))
  except BaseException as e:
    # its partial trace answered nothing, and the scope stays clean, unless the
    # function stopped a signal (`signals.py`): a jitted helper may have cached
    # a trace that went past it, so that scope is never lent again
    clean = not getattr(e, "lost", False)
    if isinstance(e, LeftSharedScope):
      return None
    raise
  finally:
    if clean:
      give_back(scope, constraints)
  traced.shared_scope = True
  return traced, scope


class _RefuseQuestions:
  """The oracle of derivative traces of a shared-scope trace: a size question
  asked there (in a custom_jvp/custom_vjp rule) is refused, never answered."""

  def _refuse(self, what: str, where: str) -> MaskingError:
    return MaskingError(
        f"the size comparison {what} at {where} runs while polyjit differentiates "
        "the function (in a custom_jvp or custom_vjp rule); a masked derivative "
        "serves every size, so it cannot take one side.\nWhat to do: compare sizes "
        "in the function itself rather than in its differentiation rule, or compute "
        "with the size as a value (jnp.where(x.shape[0] == k, ...)).")

  def __call__(self, decision: Any) -> bool:
    raise self._refuse(decision.text, decision.where)

  def assume(self, expr: Any, text: str) -> bool | None:
    return None   # JAX's own shape rule: JAX raises its own error

  def value_of(self, expr: Any, where: str) -> int:
    raise self._refuse(f"hash('{expr}')", where)

  def refuse_value(self, expr: Any, where: str, how: str) -> BaseException:
    return self._refuse(f"{how} of '{expr}'", where)

  def too_large(self, text: str, where: str) -> BaseException:
    return expression_too_large(text, where)


_REFUSE = _RefuseQuestions()


@contextlib.contextmanager
def refusing_questions(shared: bool) -> Iterator[None]:
  """Around a derivative trace: refuses size questions if its scope is shared.

  A comparison JAX's own derivative rule cannot decide (`m < n` in QR's)
  is refused in either scope, naming the rule: a masked derivative serves
  every size, and the function's trace did not choose a side for it."""
  try:
    if not shared:
      yield
      return
    with _signals.answering(_REFUSE):
      yield
  except jc.InconclusiveDimensionOperation as error:
    raise _undecided_in_derivative(error) from error
  except LeftSharedScope:
    raise MaskingError(
        "a data-dependent size (a boolean selection, nonzero, unique) is made while "
        "polyjit differentiates the function (in a custom_jvp or custom_vjp rule), "
        "where a masked derivative cannot make one.\nWhat to do: make the selection "
        "in the function itself, or give it a fixed bound (pj.nonzero(..., size=k)).") from None


def _undecided_in_derivative(error: BaseException) -> MaskingError:
  comparison = jc.inconclusive_comparison(error)
  text = " ".join(comparison) if comparison is not None else str(error).split("\n")[0]
  rule = jc.innermost_jax_function(error) or "a JAX derivative rule"
  where = jc.question_line(error) or "an unknown line"
  side = (f"constraints=[\"{comparison[0]} >= {comparison[2]}\"] or "
          f"[\"{comparison[2]} >= {comparison[0]} + 1\"]" if comparison is not None
          else "constraints=[...]")
  return MaskingError(
      f"JAX's derivative ({rule}) of an operation in {where} compares the sizes "
      f"{text}, which is undecided for a masked derivative: it serves every size, "
      "and the function itself did not choose a side of that comparison.\nWhat to "
      f"do: declare the side your sizes are on (pj.mask(..., {side})), or take "
      "the derivative inside the masked function (pj.mask(jax.grad(f), ...)), "
      "where each side is traced and chosen when it runs.")
