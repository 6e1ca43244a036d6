"""Property-based fuzzing of user code that branches on sizes (issue 10).

Hypothesis draws a program that compares sizes in Python (`==`, `!=`, `<`,
`<=`, `>`, `>=` against 0..4, parity and mod 3, and between two dynamic
sizes), nested, with `if`/`else` choosing between different computations
(sums, means, `x[0]`, `x[1:]`, cumsum, products, sorts, matmuls with the
parameters `W: (K, K)` and `v: (K,)`), some of them binding a sequence whose
*length* depends on the branch (`s = x[1:]` on one side, `s = x` on the other)
for later statements to compare again. The inputs are `x: (n,)` alone, or with
`y: (m,)` (two dynamic sizes), or with `y: (n, K)`. Every return has the same
shape (a scalar or a `(K,)` vector), and every statement is valid on every
size that reaches it (the sizes reaching each branch are enumerated while
drawing), so the program is well typed for every size >= 1. An `if` is
sometimes wrapped in user code that catches what polyjit raises into it to
steer the trace (`GUARDS`: a bare `except:`, `except BaseException`,
`except Exception`, `contextlib.suppress`, `finally`, a wrapping `raise ...
from e`), a comparison sometimes asks `int(n)`, and a term sometimes calls
`r`, which recurses on halves of a sequence (issue 31).

The sizes come from the branches: one on each side of each comparison that the
padded sizes allow, plus 1, 2, 3 and the bucket edges P - 1 and P; padding
holds NaN, inf and huge values. A program is run in one of these modes:

* `ragged`: `pj.vmap(f)` over a `pj.Ragged` batch mixing those sizes;
* `jit`: `jax.jit(pj.mask(f, specs))`, the sizes traced, called per size;
* `vmap`: `jax.vmap` of the masked function over a vector of sizes;
* `pj_jit_auto` / `pj_jit_explicit`: `pj.jit(f)` (automatic, and with
  `polymorphic_shapes=`) called at those sizes in a drawn order with a bucket
  edge at P, sometimes at size 0 too, where it must behave like `jax.jit(f)`;
* `grad`: `jax.grad` of the summed output under `jax.jit` with traced sizes,
  under `jax.vmap` over sizes, or through `pj.vmap` over a `Ragged`: gradients
  equal the unpadded ones and are exactly zero in the padding.

The reference is `f` on the unpadded arrays. A mode passes when every result
equals it (float32, rtol 1e-5), or when polyjit raises a `pj.PolyjitError`
(refusing is allowed; a wrong value or a raw JAX exception is not). At size
0 (issue 33: drawn in every mode but `grad`, sometimes) the reference is `f` on
the empty arrays under `jax.jit`: the same values, or, where it raises (`x[0]`
of an empty array), an exception from `pj.jit` and no plausible number (NaN)
where sizes are traced. A failure prints the program as Python source with its
sizes, padded sizes and seed.

The normal run checks `EXAMPLES` (24) programs in all, a few per mode, plus
the issue's examples in every mode; it is derandomized so that CI is
reproducible, and it does not shrink (a failure is reported at once). The long
run draws fresh programs, `POLYJIT_FUZZ_EXAMPLES` in all, and shrinks them:

    POLYJIT_FUZZ_EXAMPLES=600 .venv/bin/python -m pytest tests/test_fuzz_branches.py -q

Add `--hypothesis-show-statistics` to see how often polyjit refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import linecache
import math
import operator
import os
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st
from jax import lax

import polyjit as pj
from harness import garbage_like

LONG = "POLYJIT_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("POLYJIT_FUZZ_EXAMPLES", 24))   # in all, over MODES
K = 3                      # the fixed width of W, v and of y in the "xY" kind
P_MIN, P_MAX = 4, 9        # padded sizes are drawn from here
DOMAIN = range(1, 13)      # sizes enumerated to decide what each branch may do
MAX_DEPTH = 3              # nested ifs
MAX_LETS = 2               # statements binding a sequence in both branches
RTOL = ATOL = 1e-5
GRAD_TOL = 1e-4
MODES = ("ragged", "jit", "vmap", "pj_jit_auto", "pj_jit_explicit", "grad")
PER_MODE = max(1, math.ceil(EXAMPLES / len(MODES)))

CMP = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
       ">": operator.gt, ">=": operator.ge}
MIRROR = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

#: (kind) -> the program's parameters and pj.mask specs.
KINDS = {
    "x": (("x", "W", "v"), ["n", None, None]),
    "xy": (("x", "y", "W", "v"), ["n", "m", None, None]),
    "xY": (("x", "y", "W", "v"), ["n", "(n, _)", None, None]),
}


# --- sizes and sequences -------------------------------------------------------

def domain(kind) -> frozenset:
  """The (n, m) points the analysis enumerates (m = n without a second size)."""
  if kind == "xy":
    return frozenset((n, m) for n in DOMAIN for m in DOMAIN)
  return frozenset((n, n) for n in DOMAIN)


@dataclasses.dataclass(frozen=True, eq=False)
class Seq:
  """A 1-D float expression and its length at each (n, m)."""
  src: str
  length: Callable[[tuple], int]
  name: bool = False        # a plain name (usable as `s.shape[0]`)


@dataclasses.dataclass(frozen=True, eq=False)
class Cond:
  """A comparison of a sequence's length with a constant or another length."""
  lhs: Seq
  op: str
  rhs: "Seq | int"
  mod: int = 0
  flip: bool = False        # written `3 < x.shape[0]`
  style: str = "op"         # how Python asks: see `SPELLINGS`

  def holds(self, p) -> bool:
    a = self.lhs.length(p)
    if self.mod:
      a %= self.mod
    b = self.rhs if isinstance(self.rhs, int) else self.rhs.length(p)
    return CMP[self.op](a, b)

  @property
  def src(self) -> str:
    a = f"{self.lhs.src}.shape[0]" + (f" % {self.mod}" if self.mod else "")
    b = str(self.rhs) if isinstance(self.rhs, int) else f"{self.rhs.src}.shape[0]"
    if self.style != "op" and isinstance(self.rhs, int) and self.op in ("==", "!="):
      return SPELLINGS[self.style][self.op == "!="].format(a=a, b=self.rhs)
    return f"{b} {MIRROR[self.op]} {a}" if self.flip and not self.mod else f"{a} {self.op} {b}"


