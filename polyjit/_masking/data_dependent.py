"""Data-dependent sizes: `x[x > 0]`, `jnp.nonzero`, `jnp.unique` in compiled code.

Design
------
A data-dependent size is one more dynamic size, whose logical value the
program computes instead of receiving it. Everything else is polyjit's usual
machinery:

* **One primitive.** Every spelling reduces to `compact(mask)`: the positions
  of the True entries of a 1-D bool array. Its output shape is `(pj_ddK,)`,
  a *fresh* `jax.export` dimension variable created in the scope of the trace
  (`tracing()`, entered by `trace.trace_flat`). The primitive
  (`_jax.size_primitive`) exists only in polyjit's symbolic traces; it
  has no lowering, so it can never run unmasked.
* **Its masking rule binds the size.** Evaluated on padded data, the rule
  counts the True entries of the valid region (the new size's logical value,
  an int32 scalar), compacts their positions to the front of a buffer as long
  as the operand's padded length (the new size's padded value: its upper
  bound), and adds both to the `MaskEnv` (`MaskEnv.bind_size`). From there on
  `pj_ddK` is a size like any other: reductions, elementwise ops, gathers,
  sorts, cumulative ops and gradients mask on it with the ordinary rules.
* **One size per selection.** Names come from a per-trace counter, so a
  jaxpr JAX replays from its trace cache (a `jax.jit` helper called again at
  the same avals, here or in another function traced earlier) would repeat a
  name another selection has, and both would read one count. `trace_own_sizes`
  checks that each selection's size is this trace's and no other selection's;
  if not, it traces again with JAX's caches missing from the start and after
  each new size (`jc.uncached_calls`), so every helper call traces anew. Where
  that still replays one, a `MaskingError` names the helper: never one size
  for two selections.
* **Spellings.** While polyjit traces, boolean-mask indexing (the function
  behind `Array.__getitem__`), `jnp.nonzero`, `flatnonzero`, `argwhere`,
  one-argument `where`, `compress`, `extract` and `unique` (without `size=`)
  are replaced (`_jax.trace_spellings`) by the functions of
  `_spellings/data_dependent.py`, written with `compact` and public jnp/lax ops.
  Given `size=`, a concrete operand, or arguments they do not handle, they
  call JAX's own function, so nothing changes where JAX already works.
* **Outputs.** A traced function that creates sizes (`size_names`) returns,
  after its outputs, one int32 scalar per created size and the code of the
  first failed check (0: none; see below). `pj.mask` turns them into logical
  output shapes; `pj.jit` reads them back once per call and slices
  (`_jit/data_dependent.py`); `pj.vmap` returns per-example lengths.

Zero is a legal data-dependent size. `jax.export` assumes every dimension
variable is >= 1, so JAX traces `jnp.max(y)` or `y[0]` on a selection `y`
without complaint; the rules of the primitives that rely on it (reductions
without an identity; slices and gathers that read elements) are wrapped to
record the condition under which their result is defined, and pj.jit and an
eager pj.mask call raise NumPy's error (ValueError, IndexError) when it
fails. Under an outer `jax.jit`/`vmap` nothing can raise; an empty float
max/min is NaN there. Code that *branches* on a data-dependent size (a size
comparison, `y[:3]`) cannot be traced exactly: polyjit refuses it
(`refuse_decision`).

Not supported (a `MaskingError` says so): creating a data-dependent size
inside a loop body or a `lax.cond` branch, a boolean mask combined with other
indices in one subscript (`x[m, 0]`), a selection under `jax.vmap` inside
the function, `jnp.unique(axis=...)`, `compress` with a condition of another
length than the axis.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
import threading
from collections.abc import Iterator
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import dims as _dims, scopes as _scopes
from .. import _jax as jc
from . import rules as _rules  # noqa: F401  (the rules wrapped below must exist first)
from .core import MaskEnv, Rule, RuleContext, register
from .errors import MaskingError, ShapeError
from .size_range import poison

PREFIX = "pj_dd"   # the names of data-dependent sizes: pj_dd0, pj_dd1, ...


# --- the trace ---------------------------------------------------------------

_local = threading.local()


class _TraceState:
  def __init__(self, scope: jc.SymbolicScope, renew: Callable[[], None] | None):
    self.scope = scope
    self.count = 0
    self.created: set[str] = set()
    self.renew = renew   # in an uncached trace: JAX's caches miss from here on


@contextlib.contextmanager
def tracing(avals: Sequence[Any], *, uncached: bool = False) -> Iterator[None]:
  """Within the block (one symbolic trace), new sizes are created in the
  scope of `avals`' symbolic dims (so that they combine with them) and named
  pj_dd0, pj_dd1, ... in order, the same in every trace of one function.
  `uncached`: no jaxpr JAX cached before the block or before the last size
  was created is replayed (`trace_own_sizes`)."""
  scope = next((jc.dim_scope(d) for a in avals for d in getattr(a, "shape", ())
                if jc.is_symbolic_dim(d)), None)
  previous = getattr(_local, "state", None)
  with contextlib.ExitStack() as stack:
    renew = stack.enter_context(jc.uncached_calls()) if uncached else None
    _local.state = _TraceState(scope if scope is not None else jc.SymbolicScope(), renew)
    try:
      yield
    finally:
      _local.state = previous


def trace_own_sizes(make: Callable[[], jc.ClosedJaxpr], avals: Sequence[Any], *,
                    replay: bool = False) -> jc.ClosedJaxpr:
  """`make()`, a trace of the user's function at `avals` within `tracing()`,
  where every selection in the jaxpr has a size of its own.

  JAX replays the cached jaxpr of a `jax.jit` (or `eqx.filter_jit`) helper
  called again at the same avals, in this trace or in another function's;
  a selection inside it then repeats a size this trace or that one already
  created, and two selections would read one count. Such a trace is traced
  again with JAX's caches missing from the start and after each new size
  (`tracing(uncached=True)`), so each call traces the helper anew and its
  selection gets the next name. `replay`: a derivative trace, which evaluates
  an earlier trace's jaxpr (its sizes are that trace's, and a VJP evaluates
  a selection twice on purpose): nothing to check.
  """
  with tracing(avals):
    closed = make()
    if replay or not _replayed_sizes(closed.jaxpr):
      return closed
  with tracing(avals, uncached=True):
    closed = make()
    replayed = _replayed_sizes(closed.jaxpr)
  if replayed:  # a cache JAX keys without the trace context: refuse, never share
    raise MaskingError(
        f"a data-dependent size (boolean indexing, nonzero, unique) created {replayed[0]} "
        "is shared by two selections: JAX replayed a cached trace of the function "
        "that creates it, and polyjit could not make JAX trace it again.\nWhat to "
        "do: call that helper without jax.jit inside the polyjit function (polyjit "
        "compiles the whole function anyway), or give the selection a fixed bound: "
        "pj.nonzero(..., size=k) / pj.boolean_mask(..., size=k).")
  return closed


def _replayed_sizes(jaxpr: jc.Jaxpr) -> list[str]:
  """Where each selection of `jaxpr` sits whose size another selection of
  it has too (a sub-jaxpr used twice counts twice), or which this trace did
  not create: 'at file:line (in `helper`)'. Empty when each has its own."""
  state: _TraceState = _local.state
  seen: set[str] = set()
  replayed: list[str] = []

  def visit(j: jc.Jaxpr, call: Any) -> None:
    for eqn in j.eqns:
      if eqn.primitive is compact_p:
        name = size_variable(eqn.params["size"])
        if name in seen or name not in state.created:
          where = jc.source_line(eqn)
          if call is not None:
            where += f" (in `{call.params.get('name', call.primitive.name)}`, called "
            where += f"{jc.source_line(call)})"
          replayed.append(where)
        seen.add(name)
      for sub in jc.subjaxprs_in_params(eqn.params):
        visit(sub, call if call is not None else eqn)
  visit(jaxpr, None)
  return replayed


def _fresh_dim() -> Any:
  """A new data-dependent size: `pj_ddK - 1`, so that it is >= 0.

  `jax.export` assumes every dimension *variable* is >= 1, and would decide
  `y.shape[0] == 0`, `max(y.shape[0], 1)` or `y[:1]`'s length for a non-empty
  selection before polyjit sees the question. A selection can be empty, so
  its size is one less than a variable: JAX then knows only that it is >= 0,
  and every emptiness question reaches polyjit (`refuse_decision`), or stays
  symbolic in the program (`min(pj_dd0 - 1, 1)` for `y[:1]`). The variable's
  logical value is the count plus one (`_compact_rule`).
  """
  state = getattr(_local, "state", None)
  if state is None:  # spellings run only inside `tracing()`; this is a bug
    raise MaskingError("a data-dependent size was created outside a polyjit trace.")
  _scopes.creating_size(state.scope)   # never in a shared scope (`scopes.py`)
  name = f"{PREFIX}{state.count}"
  state.count += 1
  state.created.add(name)
  if state.renew is not None:  # a helper called from here on is traced again
    state.renew()
  return jc.symbolic_shape(name, scope=state.scope)[0] - 1


def size_variable(size: Any) -> str:
  """The variable of a data-dependent size `pj_ddK - 1`: 'pj_ddK'."""
  (name,) = jc.symbolic_vars(size)
  return name


class NeedsPolyjitTrace(Exception):
  """`pj.nonzero` & co. without `size=`, met while `pj.jit` traces with plain
  `jax.jit` (`plain_jit_trace()`): pj.jit then traces with polyjit instead,
  so that its first call gives the exact sizes that every later one gives."""


@contextlib.contextmanager
def plain_jit_trace() -> Iterator[None]:
  """Marks a trace of the user's function by plain `jax.jit` inside pj.jit."""
  previous = getattr(_local, "plain", False)
  _local.plain = True
  try:
    yield
  finally:
    _local.plain = previous


