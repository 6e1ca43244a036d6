"""A hot shape's own program: where the same shapes keep coming back, their
calls run `jax.jit`'s program at exactly those shapes, once the padding has
paid for its compile.

A bucketed call pays, each time, what the bucket costs over an exact
program: its leaves padded (a host copy, or a small pad program on the
device: a second dispatch), its outputs with a dynamic dim cut, and
polyjit's bookkeeping: 8-20 us a call on a CPU, where `jax.jit`'s whole call
costs 7. For shapes called a few times that is nothing next to a compile
(tens of milliseconds at least); for shapes called thousands of times (a
training loop's batch shape, a likelihood evaluated at one data size) it is
the whole difference, and no Python on the call path can take it away: two
dispatches cost two dispatches. So the choice is rented, as tighter buckets
(`_buckets/cost_aware.py`) and device pad programs (`resident.py`) are:

* each hot call of an eligible plan (bucketed, single-device, not data-dependent,
  with leaves to pad or outputs to cut) times its overhead: the calling
  thread's time outside the program call (`HotShape.timed`; a call that
  compiled something, a tighter bucket or a pad program, is not charged);
* once that has cost `RENT` x the bucket program's compile time (the
  estimate of the exact program's: the same function at the same rank; at
  least `FLOOR`; where the bucket program was loaded from a cache, the cost
  model's estimate, or `UNKNOWN`), the plan buys its shapes' own program (`HotShape.buy`):
  traced and lowered on the calling thread (under the call's trace
  context, which is thread-local), compiled in a background thread while the
  calls go on in their bucket (not while a recorder of every thread's
  compiles is active: `pj.assert_max_compiles`, `pj.watch`, `count_compiles()`
  are promises that nothing compiles; the shapes buy after them);
* from then on the plan's calls go to `jax.jit(fun)` itself (with the
  function's `jax.jit` options), which finds that program in its own cache:
  jaxlib's C++ fast path, one lookup and one execute. The results are
  `jax.jit`'s by construction, and so are the transfer guard, donation and
  `jax_debug_nans` semantics.

Rent-or-buy is 2-competitive: the compiles bought never cost more than the
overhead already paid. A long run of ever-new sizes (the seed workload:
8,600 lengths in 20,000 calls) buys nothing, and each shape that is called
thousands of times buys one program, recorded in `pj.stats` with the cause
"hot shape" and counted by `jax.monitoring` as every compile is.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from typing import Any, Callable

import jax

from .. import _jax as jc
from .._caching.compiles import count_compiles, watched
from .._masking.data_dependent import plain_jit_trace
from .._sharding import placement as _sharding
from . import compile as _compile, resident as _resident
from .plans import EXACT, Plan, ProgramKey, StructureKey
from .stats import Cause, Stats

#: A plan buys its shapes' own program once its overhead has cost RENT x the
#: estimate of that program's compile.
RENT = 1.0
#: The least compile estimate, in seconds.
FLOOR = 0.05
#: The estimate where the bucket program was loaded from a cache and no cost
#: model gave one (`Compiler.seconds`): high, so that a shape buys late rather
#: than pay for a compile more than it saved.
UNKNOWN = 1.0

_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _compiling() -> float:
  """Seconds polyjit has spent compiling so far: programs, pad and slice programs."""
  return _compile.seconds_compiling() + _resident.seconds_compiling()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
  global _pool
  if _pool is None:  # (one thread: compiles bought one after another)
    _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="polyjit-hot-shape")
  return _pool


class HotShapes:
  """One `pj.jit` function's exact programs for its hot shapes."""

  def __init__(self, fun: Callable[..., Any], stats: Stats, compile_seconds: dict[int, float],
               *, donate_argnums: Any,
               donate_argnames: Any, keep_unused: bool, inline: bool,
               in_shardings: Any, out_shardings: Any) -> None:
    self.stats = stats
    # jax.jit as the user would have called it (static arguments never take
    # the hot path, so they need no options here)
    self.jitted: Any = jax.jit(  # (Any: its `clear_cache` is not in JAX's stubs)
        fun, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
        keep_unused=keep_unused, inline=inline,
        **_sharding.jit_options(in_shardings, out_shardings))
    self.program_name = jc.jit_program_name(getattr(fun, "__name__", "fun"))
    self.compile_seconds = compile_seconds  # the bucket programs' (`Compiler.seconds`)

  def eligible(self, plan: Plan) -> None:
    """Marks `plan` as one that may buy its shapes' own program (its account
    opens at its first hot call, `timed`: a size called once costs nothing)."""
    if (type(plan) is Plan and plan.bucket is not None and not plan.fallback
        and plan.hot_shape is None and (plan.pads or plan.dynamic_outputs)):
      plan.hot_shape = self  # (not data-dependent or exact plans; and something to save)

  def timed(self, plan: Plan, args: Any, stats: Any) -> Any:
    """`plan`'s first hot call: opens its account, which pays from now on."""
    price = RENT * max(self.compile_seconds.get(id(plan.program), UNKNOWN), FLOOR)
    account = plan.hot_shape = HotShape(self, plan.key.structure, price)
    return account.timed(plan, args, stats)