#: Other ways Python asks `a == b` / `a != b` of a size and a constant (issue
#: 22 §2): a float, truth of a difference, hashing (a set, a dict), membership
#: in a range. Hashing is refused under traced sizes (allowed here).
SPELLINGS = {
    "float": ("{a} == {b}.0", "{a} != {b}.0"),
    "bool": ("not ({a} - {b})", "bool({a} - {b})"),
    "set": ("{a} in {{{b}, -7}}", "{a} not in {{{b}, -7}}"),
    "dict": ("{{{b}: True}}.get({a}, False)", "{{{b}: False}}.get({a}, True)"),
    "range": ("{a} in range({b}, {b} + 1)", "{a} not in range({b}, {b} + 1)"),
    # refused (a size has no Python value in a masked trace), also when the
    # program catches the refusal (`GUARDS`): jax.jit takes the other side
    "int": ("int({a}) == {b}", "int({a}) != {b}"),
}


#: User code around a size question (issue 31): (lines before, lines after)
#: the `if`, which goes inside. polyjit raises into user code to steer a trace
#: (leave a shared scope, settle a comparison, refuse `int(n)`); catching that
#: must never change the side the trace takes.
GUARDS = {
    "none": ((), ()),
    "bare": (("try:",), ("except:  # noqa: E722", "  return {leaf}")),
    "base": (("try:",), ("except BaseException:", "  return {leaf}")),
    "exception": (("try:",), ("except Exception:", "  return {leaf}")),
    "suppress": (("with contextlib.suppress(BaseException):",), ("return {leaf}",)),
    "finally": (("try:",), ("finally:", "  _ = 0")),
    "wrap": (("try:",), ("except BaseException as e:",
                         "  raise RuntimeError('the user wraps it') from e")),
}
GUARDS = {"none": GUARDS["none"], **GUARDS, "none2": GUARDS["none"], "none3": GUARDS["none"]}


#: A helper every program may call (issue 31: recursion on sizes hung in
#: JAX's decision procedure); its splits are comparisons the oracle answers.
RECURSION = """\
def r(s):
  if s.shape[0] <= 1:
    return jnp.sum(s)
  h = s.shape[0] // 2
  return r(s[:h]) + 2.0 * r(s[h:])

"""


# Every template is an atom (a call, a subscript or parenthesized), so that
# templates nest without precedence surprises.
# 1-D transforms: (template, entries dropped). Valid when the result keeps >= 1.
TRANSFORMS = [("{s}", 0), ("{s}[1:]", 1), ("{s}[:-1]", 1), ("{s}[2:]", 2),
              ("jnp.cumsum({s})", 0), ("jnp.tanh({s})", 0), ("{s}[::-1]", 0),
              ("jnp.sort({s})", 0), ("(jnp.sin({s}) * 2.0)", 0), ("({s} * {s})", 0)]