def in_plain_jit_trace() -> bool:
  plain: bool = getattr(_local, "plain", False)
  return plain


def is_size_name(name: str) -> bool:
  return name.startswith(PREFIX) and name[len(PREFIX):].isdigit()


def mentions_size(d: Any) -> bool:
  """Whether a dimension expression involves a data-dependent size."""
  return jc.is_symbolic_dim(d) and any(is_size_name(v) for v in jc.symbolic_vars(d))


def decide_nonempty(expr: Any) -> bool | None:
  """`expr >= 0` where every data-dependent size in it is at least 1 (its
  variable at least 2); None if `expr` has none, or that does not decide."""
  names = [v for v in jc.symbolic_vars(expr) if is_size_name(v)]
  if not names:
    return None
  try:
    shifted = jc.evaluate_symbolic(expr, {v: jc.dim_variable(v, expr) + (1 if v in names else 0)
                                          for v in jc.symbolic_vars(expr)})
  except (OverflowError, ValueError):  # JAX's own bounds (n <= 2**31): not emptiness
    return None
  if not jc.is_symbolic_dim(shifted):
    return int(shifted) >= 0
  lo, hi = jc.dim_bounds(shifted)
  if lo >= 0 or hi < 0:
    return lo >= 0
  # Not decided by emptiness (`lax.top_k(y, 2)` asks `len(y) < 2`): answered
  # for a selection long enough, as the non-empty one is; the program checks
  # the answer and raises ValueError where JAX would (too few elements).
  long = jc.evaluate_symbolic(expr, {v: jc.dim_variable(v, expr) + (_LONG if v in names else 0)
                                     for v in jc.symbolic_vars(expr)})
  if not jc.is_symbolic_dim(long):
    return int(long) >= 0
  lo, hi = jc.dim_bounds(long)
  return True if lo >= 0 else False if hi < 0 else None


