"""Size comparisons in user code: one trace per side, chosen at run time.

User code branches on sizes: `if x.shape[0] == 1:`, `n % 2 == 0`, `n > 3`,
`x.shape[0] == y.shape[0]`. A symbolic trace follows one side of each such
comparison, so it is valid only for the sizes on that side. polyjit never lets
that be silent. While it traces, every undecidable comparison asked from user
code goes to an oracle (`_jax.size_decisions`), and the trace records
the answers it took: a **variant** is `fun` traced for one side of every
comparison it asked, valid exactly where those answers hold. Comparisons that
JAX's own code cannot decide (`lax.top_k(x, 3)` needs `n >= 3`) are settled as
*guards* instead: a constraint added to the symbolic scope, so JAX's shape
rules can use it.

* **Concrete sizes** (`pj.jit`, `pj.mask` called with ints): the oracle answers
  as the sizes do; the variant for those sizes is traced once and reused by
  every later size on the same sides (`for_sizes`).
* **Traced sizes** (`jax.jit(pj.mask(f))`, `pj.vmap` over `pj.Ragged`,
  `jax.vmap` over sizes): every side that some size in `[1, padded]` can
  reach is traced (`explore`: a depth-first walk over the answers, pruned by
  enumerating the sizes the padded arrays allow), and the program selects the
  variant at run time from the traced sizes (`_masking/mask.py`: `lax.switch`, a
  select under `vmap`). A mixed ragged batch is then right in one program.
  An inequality between sizes (`n >= m`) is answered freely first; only if
  that trace fails (`x[:min(n, m)] * y[:min(n, m)]` needs JAX to know which is
  smaller) is it settled as a constraint, both sides traced
  (`_settle_between_sizes`); such a side runs at padded sizes raised to
  satisfy it (`mask._padded_for`).

A variant whose trace fails (a side where `fun` raises, like `jax.jit` would
on those sizes) keeps its error: it is raised for the sizes that select it, or
at trace time when sizes are traced, naming the comparison and the constraint
that would exclude that side.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Sequence

import jax.numpy as jnp

from . import dims as _dims
from .. import _jax as jc
from . import data_dependent as _data_dependent, spec as _spec
from .errors import MaskingError, ShapeError, SizeValueError, expression_too_large

MAX_VARIANTS = 16        # sides traced for one function before giving up
MAX_GUARDS = 8           # guards settled for one variant before giving up
_MAX_DOMAIN_POINTS = 50_000

Decisions = tuple[tuple[jc.SizeDecision, bool], ...]   # ((comparison, answer), ...)


def decision_holds(decision: jc.SizeDecision, sizes: dict[str, Any]) -> Any:
  """Whether a size comparison holds at these sizes: a bool for ints, a
  traced bool else."""
  value = _dims.evaluate_dim(decision.expr, sizes)
  return value == 0 if decision.kind == "eq" else value >= 0


@dataclasses.dataclass(eq=False)
class Variant:
  """`fun` traced for one side of each size comparison it asked.

  Valid where every recorded answer and every guard holds. `traced` is None
  when the trace failed on this side; `error` says why.
  """
  constraints: tuple[str, ...]              # the scope's constraints (guards included)
  decisions: Decisions                      # ((SizeDecision, answer), ...)
  traced: Any = None
  error: BaseException | None = None
  other_side: str | None = None             # the guard that would exclude this side

  @property
  def key(self) -> tuple[tuple[str, ...], tuple[tuple[tuple[str, str], bool], ...]]:
    """Identifies the variant (part of its programs' keys)."""
    return self.constraints, tuple((d.key, a) for d, a in self.decisions)

  @property
  def scope(self) -> jc.SymbolicScope:
    return _spec.make_scope(self.constraints)

  def holds(self, sizes: dict[str, int]) -> bool:
    """Whether concrete sizes select this variant (on every `pj.jit` call)."""
    if not self.decisions and not self.constraints:
      return True
    return (all(bool(decision_holds(d, sizes)) == a for d, a in self.decisions)
            and _spec.violated_constraint(sizes, self.scope) is None)

  def holds_traced(self, env: dict[str, Any]) -> Any:
    """Whether (traced) sizes select this variant, as a traced bool."""
    out = jnp.bool_(True)
    for d, answer in self.decisions:
      h = decision_holds(d, env)
      out = out & (h if answer else ~h)
    for _, kind, diff in jc.scope_constraints(self.scope):
      value = _dims.evaluate_dim(diff, env)
      out = out & ((value == 0) if kind == "eq" else (value >= 0))
    return out

  def describe(self) -> str:
    shown = self.decisions[-4:]   # the last comparisons tell the side apart
    parts = [f"{d.text} is {user_answer(d, a)} (at {d.where})" for d, a in shown]
    if len(self.decisions) > len(shown):
      parts.insert(0, f"({len(self.decisions) - len(shown)} earlier comparisons)")
    parts += [f"'{c}'" for c in self.constraints]
    return "; ".join(parts) if parts else "every size"

  def excludes(self, other: "Variant") -> bool:
    """Whether no size can select both (they differ on some comparison)."""
    mine = {d.key: a for d, a in self.decisions}
    return (any(mine.get(d.key, a) != a for d, a in other.decisions)
            or set(self.constraints) != set(other.constraints)
            or any(_different_values(d, e) for d, a in self.decisions if a
                   for e, b in other.decisions if b))


def _different_values(d: jc.SizeDecision, e: jc.SizeDecision) -> bool:
  """Whether two equalities that both hold (`n == 1`, `n == 2`: a hash or a
  `==` per size) pin one expression to two different values."""
  if d.kind != "eq" or e.kind != "eq":
    return False
  # (each trace has its own scope, so the expressions cannot be subtracted:
  # their difference is a nonzero constant if it is one at several points)
  names = sorted(jc.symbolic_vars(d.expr) | jc.symbolic_vars(e.expr))
  diffs = {_dims.evaluate_dim(d.expr, p) - _dims.evaluate_dim(e.expr, p)
           for p in ({v: k + 7 * i for i, v in enumerate(names)} for k in (3, 11, 29))}
  return len(diffs) == 1 and diffs != {0}


def excluding_constraint(variant: Variant) -> str | None:
  """A constraint that excludes `variant`'s side of its last inequality
  (`n >= 3` for the side of `assert x.shape[0] > 2` that fails), or None."""
  for d, answer in reversed(variant.decisions):
    if d.kind == "ge":
      return f"{d.expr} >= 0" if not answer else f"{-d.expr} >= 1"
  return None


def user_answer(decision: jc.SizeDecision, answer: bool) -> bool:
  """The answer to the question as the user wrote it (`decision.text`): the
  oracle answers `expr >= 0` / `expr == 0`, and `n > 2` is `not (2 - n >= 0)`."""
  text = decision.text
  if decision.kind == "ge" and ("' > '" in text or "' < '" in text):
    return not answer
  if text.startswith("bool("):
    return not answer
  return answer


class _Settle(Exception):
  """Concrete sizes make two dimensions equal: trace again with `constraint`."""

  def __init__(self, constraint: str):
    super().__init__(constraint)
    self.constraint = constraint


class _SettleBetween(Exception):
  """Traced sizes: an inequality between sizes asked where user code could
  catch a failure: settled as a constraint on each side (`explore`)."""


class _Oracle:
  """Answers the size comparisons of one trace, and records them.

  An equality between dimensions (`n == m`) is never answered True: its equal
  side is traced with the constraint 'm == n' instead (concrete sizes raise
  `_Settle`; exploring, the flip adds the constraint), so that JAX itself
  sees the shapes as equal.
  """

  def __init__(self, *, sizes: dict[str, int] | None = None,
               forced: dict[tuple[str, str], bool] | None = None,
               feasible: Callable[[Decisions], bool] | None = None):
    self.sizes = sizes                      # concrete sizes: answer as they do
    self.forced = dict(forced or {})        # key -> answer, given in advance
    self.feasible = feasible                # (decisions) -> bool, for pruning
    self.asked: list[tuple[jc.SizeDecision, bool, bool]] = []   # (decision, answer, free)
    self.assumed: list[tuple[Any, bool, str]] = []   # (expr, expr >= 0, text): `assume`
    self._answers: dict[tuple[str, str], bool] = {}

  def __call__(self, decision: jc.SizeDecision) -> bool:
    _data_dependent.refuse_decision(decision)
    key = decision.key
    if key in self._answers:
      return self._answers[key]
    free = False
    equality = decision.equality_constraint()
    if key in self.forced:
      answer = self.forced[key]
    elif self.sizes is not None:
      answer = bool(decision_holds(decision, self.sizes))
      if answer and equality is not None:
        raise _Settle(equality)
      if decision.kind == "ge" and len(jc.symbolic_vars(decision.expr)) >= 2:
        # `min(n, m)`, `n <= m` between sizes: JAX must know the side too, or
        # `x[:min(n, m)] * y[:min(n, m)]` would not type-check; traced again
        # with the side as a constraint ('m - n >= 0'), which selects it.
        raise _Settle(f"{decision.expr} >= 0" if answer else f"{decision.expr} <= -1")
    elif equality is not None:
      answer = False
      free = self.feasible is None or (self.feasible(self.decisions() + ((decision, True),))
                                       and self.feasible(self.decisions() + ((decision, False),)))
      if self.feasible is not None and not self.feasible(self.decisions() + ((decision, False),)):
        raise _Settle(equality)  # always equal here
    else:
      answer = decision.kind == "ge"  # either; the other side is explored next
      if self.feasible is not None:
        prior = self.decisions()
        yes = self.feasible(prior + ((decision, True),))
        no = self.feasible(prior + ((decision, False),))
        free = yes and no
        answer = yes if yes != no else answer
      else:
        free = True
      if (free and decision.kind == "ge" and len(jc.symbolic_vars(decision.expr)) >= 2
          and jc.user_code_can_catch()):
        # A free answer between sizes is settled as a constraint only when a
        # trace fails (`_settle_between_sizes`); user code that catches what
        # JAX raises (`x[:min(n, m)]` against `y`) would hide that failure
        # and go on where jax.jit never goes. So settled now.
        self._answers[key] = answer
        self.asked.append((decision, answer, free))
        raise _SettleBetween(str(decision))
    self._answers[key] = answer
    self.asked.append((decision, answer, free))
    return answer

  def decisions(self) -> Decisions:
    return tuple((d, a) for d, a, _ in self.asked)

  def assume(self, expr: Any, text: str) -> bool | None:
    """`expr >= 0` asked by JAX's own shape rules (`jnp.max` needs a size >= 1,
    `lax.top_k(y, k)` needs k <= the size), undecidable only because a
    data-dependent size may be 0: answered as JAX would for a non-empty
    selection, and recorded, so that the program checks it and raises where
    JAX would (`_data_dependent.extra_outputs`). None: not such a question."""
    answer = _data_dependent.decide_nonempty(expr)
    if answer is not None:
      self.assumed.append((expr, answer, text))
    return answer

  def refuse_value(self, expr: Any, where: str, how: str) -> SizeValueError:
    """`int(n)`, `range(n)`, `float(n)` in user code: the error to raise."""
    return SizeValueError(
        f"the size '{expr}' is converted to a Python number ({how}) at {where}; a "
        "masked trace serves many sizes, so a size has no Python value there.\n"
        "What to do: use the size as an array value (jnp.asarray(x.shape[0]), "
        "x.shape[0] * 2.0, len(x) / 2), compare it (n == 1, n > 3), loop with "
        "lax.scan / lax.fori_loop instead of range(n) or range(len(x)), or declare "
        "that axis fixed (polymorphic_shapes with '_' / a fixed dim). (`len(x)` "
        "answers the size, as x.shape[0] does; `_len = len` bound before the trace "
        "does not: write x.shape[0] there.)")

  def too_large(self, text: str, where: str) -> MaskingError:
    """A comparison of sizes too large for JAX's decision procedure."""
    return expression_too_large(text, where)

  def value_of(self, expr: Any, where: str) -> int:
    """A size's value, asked from user code by hashing it (`n in {1, 2}`,
    `{1: a}.get(n)`, `{n, 5}`): at concrete sizes the value, recorded as the
    decision `expr == value` (this trace then serves that value only); refused
    when sizes are traced, where no single value exists."""
    text = f"hash('{expr}')"
    if self.sizes is None:
      _data_dependent.refuse_decision(jc.SizeDecision("eq", expr, text, where))
      raise MaskingError(
          f"the size '{expr}' is used as a dictionary key or set member at {where} "
          "(`n in {1, 2}`, `{1: a}.get(n)`, a functools.cache argument), which needs "
          "its value; with traced sizes (jax.jit of a masked function, pj.vmap) one "
          "program serves every size, so there is none.\nWhat to do: compare "
          "explicitly (`n == 1 or n == 2`), or call with concrete sizes (pj.jit, "
          "pj.mask with ints). (A set built of sizes alone and then only counted, "
          "unpacked or iterated, `s = set(leaves); len(s)`, needs no value and works; "
          "one that also holds other values, `{n, 5}`, is built in a comprehension, "
          "or is looked up later, `5 in s`, needs the values.)")
    value = int(_dims.evaluate_dim(expr, self.sizes))
    self(jc.SizeDecision("eq", expr - value, f"{text} (value {value})", where))
    return value


class Domain:
  """The sizes a padded call can have: each dim in [1, padded], as points."""

  def __init__(self, padded: dict[str, int]):
    self._names = sorted(padded)
    self._padded = dict(padded)
    total = 1
    for v in self._names:
      total *= max(padded[v], 1)
    self._enumerable = total <= _MAX_DOMAIN_POINTS
    self._points: list[dict[str, int]] | None = None

  @property
  def points(self) -> list[dict[str, int]] | None:
    """Every size, listed on first use (most traces ask no comparison, and a
    padded size of 8192 takes milliseconds to list); None when too many."""
    if self._points is None and self._enumerable:
      names = self._names
      self._points = [dict(zip(names, p, strict=True)) for p in
                      itertools.product(*(range(1, self._padded[v] + 1) for v in names))]
    return self._points

  def feasible(self, decisions: Sequence[tuple[jc.SizeDecision, bool]], constraints: Sequence[str] = ()) -> bool:
    """Whether some size satisfies all these answers and guards (True when
    there are too many sizes to enumerate)."""
    points = self.points
    if points is None:
      return True
    scope = _spec.make_scope(tuple(constraints)) if constraints else None
    if scope is not None and any(
        not _dims.dim_vars(diff) <= set(self._names)
        for _, _, diff in jc.scope_constraints(scope)):
      # A guard on a size the domain does not hold (a data-dependent one,
      # `len(selection) >= 2`): undecided here, as when there are too many points.
      return True
    for p in points:
      if all(bool(decision_holds(d, p)) == a for d, a in decisions) and (
          scope is None or _spec.violated_constraint(p, scope) is None):
        return True
    return False


TraceFn = Callable[[tuple[str, ...], _Oracle], Any]   # (constraints, oracle) -> SymbolicTrace


def for_sizes(trace: TraceFn, constraints: tuple[str, ...], sizes: dict[str, int],
              known: Sequence[Variant]) -> Variant:
  """The variant for concrete sizes, traced as they answer each comparison;
  comparisons in JAX's own code become guards settled the same way."""
  guards: list[str] = []
  while True:
    oracle = _Oracle(sizes=sizes)
    all_constraints = constraints + tuple(guards)
    try:
      traced = trace(all_constraints, oracle)
    except _Settle as e:
      if e.constraint in guards or len(guards) >= MAX_GUARDS:
        return Variant(all_constraints, oracle.decisions(), error=MaskingError(
            f"cannot settle the size comparison {e.constraint}"))
      guards.append(e.constraint)
      continue
    except jc.InconclusiveDimensionOperation as e:
      guard = guard_for(e, sizes, _spec.make_scope(all_constraints))
      if guard is None or guard in guards or len(guards) >= MAX_GUARDS:
        return Variant(all_constraints, oracle.decisions(), error=e)
      guards.append(guard)
      continue
    except Exception as e:
      return Variant(all_constraints, oracle.decisions(), error=e)
    variant = Variant(all_constraints, oracle.decisions(), traced)
    for other in known:
      if not variant.excludes(other):
        raise _unseen_comparison(other.describe())
    return variant


# a side still to trace: (constraints, forced answers, tag: the guard that
# excludes it or the comparison flipped to reach it)
_Pending = tuple[tuple[str, ...], dict[tuple[str, str], bool], Any]


def _unseen_comparison(where: str) -> MaskingError:
  return MaskingError(
      "the function branches on a size in a way polyjit cannot follow: tracing it "
      f"for the other side of a comparison ({where}) did not ask that comparison "
      "again. This happens when the comparison is inside a function compiled with "
      "jax.jit, whose trace JAX caches.\nWhat to do: compare sizes outside "
      "jax.jit-compiled helpers (or call the helper without jax.jit), or give the "
      "size a fixed value.")


def explore(trace: TraceFn, constraints: tuple[str, ...], domain: Domain) -> list[Variant]:
  """Every variant some size of `domain` can select (depth-first)."""
  variants: list[Variant] = []
  stack: list[_Pending] = [(constraints, {}, None)]
  while stack:
    if len(variants) + len(stack) > MAX_VARIANTS:
      raise MaskingError(
          f"the function compares sizes in more than {MAX_VARIANTS} ways "
          "(each side of each comparison needs its own trace when sizes are traced).\n"
          "What to do: declare sizes fixed where they are, add constraints that "
          "settle comparisons (constraints=['n >= 4']), or call with concrete sizes.")
    cons, forced, tag = stack.pop()
    other_side = tag if isinstance(tag, str) else None
    flipped = tag if isinstance(tag, jc.SizeDecision) else None
    oracle = _Oracle(forced=forced,
                     feasible=functools.partial(domain.feasible, constraints=cons))
    try:
      traced = trace(cons, oracle)
    except _Settle as e:
      stack.append((cons + (e.constraint,), forced, tag))
      continue
    except jc.InconclusiveDimensionOperation as e:
      _push_flips(stack, cons, forced, oracle, domain)
      settled = {**forced, **{d.key: a for d, a in oracle.decisions()}}
      sides = guard_sides(e)
      if sides is None or len(cons) - len(constraints) >= MAX_GUARDS:
        variants.append(Variant(cons, oracle.decisions(), error=e, other_side=other_side))
        continue
      for side, other in (sides, sides[::-1]):
        if domain.feasible(oracle.decisions(), cons + (side,)):
          stack.append((cons + (side,), settled, other))
      continue
    except Exception as e:
      if len(cons) - len(constraints) < MAX_GUARDS and _settle_between_sizes(
          stack, cons, forced, oracle, domain):
        continue
      _push_flips(stack, cons, forced, oracle, domain)
      variants.append(Variant(cons, oracle.decisions(), error=e, other_side=other_side))
      continue
    if flipped is not None and flipped.key not in oracle._answers:
      raise _unseen_comparison(repr(flipped))
    _push_flips(stack, cons, forced, oracle, domain)
    variants.append(Variant(cons, oracle.decisions(), traced))
  return variants


def _settle_between_sizes(stack: list[_Pending], cons: tuple[str, ...],
                          forced: dict[tuple[str, str], bool], oracle: _Oracle,
                          domain: Domain) -> bool:
  """A trace that failed after an inequality between two or more sizes was
  answered without JAX knowing it (`min(n, m)`: `x[:min(n, m)] * y[:min(n, m)]`
  does not type-check unless JAX knows which is smaller): that comparison is
  settled as a constraint instead, each feasible side traced again ('n - m >= 0'
  and 'n - m <= -1'; concrete sizes do this at once, `_Oracle`). The answers
  before it are kept, and the other sides of the free ones before it walked.
  False: no such comparison (the failure is the variant's error).

  Only after a failure: a comparison whose answer no shape needs (`jnp.sum(a)
  if n >= m else jnp.sum(b)`) keeps its free answers, and so one padded
  environment for every side."""
  asked = oracle.asked
  at = next((i for i, (d, _, _) in enumerate(asked)
             if d.kind == "ge" and len(jc.symbolic_vars(d.expr)) >= 2), None)
  if at is None:
    return False
  d = asked[at][0]
  before = tuple((e, a) for e, a, _ in asked[:at])
  prefix = {**forced, **{e.key: a for e, a in before}}
  sides = [c for c in (f"{d.expr} >= 0", f"{d.expr} <= -1")
           if c not in cons and domain.feasible(before, cons + (c,))]
  if not sides:
    return False
  inner = _Oracle(forced=forced, feasible=oracle.feasible)
  inner.asked = list(asked[:at])
  _push_flips(stack, cons, forced, inner, domain)
  opposite = {f"{d.expr} >= 0": f"{d.expr} <= -1", f"{d.expr} <= -1": f"{d.expr} >= 0"}
  for side in sides:   # (the tag: the constraint that would exclude this side)
    stack.append((cons + (side,), dict(prefix), opposite[side]))
  return True


def _push_flips(stack: list[_Pending], cons: tuple[str, ...],
                forced: dict[tuple[str, str], bool], oracle: _Oracle,
                domain: Domain) -> None:
  """For each comparison answered freely, the other side, with the answers
  before it kept (each side of the tree is walked once)."""
  prefix = dict(forced)
  before: list[tuple[jc.SizeDecision, bool]] = []
  for d, a, free in oracle.asked:
    if free and domain.feasible(tuple(before) + ((d, not a),), cons):
      equality = d.equality_constraint()
      if equality is not None:  # the equal side: JAX sees the sizes as one
        stack.append((cons + (equality,), dict(prefix), None))
      else:
        stack.append((cons, {**prefix, d.key: not a}, d))
    prefix[d.key] = a
    before.append((d, a))


# --- guards: comparisons in JAX's own code ---------------------------------------

def guard_sides(error: Exception) -> tuple[str, str] | None:
  """The two constraints that settle an inconclusive comparison either way,
  e.g. ('n >= 3', 'n <= 2') for `3 <= n`."""
  cmp = jc.inconclusive_comparison(error)
  if cmp is None:
    return None
  a, op, b = cmp
  if op in (">", "<="):  # both are settled by whether a > b
    return f"{a} >= {b} + 1", f"{a} <= {b}"
  return f"{a} >= {b}", f"{a} <= {b} - 1"   # ">=" and "<": whether a >= b


def guard_for(error: Exception, sizes: dict[str, int], scope: jc.SymbolicScope) -> str | None:
  """The side of an inconclusive comparison that concrete sizes are on, as a
  constraint ('x_0 >= 11' for `x.shape[0] > 10` at x_0 = 20); None when the
  error is not such a comparison."""
  cmp = jc.inconclusive_comparison(error)
  sides = guard_sides(error)
  if cmp is None or sides is None:
    return None
  a, op, b = cmp
  try:
    lhs, rhs = (_dims.evaluate_dim(jc.symbolic_shape(t, scope=scope)[0], sizes) for t in (a, b))
  except Exception:
    return None
  settled = lhs > rhs if op in (">", "<=") else lhs >= rhs
  return sides[0] if settled else sides[1]


def check_same_outputs(variants: Sequence[Variant]) -> None:
  """With traced sizes every variant runs in one program: their outputs must
  have one structure, dtypes and symbolic shapes."""
  first = variants[0]
  a = first.traced
  for v in variants[1:]:
    b = v.traced
    same = (a.out_tree == b.out_tree and len(a.out_avals) == len(b.out_avals)
            and all(x.dtype == y.dtype and tuple(map(str, x.shape)) == tuple(map(str, y.shape))
                    for x, y in zip(a.out_avals, b.out_avals, strict=True)))
    if not same:
      def shapes(t: Any) -> str:
        return ", ".join(x.str_short() for x in t.out_avals)
      raise ShapeError(
          "the function's outputs depend on a size comparison: where "
          f"{first.describe()} they are ({shapes(a)}); where {v.describe()} they are "
          f"({shapes(b)}). With traced sizes (jax.jit of a masked function, pj.vmap) "
          "one program runs every size, so the outputs need one shape.\nWhat to do: "
          "make both sides return the same shapes, or call with concrete sizes "
          "(pj.jit, or pj.mask with Python ints), where each side gets its own program.")