# 1-D -> scalar: (template, least length).
REDUCERS = [("jnp.sum({s})", 1), ("jnp.mean({s})", 1), ("{s}[0]", 1), ("{s}[-1]", 1),
            ("{s}[1]", 2), ("{s}[2]", 3), ("jnp.max({s})", 1), ("jnp.prod(jnp.tanh({s}))", 1),
            ("jnp.dot({s}, {s})", 1), ("jax.nn.logsumexp({s})", 1),
            ("jnp.sum(jnp.cumsum({s}) * {s})", 1)]
# (n, K) transforms of y (kind "xY"), and (n, K) -> (K,) reducers.
TRANSFORMS_2D = [("y", 0), ("y[1:]", 1), ("jnp.cumsum(y, 0)", 0), ("jnp.tanh(y @ W)", 0),
                 ("y[::-1]", 0), ("(y * x[:, None])", 0)]
REDUCERS_2D = [("jnp.sum({Y}, 0)", 1), ("jnp.mean({Y}, 0)", 1), ("{Y}[0]", 1), ("{Y}[-1]", 1),
               ("{Y}[1]", 2), ("jnp.max({Y}, 0)", 1), ("jnp.prod(jnp.tanh({Y}), 0)", 1)]


def _min(region, f) -> int:
  return min((f(p) for p in region), default=10 ** 9)


# --- drawing programs ------------------------------------------------------------