_LONG = 2 ** 20   # "a selection long enough" for `decide_nonempty`


_SIZE_TEXT = re.compile(rf"{PREFIX}(\d+)(?: - 1)?")


def readable_sizes(error: Any) -> Any:
  """`error` with data-dependent sizes named as the user knows them
  ('len(selection 1)' for `pj_dd0 - 1`), and, where two selections' sizes
  meet, what works: one selection reused."""
  text = str(error.args[0]) if error.args else ""
  found = set(_SIZE_TEXT.findall(text))
  if not found:
    return error
  text = _SIZE_TEXT.sub(lambda m: f"len(selection {int(m.group(1)) + 1})", text)
  if len(found) > 1:
    # two selections' sizes meet: that is the cause, and its advice replaces
    # the general one (declaring an axis fixed does not help)
    text = text.split("\nWhat to do:")[0].rstrip()
    text += ("\nEach boolean selection, nonzero or unique gets a size of its own, "
             "which polyjit cannot prove equal to another's, even for the same mask.\n"
             "What to do: select once and reuse the result (`y = v[v > 0]; y * "
             "jnp.arange(y.shape[0])`, `y = x[m]; jnp.stack([y, y * 2])`), or select "
             "after combining: `pj.boolean_mask(jnp.stack([x, x * 2]), m, axis=1)`.")
  new = copy.copy(error)
  new.args = (text, *error.args[1:])
  return new