class _Paid:
  """The account of a plan that has paid (its program bought, compiling, or
  refused by jax.jit): its calls run untimed. Not None, so that the plan is
  not made eligible again by another call signature that finds it (a NumPy
  array of a `jax.Array`'s shape and dtype): that would buy it twice."""
  __slots__ = ()

  def timed(self, plan: Plan, args: Any, stats: Any) -> Any:
    return plan.run_hot(args, stats, plan.program)


PAID = _Paid()


class HotShape:
  """A plan's account: its overhead paid so far against the price of a compile."""
  __slots__ = ("owner", "structure", "price", "spent")

  def __init__(self, owner: HotShapes, structure: StructureKey, price: float) -> None:
    self.owner = owner
    self.structure = structure
    self.price = price
    self.spent = 0.0

  def timed(self, plan: Plan, args: Any, stats: Any) -> Any:
    """`plan`'s call, its overhead paid into this account."""
    now = time.perf_counter
    program = plan.program
    inside = [0.0]

    def run(*leaves: Any) -> Any:
      t = now()
      try:
        return program(*leaves)
      finally:
        inside[0] = now() - t

    compiling = _compiling()
    t0 = now()
    outs = plan.run_hot(args, stats, run)
    if _compiling() != compiling:
      return outs  # (a call that compiled: a bucket bought, a pad program; once, not per call)
    self.spent += now() - t0 - inside[0]
    if self.spent >= self.price and plan.hot_shape is self and not watched():
      plan.hot_shape = PAID  # (the next calls pay no more, and it is never eligible again)
      self.buy(plan, args)
    return outs

  def buy(self, plan: Plan, args: Any) -> None:
    """Lowers `jax.jit(fun)` at these arguments here (their trace context is
    this thread's), compiles it in the background, and then sends `plan`'s
    calls to it. A failure leaves the plan in its bucket, as it was."""
    t0 = time.perf_counter()
    try:
      with plain_jit_trace():  # (jax.jit's own trace: pj.nonzero and the like as jax's)
        lowered = self.owner.jitted.lower(*args)
    except Exception:  # (a lowering jax.jit refuses here: the bucket stays)
      return
    seconds = time.perf_counter() - t0
    shapes = tuple(tuple(getattr(a, "shape", ())) for a in args)
    try:
      # (compiled under this thread's configuration, as jax.jit would compile it here)
      _executor().submit(jc.in_callers_config(
          functools.partial(self._compile, plan, lowered, shapes, seconds)))
    except RuntimeError:  # (the interpreter is shutting down, a call from an atexit
      return              # handler: no thread can start now; the bucket stays)

  def _compile(self, plan: Plan, lowered: Any, shapes: Any, lower_seconds: float) -> None:
    t0 = time.perf_counter()
    try:
      with count_compiles(this_thread_only=True) as log:
        lowered.compile()  # (kept in jax.jit's own caches: the next call finds it)
    except Exception:
      return
    owner = self.owner
    # This thread compiles nothing else: its events are this program's, under
    # the name JAX gave it (a functools.partial or a callable object has no
    # `__name__` of its own: JAX names them its own way).
    names = {e.fun_name for e in log}
    owner.stats.record_compile(
        ProgramKey(self.structure, EXACT, None, shapes, ()),
        Cause("hot shape", shapes=shapes,
              reason=f"its calls' padding had cost {self.spent * 1e3:.1f} ms, "
                     f"{RENT:g} x a compile"),
        log, program_name=names.pop() if len(names) == 1 else owner.program_name,
        wall_seconds=lower_seconds + time.perf_counter() - t0)
    plan.exact_call = owner.jitted