class _Drawer:
  """Draws one program's statements; `region` is the set of sizes reaching
  the statement being drawn (every expression is valid on all of it; never
  empty, see `block`)."""

  def __init__(self, draw, kind, out):
    self.draw, self.kind, self.out = draw, kind, out
    self.lines: list[str] = []
    self.regions: list[frozenset] = []    # each side of each branch
    self.leaves = 0
    self.lets = 0
    self.full = domain(kind)

  # sequences ---------------------------------------------------------------
  def bases(self, env):
    out = [Seq("x", lambda p: p[0], True)]
    if self.kind == "xy":
      out.append(Seq("y", lambda p: p[1], True))
    if self.kind == "xY":
      out.append(Seq("(y @ v)", lambda p: p[0]))
    return out + env

  def seq(self, env, region) -> Seq:
    """A 1-D expression with >= 1 entry on `region`: a base or bound sequence
    under up to two transforms."""
    s = self.draw(st.sampled_from(self.bases(env)))
    for _ in range(self.draw(st.integers(0, 2))):
      options = [(t, d) for t, d in TRANSFORMS if _min(region, s.length) - d >= 1]
      t, d = self.draw(st.sampled_from(options))
      if t == "{s}":
        continue
      length = s.length
      s = Seq(t.format(s=s.src), (lambda p, length=length, d=d: length(p) - d))
    return s

  def scalar_term(self, env, region) -> str:
    choices = ["reduce", "reduce", "reduce", "size"]
    if self.kind == "xy":
      choices += ["cross"]
    if self.kind == "xY":
      choices += ["matrix"]
    choices += ["rec"]
    what = self.draw(st.sampled_from(choices))
    if what == "rec":  # recursion on sizes (`RECURSION`): halves its argument
      return f"r({self.seq(env, region).src})"
    if what == "size":
      named = [s for s in self.bases(env) if s.name]
      s = self.draw(st.sampled_from(named))
      scale = self.draw(st.sampled_from(["0.5", "0.25", "1.5"]))
      return f"({s.src}.shape[0] * {scale} + {self.reduce(env, region)})"
    if what == "cross":
      options = ["jnp.sum(jnp.concatenate([x, y]))", "x[0] * y[-1]", "jnp.mean(x) * jnp.sum(y)"]
      if all(n == m for n, m in region):
        options.append("jnp.dot(x, y)")
      if all(n >= m for n, m in region):
        options.append("jnp.dot(x[:y.shape[0]], y)")
      if all(m >= n for n, m in region):
        options.append("jnp.dot(x, y[:x.shape[0]])")
      return self.draw(st.sampled_from(options))
    if what == "matrix":
      Y, drop = self.matrix(region)
      options = ["jnp.sum({Y})", "jnp.sum({Y} @ v)"] + (["x @ {Y} @ v"] if drop == 0 else [])
      return self.draw(st.sampled_from(options)).format(Y=Y)
    return self.reduce(env, region)

  def reduce(self, env, region) -> str:
    s = self.seq(env, region)
    options = [t for t, need in REDUCERS if _min(region, s.length) >= need]
    return self.draw(st.sampled_from(options)).format(s=s.src)

  def matrix(self, region) -> tuple[str, int]:
    options = [(t, d) for t, d in TRANSFORMS_2D if _min(region, lambda p: p[0]) - d >= 1]
    return self.draw(st.sampled_from(options))

  def vector_term(self, env, region) -> str:
    choices = ["scale", "scale", "mix"] + (["matrix"] * 3 if self.kind == "xY" else [])
    what = self.draw(st.sampled_from(choices))
    if what == "scale":
      return f"({self.scalar_term(env, region)}) * v"
    if what == "mix":
      return f"jnp.tanh(({self.scalar_term(env, region)}) * v) @ W"
    Y, drop = self.matrix(region)
    options = [t for t, need in REDUCERS_2D if _min(region, lambda p: p[0]) - drop >= need]
    options += ["x @ {Y}"] if drop == 0 else []
    return self.draw(st.sampled_from(options)).format(Y=Y)

  def leaf(self, env, region) -> str:
    term = self.vector_term if self.out == "vector" else self.scalar_term
    expr = term(env, region)
    if self.draw(st.booleans()):
      expr = f"{expr} + {term(env, region)}"
    # A distinct offset per return: a wrong branch can never match by chance.
    self.leaves += 1
    return f"{expr} + {self.leaves}.0"

  # statements --------------------------------------------------------------
  def cond(self, env, region) -> Cond:
    named = [s for s in self.bases(env) if s.name]
    lhs = self.draw(st.sampled_from(named))
    form = self.draw(st.sampled_from(["const", "const", "mod", "pair"]))
    flip = self.draw(st.booleans())
    if form == "mod":
      mod = self.draw(st.sampled_from([2, 3]))
      c = Cond(lhs, self.draw(st.sampled_from(["==", "!="])), self.draw(st.integers(0, mod - 1)),
               mod=mod)
    elif form == "pair" and len(named) > 1:
      rhs = self.draw(st.sampled_from([s for s in named if s is not lhs]))
      c = Cond(lhs, self.draw(st.sampled_from(list(CMP))), rhs, flip=flip)
    else:
      op = self.draw(st.sampled_from(list(CMP)))
      style = (self.draw(st.sampled_from(["op", "op", *SPELLINGS])) if op in ("==", "!=")
               else "op")
      c = Cond(lhs, op, self.draw(st.integers(0, 4)), flip=flip, style=style)
    return c

  def split_cond(self, env, region) -> Cond:
    """A comparison, mostly one that both sides of `region` reach."""
    for _ in range(4):
      c = self.cond(env, region)
      sides = {c.holds(p) for p in region}
      if len(sides) == 2:
        return c
    return c

  def block(self, env, region, depth, indent, first=False) -> None:
    pad = "  " * indent
    choices = ["if", "if", "let"] if first else ["return", "return", "if", "let"]
    if depth >= MAX_DEPTH:
      choices = [c for c in choices if c != "if"] or ["let"]
    if self.lets >= MAX_LETS:
      choices = [c for c in choices if c != "let"] or ["return"]
    what = self.draw(st.sampled_from(choices))
    if what == "return":
      self.lines.append(f"{pad}return {self.leaf(env, region)}")
      return
    c = self.split_cond(env, region)
    yes = frozenset(p for p in region if c.holds(p))
    no = region - yes
    self.regions += [yes, no]
    # A side no size reaches is never run; it is drawn valid where its parent is.
    yes, no = yes or region, no or region
    if what == "if":
      guard = self.draw(st.sampled_from(list(GUARDS)))
      head, tail = GUARDS[guard]
      inner = pad + ("  " if head else "")
      self.lines += [pad + line for line in head]
      self.lines.append(f"{inner}if {c.src}:")
      self.block(env, yes, depth + 1, len(inner) // 2 + 1)
      self.lines.append(f"{inner}else:")
      self.block(env, no, depth + 1, len(inner) // 2 + 1)
      # (never reached by the reference: every side above returns, and no
      # line raises at concrete sizes; a polyjit trace must not reach it either)
      self.lines += [pad + line.format(leaf=self.leaf(env, region) if "{leaf}" in line else "")
                     for line in tail]
      return
    # let: `s = A` on one side, `s = B` on the other (lengths may differ), then on.
    self.lets += 1
    name = f"s{self.lets}"
    a, b = self.seq(env, yes), self.seq(env, no)
    self.lines += [f"{pad}if {c.src}:", f"{pad}  {name} = {a.src}", f"{pad}else:",
                   f"{pad}  {name} = {b.src}"]
    length = lambda p, a=a, b=b, c=c: a.length(p) if c.holds(p) else b.length(p)
    self.block(env + [Seq(name, length, True)], region, depth, indent)


@dataclasses.dataclass(eq=False)
class Program:
  """A drawn program: its source, the function, and the size regions of its
  branches (to pick sizes on both sides of each comparison)."""
  source: str
  kind: str
  out: str
  regions: tuple = ()

  def __post_init__(self):
    digest = hashlib.sha1(self.source.encode()).hexdigest()[:12]
    filename = f"<fuzz-branches-{digest}>"
    # Tracebacks and polyjit's messages can show the lines.
    linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
    namespace = {"jax": jax, "jnp": jnp, "lax": lax, "contextlib": contextlib}
    exec(compile(self.source, filename, "exec"), namespace)
    self.fun = namespace["f"]

  @property
  def names(self):
    return KINDS[self.kind][0]

  @property
  def specs(self):
    return KINDS[self.kind][1]

  def __repr__(self):
    return "\n" + self.source

  def _repr_pretty_(self, p, cycle):  # how Hypothesis prints a failing example
    p.text(repr(self))


@st.composite
def programs(draw):
  kind = draw(st.sampled_from(list(KINDS)))
  out = draw(st.sampled_from(["scalar", "vector"]))
  d = _Drawer(draw, kind, out)
  comment = {"x": "x: (n,)", "xy": "x: (n,), y: (m,)", "xY": f"x: (n,), y: (n, {K})"}[kind]
  d.lines.append(f"def f({', '.join(KINDS[kind][0])}):   # {comment}, W: ({K}, {K}), "
                 f"v: ({K},); returns {'()' if out == 'scalar' else f'({K},)'}")
  d.block([], d.full, 0, 1, first=True)
  return Program(RECURSION + "\n".join(d.lines) + "\n", kind, out, tuple(d.regions))


# --- setups: sizes, padding, data ----------------------------------------------------

@dataclasses.dataclass(eq=False)
class Setup:
  program: Program
  padded: tuple             # (P, Q): padded n and m (Q = P without m)
  points: tuple             # logical (n, m), in call order
  seed: int
  via: str = ""             # grad: "jit", "vmap" or "ragged"

  def __repr__(self):
    n = "n" if self.program.kind != "xy" else "(n, m)"
    pts = [p[0] if self.program.kind != "xy" else p for p in self.points]
    return (f"Setup(padded={self.padded}, sizes {n}={pts}, seed={self.seed}"
            f"{', via=' + repr(self.via) if self.via else ''}) for{self.program!r}")

  def _repr_pretty_(self, p, cycle):
    p.text(repr(self))


def _in_box(p, padded):
  return 1 <= p[0] <= padded[0] and 1 <= p[1] <= padded[1]


@st.composite
def setups(draw, mode):
  program = draw(programs())
  P = draw(st.integers(P_MIN, P_MAX))
  Q = draw(st.integers(P_MIN, P_MAX)) if program.kind == "xy" else P
  padded = (P, Q)
  pick = lambda pts: draw(st.sampled_from(sorted(pts)))
  sides = []  # one size on each side of each comparison, where the padded sizes allow
  for region in program.regions:
    inside = [p for p in region if _in_box(p, padded)]
    if inside:
      sides.append(pick(inside))
  # 1, 2, 3 and the bucket edges P - 1, P, each for n and for m.
  edges_n = [1, 2, 3, P - 1, P]
  if program.kind == "xy":
    edges = list(zip(edges_n, draw(st.permutations([1, 2, 3, Q - 1, Q]))))
  else:
    edges = [(n, n) for n in edges_n]
  points = list(dict.fromkeys(sides + edges))
  if mode == "grad":  # the unpadded gradients are costly: 1, P and a few more
    points = list(dict.fromkeys([edges[0], edges[-1]] + points))[:6]
  if mode.startswith("pj_jit"):
    points = draw(st.permutations(points))
  if mode != "grad" and draw(st.integers(0, 3)) == 0:  # size 0: what jax.jit does
    zero = (0, 0) if program.kind != "xy" else draw(st.sampled_from([(0, 2), (3, 0), (0, 0)]))
    points.insert(draw(st.integers(0, len(points))), zero)
  via = draw(st.sampled_from(["jit", "vmap", "ragged"])) if mode == "grad" else ""
  return Setup(program, padded, tuple(points), draw(st.integers(0, 2 ** 16)), via)


def _example(program: Program, p, rng):
  """Unpadded dynamic arguments for sizes p = (n, m)."""
  n, m = p
  x = rng.standard_normal(n).astype(np.float32)
  if program.kind == "x":
    return [x]
  if program.kind == "xy":
    return [x, rng.standard_normal(m).astype(np.float32)]
  return [x, rng.standard_normal((n, K)).astype(np.float32)]


def _params(rng):
  return [(0.5 * rng.standard_normal((K, K))).astype(np.float32),
          rng.standard_normal(K).astype(np.float32)]


def _pad(x, size, rng):
  out = garbage_like(np.zeros((size,) + x.shape[1:], x.dtype), rng)
  out[:x.shape[0]] = x
  return out


def _padded(program, dyn, padded, rng):
  return [_pad(a, s, rng) for a, s in zip(dyn, padded)]


def _env(program, p):
  return {"n": p[0], "m": p[1]} if program.kind == "xy" else {"n": p[0]}


# --- references and comparisons -------------------------------------------------------

def reference(program, dyn, params):
  """`f` on the unpadded arrays."""
  out = program.fun(*map(jnp.asarray, dyn), *map(jnp.asarray, params))
  expected = () if program.out == "scalar" else (K,)
  assert np.shape(out) == expected, (  # a bug of this test, not of polyjit
      f"the drawn program returns shape {np.shape(out)}, not {expected}:\n{program.source}")
  return out


def reference_grads(program, dyn, params):
  args = [*map(jnp.asarray, dyn), *map(jnp.asarray, params)]
  return jax.grad(lambda *a: jnp.sum(program.fun(*a)), argnums=tuple(range(len(args))))(*args)


def assert_close(got, want, what, setup, tol=RTOL):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}\n{setup!r}"
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True,
                             err_msg=f"{what}\n{setup!r}")