def refuse_decision(decision: jc.SizeDecision) -> None:
  """Raises for a size comparison in user code about a data-dependent size:
  its answer is only known when the program runs."""
  if mentions_size(decision.expr):
    raise MaskingError(
        f"the comparison {decision.text} at {decision.where} involves a data-dependent "
        "size (the length of a boolean selection, nonzero or unique), which is only "
        "known when the program runs, so no single trace serves every answer.\n"
        "What to do: compute without branching on that size (jnp.where on the "
        "count, masks), or use the explicit form with a fixed bound: "
        "pj.nonzero(..., size=k) / pj.boolean_mask(..., size=k).")


# --- the primitive -------------------------------------------------------------

def _compact_abstract(mask: Any, *, size: Any) -> Any:
  return jc.shaped((size,), jc.dim_value_dtype())


def _refuse_batching() -> MaskingError:
  return MaskingError(
      "a data-dependent size (boolean indexing, nonzero, unique) is created under "
      "jax.vmap inside the function, where each example would have a size of its "
      "own.\nWhat to do: map over the examples with pj.vmap (each example's "
      "selection gets its own size), or keep the shape fixed inside jax.vmap with "
      "jnp.where(mask, x, fill) or pj.nonzero(..., size=k).",
      primitive="polyjit_compact")


def _refuse_lowering() -> MaskingError:
  return MaskingError(
      "a data-dependent size (boolean indexing, nonzero, unique) made inside a function "
      "JAX caches (a jax.jit helper) reached a program polyjit does not mask: JAX "
      "replayed that helper's trace from an earlier polyjit trace (at exact shapes, in "
      "a lax.scan body, or under jax.grad inside the function).\nWhat to do: call that "
      "helper without jax.jit inside polyjit functions (polyjit compiles the whole "
      "function anyway), or give the selection a fixed bound: pj.nonzero(..., size=k) / "
      "pj.boolean_mask(..., size=k, fill_value=...).", primitive="polyjit_compact")


compact_p = jc.size_primitive("polyjit_compact", _compact_abstract, _refuse_batching,
                              _refuse_lowering)