def assert_grads(got, want, what, setup):
  """Gradients: the valid region equals the unpadded gradient and the padding
  of each dynamic input's gradient is exactly zero."""
  for i, (g, w) in enumerate(zip(got, want)):
    g, w = np.asarray(g), np.asarray(w)
    name = setup.program.names[i]
    if g.shape != w.shape:  # a padded input
      assert g.shape[1:] == w.shape[1:], (what, name, g.shape, w.shape)
      assert_close(g[:w.shape[0]], w, f"{what}: gradient wrt {name} (valid region)", setup,
                   GRAD_TOL)
      rest = g[w.shape[0]:]
      assert np.all(rest == 0), f"{what}: gradient wrt {name} is not zero in the padding: {g}\n{setup!r}"
    else:
      assert_close(g, w, f"{what}: gradient wrt {name}", setup, GRAD_TOL)


def _report(what: str, detail: str = "") -> None:
  """Counted by Hypothesis (`--hypothesis-show-statistics`) inside a fuzz test."""
  if currently_in_test_context():
    event(what)
    if detail:
      note(detail)


def _refused(e: pj.PolyjitError, setup, mode):
  _report(f"{mode}: polyjit refused ({type(e).__name__})",
          f"{mode}: polyjit refused with {type(e).__name__}: {str(e).splitlines()[0]}")


# --- modes -------------------------------------------------------------------------

def check(setup: Setup, mode: str) -> None:
  try:
    _check(setup, mode)
  except AssertionError:
    raise
  except Exception as e:  # a raw JAX exception, or a refusal at size 0: show the program
    e.add_note(f"while checking {mode}: {setup!r}")
    raise


def _check(setup: Setup, mode: str) -> None:
  program = setup.program
  rng = np.random.default_rng(setup.seed)
  params = _params(rng)
  dyn_n = len(program.names) - 2
  padded = setup.padded[:dyn_n]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")   # FallbackWarning, mean of empty slices at size 0
    if mode.startswith("pj_jit"):
      return _check_pj_jit(setup, mode, params, rng)
    examples = [_example(program, p, rng) for p in setup.points]
    padded_examples = [_padded(program, d, padded, rng) for d in examples]
    try:
      if mode == "grad":
        return _check_grad(setup, params, examples, padded_examples)
      if mode == "jit":
        masked = jax.jit(pj.mask(program.fun, program.specs))
        outs = [masked((*a, *params), _env(program, p))
                for a, p in zip(padded_examples, setup.points)]
      elif mode == "vmap":
        masked = pj.mask(program.fun, program.specs)
        stacked, env = _stack(program, padded_examples, setup.points)
        outs = jax.jit(jax.vmap(masked, in_axes=((0,) * dyn_n + (None, None), 0)))(
            (*stacked, *params), env)
      elif mode == "ragged":
        outs = _ragged_call(program, padded_examples, setup.points, params)
      else:
        raise ValueError(mode)
    except pj.PolyjitError as e:
      return _refused(e, setup, mode)
    for b, (a, p) in enumerate(zip(examples, setup.points)):
      what = f"{mode}: example {b}, sizes {_env(program, p)}"
      if min(p) == 0:
        _check_traced_size_zero(program, outs[b], a, params, what, setup)
        continue
      assert_close(outs[b], reference(program, a, params), what, setup)


def _check_traced_size_zero(program, got, dyn, params, what, setup):
  """At a traced length 0: `f` on the empty arrays, or where JAX raises there
  (x[0] of an empty array), no plausible number (NaN)."""
  try:
    want = jax.jit(program.fun)(*dyn, *params)
  except Exception as e:
    _report(f"size 0: jax.jit raises {type(e).__name__}")
    assert np.isnan(np.asarray(got)).all(), (
        f"{what}: jax.jit raises {type(e).__name__} at size 0, but the traced call "
        f"returns {got}\n{setup!r}")
    return
  assert_close(got, want, f"{what} (size 0: must equal jax.jit)", setup)