def compact(flat_mask: Any) -> jax.Array:
  """The positions of the True entries of a 1-D array, in order: an int32
  array whose length is a new data-dependent size."""
  flat_mask = jnp.asarray(flat_mask)
  if flat_mask.dtype != jnp.bool_:
    flat_mask = flat_mask != 0
  if not jc.is_symbolic_dim(flat_mask.shape[0]) and flat_mask.shape[0] == 0:
    return jnp.zeros((0,), jc.dim_value_dtype())  # nothing to select: no new size
  # JAX's Primitive.bind carries no annotations (strict only)
  positions: jax.Array = compact_p.bind(  # type: ignore[no-untyped-call, unused-ignore]
      flat_mask, size=_fresh_dim())
  return positions


def _running_count(valid: Any, dtype: Any) -> Any:
  """cumsum(valid): XLA's CPU cumsum is 2-3x slower than a log-depth scan."""
  ones = valid.astype(dtype)
  if jax.default_backend() == "cpu":
    return lax.associative_scan(lax.add, ones)
  return jnp.cumsum(ones, dtype=dtype)


@register(compact_p)
def _compact_rule(ctx: RuleContext, mask: Any, *, size: Any) -> list[Any]:
  env = ctx.env
  if env.nested:
    within = env.nested_in
    if within in ("checkpoint", "remat", "remat2"):
      raise ctx.error(
          "a data-dependent size (boolean indexing, nonzero, unique) is created inside "
          "a function under jax.checkpoint (jax.remat), whose body polyjit masks on its "
          "own, and a size it creates cannot leave it.",
          "make the selection outside the checkpointed function and pass its result "
          "in, or keep the shape fixed inside it with jnp.where(mask, x, fill) or "
          "pj.nonzero(..., size=k).")
    raise ctx.error(
        "a data-dependent size (boolean indexing, nonzero, unique) is created inside "
        f"a loop body or a branch (lax.scan, lax.map, fori_loop, cond{'; here ' + repr(within) if within else ''}), "
        "where each iteration would have a size of its own.",
        "compute the selection outside the loop, or keep the shape fixed inside it "
        "with jnp.where(mask, x, fill) or pj.nonzero(..., size=k).")
  valid = mask
  region = ctx.valid_mask(ctx.in_avals[0])
  if region is not None:
    valid = lax.bitwise_and(valid, region)
  padded = valid.shape[0]
  dtype = jc.dim_value_dtype()
  count = jnp.sum(valid, dtype=dtype)
  # The j-th selected position goes to slot j (a scatter: ten times faster
  # than a stable argsort on CPU); the slots past the count hold 0.
  slot = jnp.where(valid, _running_count(valid, dtype) - 1, padded)
  positions = jnp.zeros((padded,), dtype).at[slot].set(
      lax.iota(dtype, padded), mode="drop", unique_indices=True)
  name = size_variable(size)   # the size is `name - 1` (`_fresh_dim`)
  if name in env.padded_env:  # the same equation evaluated again (a VJP's replay)
    env.logical_env[name] = count + 1
  else:
    env.bind_size(name, padded + 1, count + 1)
  return [positions]



# --- what NumPy refuses on an empty selection ------------------------------------
#
# `jax.export` assumes every size is >= 1, so JAX traces `jnp.max(y)` and
# `y[0]` on a selection `y` without a complaint; at count 0 NumPy raises. The
# rules of the primitives involved are wrapped: where they reduce or index a
# data-dependent axis, the condition under which the result is defined goes to
# `MaskEnv.checks` with a code, and the program returns the first failing code
# (`extra_outputs`), which pj.jit and eager pj.mask raise as NumPy would.