def _stack(program, padded_examples, points):
  stacked = [np.stack(col) for col in zip(*padded_examples)]
  env = {k: np.array([_env(program, p)[k] for p in points], np.int32)
         for k in _env(program, points[0])}
  return stacked, env


def _ragged(program, data, points):
  """The dynamic arguments as Ragged values (their padding is the garbage of
  `data`), and how `f` takes them."""
  n = np.array([p[0] for p in points], np.int32)
  if program.kind == "x":
    return [pj.Ragged(data[0], n)], program.fun
  if program.kind == "xy":
    m = np.array([p[1] for p in points], np.int32)
    return [pj.Ragged(data[0], n), pj.Ragged(data[1], m)], program.fun
  fun = program.fun
  return [pj.Ragged((data[0], data[1]), n)], lambda xy, W, v: fun(*xy, W, v)


def _ragged_call(program, padded_examples, points, params, data=None):
  data = data if data is not None else [np.stack(col) for col in zip(*padded_examples)]
  raggeds, fun = _ragged(program, data, points)
  axes = (0,) * len(raggeds) + (None, None)
  return pj.vmap(fun, in_axes=axes)(*raggeds, *params)


def _check_grad(setup, params, examples, padded_examples):
  program = setup.program
  masked = pj.mask(program.fun, program.specs)
  dyn_n = len(examples[0])
  loss = lambda args, env: jnp.sum(masked(args, env))
  grad = jax.grad(loss)
  what = f"grad via {setup.via}"
  if setup.via == "jit":
    run = jax.jit(grad)
    grads = [run((*a, *params), _env(program, p))
             for a, p in zip(padded_examples, setup.points)]
  elif setup.via == "vmap":
    stacked, env = _stack(program, padded_examples, setup.points)
    batched = jax.jit(jax.vmap(grad, in_axes=((0,) * dyn_n + (None, None), 0)))(
        (*stacked, *params), env)
    grads = [[np.asarray(g)[b] for g in batched] for b in range(len(examples))]
  else:  # through pj.vmap over a Ragged: one loss for the whole batch
    stacked = [np.stack(col) for col in zip(*padded_examples)]
    batch_loss = lambda data, W, v: jnp.sum(
        _ragged_call(program, None, setup.points, (W, v), data=data))
    g_data, g_W, g_v = jax.grad(batch_loss, argnums=(0, 1, 2))(stacked, *params)
    want = [reference_grads(program, a, params) for a in examples]
    for b, p in enumerate(setup.points):
      assert_grads([g[b] for g in g_data], want[b][:dyn_n],
                   f"{what}: example {b}, sizes {_env(program, p)}", setup)
    assert_close(g_W, sum(np.asarray(w[dyn_n]) for w in want), f"{what}: gradient wrt W",
                 setup, GRAD_TOL)
    assert_close(g_v, sum(np.asarray(w[dyn_n + 1]) for w in want), f"{what}: gradient wrt v",
                 setup, GRAD_TOL)
    return
  for b, (a, p) in enumerate(zip(examples, setup.points)):
    assert_grads(grads[b], reference_grads(program, a, params),
                 f"{what}: example {b}, sizes {_env(program, p)}", setup)


def _check_pj_jit(setup, mode, params, rng):
  program = setup.program
  P, Q = setup.padded
  buckets = sorted({P, Q, 16})     # sizes P and Q sit at a bucket's edge
  specs = program.specs if mode == "pj_jit_explicit" else None
  fun = pj.jit(program.fun, polymorphic_shapes=specs, buckets=buckets)
  for i, p in enumerate(setup.points):
    args = [*_example(program, p, rng), *params]
    what = f"{mode}: call {i}, sizes {_env(program, p)}"
    if min(p) == 0:
      _check_size_zero(program, fun, args, what, setup)
      continue
    try:
      got = fun(*args)
    except pj.PolyjitError as e:
      _refused(e, setup, mode)
      continue
    assert_close(got, reference(program, args[:-2], params), what, setup)


def _check_size_zero(program, fun, args, what, setup):
  """At length 0 pj.jit runs jax.jit's own program: same values, or an
  exception where jax.jit raises one."""
  try:
    want = jax.jit(program.fun)(*args)
  except Exception as e:  # jax.jit refuses (x[0] of an empty array): so must pj.jit
    _report(f"size 0: jax.jit raises {type(e).__name__}")
    try:
      got = fun(*args)
    except Exception:
      return
    raise AssertionError(f"{what}: jax.jit raises {type(e).__name__}: {e}\nbut pj.jit "
                         f"returns {got}\n{setup!r}")
  got = fun(*args)
  assert_close(got, want, f"{what} (size 0: must equal jax.jit)", setup)


# --- the fuzz tests (one per mode, so that each has its own derandomized draws) ---------

# The normal run does not shrink: a failure prints the drawn program at once
# (shrinking these can take Hypothesis's full five minutes per test). The
# long run shrinks.
fuzz = settings(max_examples=PER_MODE, deadline=None, derandomize=not LONG, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True,
                phases=list(Phase) if LONG else [Phase.explicit, Phase.generate])


@pytest.mark.parametrize("mode", ["ragged", "jit", "vmap", "pj_jit_auto", "pj_jit_explicit",
                                  "grad"])
@fuzz
@given(data=st.data())
def test_branches(mode, data):
  check(data.draw(setups(mode)), mode)


# --- the issue's examples ------------------------------------------------------------

REGRESSIONS = {
    # The issue's example: pj.vmap gave [3, 3] for the batch [[3.], [1., 2.]].
    "eq_1": ("x", "scalar", """\
def f(x, W, v):
  return x[0] * 0 + 42.0 if x.shape[0] == 1 else jnp.sum(x)
""", [(1, 1), (2, 2), (3, 3), (5, 5), (6, 6)]),
    "parity": ("x", "vector", """\
def f(x, W, v):
  if x.shape[0] % 2 == 0:
    return jnp.sum(x[1:]) * v
  return x[0] * v + 100.0
""", [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)]),
    "gt_3": ("x", "scalar", """\
def f(x, W, v):
  if x.shape[0] > 3:
    return jnp.prod(jnp.tanh(x[3:])) + x[3] + 7.0
  return jnp.mean(jnp.cumsum(x))
""", [(1, 1), (3, 3), (4, 4), (5, 5), (6, 6)]),
    "n_eq_m": ("xy", "scalar", """\
def f(x, y, W, v):
  if x.shape[0] == y.shape[0]:
    return jnp.dot(x, y)
  return jnp.sum(x) - jnp.sum(y) + 100.0
""", [(1, 1), (2, 2), (1, 2), (2, 1), (3, 5), (5, 5), (6, 6), (6, 4)]),
    # Issue 22 §2: questions that never reached the comparison hook.
    "set_dict_float": ("x", "scalar", """\
def f(x, W, v):
  a = 7.0 if x.shape[0] in {1, 2} else 1.0
  b = {1: 5.0}.get(x.shape[0], 3.0)
  c = 11.0 if x.shape[0] == 1.0 else 13.0
  d = 17.0 if x.shape[0] != 2.0 else 19.0
  return jnp.sum(x) + a + b * c + d
""", [(1, 1), (2, 2), (3, 3), (6, 6)]),
    "bool_range": ("x", "scalar", """\
def f(x, W, v):
  a = 1.0 if x.shape[0] - 1 else 7.0
  b = 2.0 if x.shape[0] in range(2, 4) else 3.0
  return jnp.sum(x) * a + b
""", [(1, 1), (2, 2), (3, 3), (4, 4), (6, 6)]),
    # Issue 22 §1: a jax.jit helper that branches on a size, traced on both sides.
    "jit_helper": ("x", "scalar", """\
@jax.jit
def helper(x):
  return x * 2.0 if x.shape[0] > 4 else x * 100.0
def f(x, W, v):
  return jnp.sum(helper(x))
""", [(2, 2), (5, 5), (1, 1), (6, 6)]),
}


#: The gradient of each example through one of the three ways (all are fuzzed).
REGRESSION_GRAD = {"eq_1": "ragged", "parity": "vmap", "gt_3": "jit", "n_eq_m": "vmap",
                   "set_dict_float": "jit", "bool_range": "ragged", "jit_helper": "vmap"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_issue_10_examples(name, mode):
  kind, out, source, points = REGRESSIONS[name]
  program = Program(source, kind, out)
  via = REGRESSION_GRAD[name] if mode == "grad" else ""
  zero = (0, 0) if kind == "x" else (0, 3)
  if mode.startswith("pj_jit"):  # both ways through each comparison, and size 0
    points = points + [zero] + points[::-1]
  elif mode != "grad":           # an empty example among the others
    points = points + [zero]
  check(Setup(program, (6, 6), tuple(points), seed=1, via=via), mode)


def test_issue_10_example_exact():
  """The issue's example verbatim: the batch [[3.], [1., 2.]] gives [42, 3]."""
  f = lambda x: x[0] * 0 + 42.0 if x.shape[0] == 1 else jnp.sum(x)
  out = pj.vmap(f)(pj.Ragged.from_list([np.array([3.], np.float32),
                                        np.array([1., 2.], np.float32)]))
  np.testing.assert_allclose(np.asarray(out), [42.0, 3.0])