EMPTY_REDUCTION, EMPTY_INDEX, EMPTY_SHAPE = 1, 2, 3
_MESSAGES = {
    EMPTY_SHAPE: (
        "zero-size array, or too few elements, for a JAX function that needs them: a "
        "data-dependent size (a boolean selection, nonzero, unique) is too small in "
        "this call (a reduction without identity, jnp.max(y), needs one element; "
        "lax.top_k(y, k) needs k), where NumPy and JAX raise ValueError at those "
        "shapes too.\nWhat to do: give the reduction an initial value "
        "(jnp.max(y, initial=-jnp.inf)), check the count first "
        "(jnp.where(y.shape[0] >= k, ...)), or use the explicit form with a fixed "
        "bound: pj.nonzero(..., size=k) / pj.boolean_mask(..., size=k, fill_value=...)."),
    EMPTY_REDUCTION: (
        "zero-size array to reduction operation which has no identity: a max, min, "
        "argmax or argmin over a data-dependent size (a boolean selection, nonzero, "
        "unique) that is empty in this call, where NumPy raises too.\nWhat to do: "
        "give the reduction an initial value (jnp.max(x[m], initial=-jnp.inf)) or a "
        "where= mask, or check the count first."),
    EMPTY_INDEX: (
        "index out of bounds: an element of a data-dependent selection (y[0], y[-1], "
        "y[i]) was read where the selection is empty in this call, where NumPy raises "
        "IndexError.\nWhat to do: guard with the count (jnp.where(y.shape[0] > 0, "
        "...)) or give the reduction an initial value."),
}


def _record(ctx: RuleContext, defined: Any, code: int, what: str) -> None:
  if ctx.env.nested:
    raise ctx.error(
        f"{what} on a data-dependent size inside a loop body or branch: an empty "
        "selection could not raise there.",
        "compute it outside the loop or branch.")
  ctx.env.checks.append((defined, code))


@register("argmax", "argmin", wraps=True)
def checked_nonempty_reduction(rule: Rule) -> Rule:
  """`argmax`/`argmin` over an empty selection: NumPy raises, polyjit too.

  (`jnp.max`/`jnp.min` without `initial=` are checked through JAX's own
  `size >= 1` test, `_Oracle.assume`; with `initial=` an empty max is defined.)
  """
  @functools.wraps(rule)  # the rule's own family in docs/coverage.md
  def checked(ctx: RuleContext, operand: Any, *rest: Any, axes: Sequence[int],
              **params: Any) -> list[Any]:
    outs = rule(ctx, operand, *rest, axes=axes, **params)
    shape = ctx.in_avals[0].shape
    sized = [shape[a] for a in axes if mentions_size(shape[a])]
    if not sized:
      return outs
    nonempty: Any = None
    for d in sized:
      has = ctx.logical(d) > 0
      nonempty = has if nonempty is None else jnp.logical_and(nonempty, has)
    _record(ctx, nonempty, EMPTY_REDUCTION, f"a {ctx.primitive.name}")
    # Under traced sizes nothing can raise: NaN rather than a number.
    return [jnp.where(nonempty, o, jnp.nan) if jnp.issubdtype(o.dtype, jnp.inexact) else o
            for o in outs]
  return checked


@register("slice", "dynamic_slice", "gather", wraps=True)
def checked_nonempty_indexing(rule: Rule) -> Rule:
  """Indexing into an empty selection: NumPy raises, polyjit too."""
  @functools.wraps(rule)
  def checked(ctx: RuleContext, *args: Any, **params: Any) -> list[Any]:
    outs = rule(ctx, *args, **params)
    shape = ctx.in_avals[0].shape
    sizes = params.get("slice_sizes")
    out_shape = ctx.out_avals[0].shape
    indexed = [d for a, d in enumerate(shape) if mentions_size(d) and not (
        (sizes[a] if sizes is not None else out_shape[a]) is d
        or provably_equal(sizes[a] if sizes is not None else out_shape[a], d))]
    if not indexed:
      return outs
    defined: Any = None
    for d in out_shape:  # an empty result reads nothing
      empty = ctx.logical(d) <= 0
      defined = empty if defined is None else jnp.logical_or(defined, empty)
    for d in indexed:
      has = ctx.logical(d) > 0
      defined = has if defined is None else jnp.logical_or(defined, has)
    _record(ctx, defined, EMPTY_INDEX, "indexing")
    return outs
  return checked



# --- traced functions: which sizes they create, what they return ------------------

def size_names(jaxpr: jc.Jaxpr) -> tuple[str, ...]:
  """The data-dependent sizes a jaxpr creates (sub-jaxprs included)."""
  names: list[str] = []

  def visit(j: jc.Jaxpr) -> None:
    for eqn in j.eqns:
      if eqn.primitive is compact_p:
        name = size_variable(eqn.params["size"])
        if name not in names:
          names.append(name)
      for sub in jc.subjaxprs_in_params(eqn.params):
        visit(sub)
  visit(jaxpr)
  return tuple(names)


def extra_outputs(env: MaskEnv, traced: Any) -> list[Any]:
  """What a masked evaluation of `traced` returns after its outputs: each
  created size, then the code of the first check that failed (0: none).
  Notes on `traced` whether there are checks at all."""
  names = traced.size_names
  if not names:
    return []
  traced.has_checks = bool(env.checks) or bool(traced.has_checks)
  missing = [n for n in names if n not in env.logical_env]
  if missing:
    raise MaskingError(f"the data-dependent sizes {missing} were never computed; "
                       "they are created where polyjit cannot bind them.")
  # JAX's shape rules answered for a non-empty selection (`_Oracle.assume`):
  # checked last, so that a rule's own, more precise check wins.
  assumed = [(_assumption_holds(expr, answer, env), EMPTY_SHAPE)
             for expr, answer, _ in getattr(traced, "assumptions", ())]
  traced.has_checks = traced.has_checks or bool(assumed)
  failed = jnp.asarray(0, jnp.int32)
  for defined, code in reversed([*env.checks, *assumed]):
    failed = jnp.where(defined, failed, jnp.int32(code))
  return [env.logical_env[n] for n in names] + [failed]


def _assumption_holds(expr: Any, answer: bool, env: MaskEnv) -> Any:
  holds = _dims.evaluate_dim(expr, env.logical_env) >= 0
  return holds if answer else jnp.logical_not(holds)


def split_outputs(traced: Any, outs: Sequence[Any]
                  ) -> tuple[list[Any], dict[str, Any], Any]:
  """(outputs, {size name: value}, failed check code) of a masked evaluation."""
  n = len(traced.out_avals)
  extras = list(outs[n:])
  return list(outs[:n]), dict(zip(traced.size_names, extras[:-1], strict=True)), extras[-1]


def poison_if_failed(outs: Sequence[Any], failed: Any, inputs: Sequence[Any] = ()) -> list[Any]:
  """Under traced sizes nothing can raise: where a check failed, every output
  is poisoned (NaN, the integer minimum; `_size_range.poison_value`), and so
  are its derivatives, with respect to the call's `inputs` too, as those of a
  call whose traced sizes are out of range (`_size_range.poison`): a select
  alone would give an empty `jnp.max` a gradient of 0."""
  if not isinstance(failed, jc.Tracer):
    return list(outs)
  return poison(outs, lax.eq(failed, np.int32(0)), inputs)


def raise_if_failed(failed: Any) -> None:
  """Raises NumPy's error for a concrete failed check code."""
  if isinstance(failed, jc.Tracer):
    return
  code = int(np.asarray(failed))
  if code:
    error = IndexError if code == EMPTY_INDEX else ShapeError
    raise error(_MESSAGES[code])


# --- for the spellings (`_spellings/data_dependent.py`) ---------------------------

def tracing_now() -> bool:
  """Whether polyjit is tracing a function symbolically (`tracing()`)."""
  return getattr(_local, "state", None) is not None


def in_trace(*arrays: Any) -> bool:
  """Replace JAX's function: polyjit is tracing and an operand is traced."""
  return tracing_now() and any(isinstance(a, jc.Tracer) for a in arrays)


def provably_equal(a: Any, b: Any) -> bool:
  try:
    return bool(a == b)
  except Exception:
    return False
