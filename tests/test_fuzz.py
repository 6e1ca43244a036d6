"""Property-based fuzzing: random programs of supported operations, masked.

Hypothesis draws a program: a few steps, each an operation (elementwise,
reductions, cumulative ops, contractions, indexing, concatenation, padding,
scans, cond, ...) applied to earlier values, starting from the inputs
`x0: (n,)` and `x1: (n, K)`, with the parameters `W: (K, K)` and `v: (K,)`.
With it come a padded size, logical sizes, padding contents (NaN, inf, huge;
by seed) and one of harness.MODES. `harness.check` then compares the masked
program with the unpadded one on the valid region: values eagerly, under jit
and under vmap over the logical sizes; gradients with respect to the padded
inputs and the unpadded parameters, with zeros in the padding.

Shapes are tracked symbolically while drawing (ints and `jax.export`
expressions in n), so every step is well typed: binary operations get equal
shapes, `x[1:]` only applies where at least one entry remains, gathers index
entries that exist at the smallest logical size. A failing example prints
the program as Python code, shrunk by Hypothesis.

The normal run checks `EXAMPLES` programs, derandomized so that CI is
reproducible. The long run draws fresh programs:

    POLYJIT_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/test_fuzz.py -q
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import export, lax

from harness import MODES, Case, check
from polyjit._masking import dims as _dims
from polyjit import _jax as jc

LONG = "POLYJIT_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("POLYJIT_FUZZ_EXAMPLES", 12))
N = export.symbolic_shape("n")[0]
N_MIN, P_MAX = 3, 9       # logical sizes are drawn from [N_MIN, padded <= P_MAX]
MAX_STEPS = 5
K = 3                     # the fixed width of x1, W and v


# --- shapes ------------------------------------------------------------------

def low(d) -> int:
  """The size of `d` at the smallest logical size."""
  return _dims.evaluate_dim(d, {"n": N_MIN})


def same(a, b) -> bool:
  return tuple(map(str, a)) == tuple(map(str, b))


# --- operations ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Op:
  """`fn(params, *args, **extra)`; `shape(*arg_shapes, **extra)` is the result
  shape, or None where the op does not apply. `extras(*arg_shapes)` lists the
  static choices (axis, indices) it can take."""
  name: str
  arity: int
  fn: Callable
  shape: Callable
  extras: Callable = lambda *shapes: [{}]


def _axes(s):
  return [{"axis": a} for a in range(len(s))]


def _unary(name, f):
  return Op(name, 1, lambda p, x: f(x), lambda s: s)


def _binary(name, f):
  return Op(name, 2, lambda p, a, b: f(a, b), lambda s, t: s if same(s, t) else None)


def _reduction(name, f):
  return Op(name, 1, lambda p, x, axis: f(x, axis), lambda s, axis: s[:axis] + s[axis + 1:],
            _axes)


def _along(name, f):
  return Op(name, 1, lambda p, x, axis: f(x, axis), lambda s, axis: s, _axes)


def _take_argmax(x, axis):
  index = jnp.argmax(x, axis=axis, keepdims=True)
  return jnp.take_along_axis(x, index, axis=axis).squeeze(axis)


def _cummax_ramp(x, axis):
  # A ramp breaks ties: at exact ties JAX's cummax JVP and polyjit's (at
  # symbolic sizes, see _masking/autodiff.py) pick different valid subgradients.
  ramp = lax.broadcasted_iota(x.dtype, x.shape, axis) * 1e-2
  return lax.cummax(x + ramp, axis=axis)


def _rnn(p, xs, reverse=False):
  def step(h, x):
    h = jnp.tanh(p["W"] @ h + x)
    return h, h
  return lax.scan(step, jnp.zeros(xs.shape[1], xs.dtype), xs, reverse=reverse)


def _leading(pred):
  """A shape rule for ops along axis 0: the shape if `pred(shape)`."""
  return lambda s: s if len(s) >= 1 and pred(s) else None


def _gather_choices(s):
  if not s:
    return []
  k = low(s[0])
  return [{"index": i} for i in ((0, -1), (k - 1, 0, -k), (1, 1)) if max(i) < k]


def _concat_shape(s, t):
  if len(s) >= 1 and len(t) >= 1 and same(s[1:], t[1:]):
    return (s[0] + t[0],) + s[1:]
  return None


def _contract(p, a, b):
  return jnp.dot(a, b) if a.ndim == 1 else a.T @ b


def _contract_shape(s, t):
  if len(s) == len(t) and len(s) in (1, 2) and str(s[0]) == str(t[0]):
    return s[1:] + t[1:]
  return None


def _pad_shape(s):
  return (s[0] + 3,) + s[1:] if s else None


def _pad(p, x):
  return jnp.pad(x, [(1, 2)] + [(0, 0)] * (x.ndim - 1), constant_values=0.5)


OPS = [
    _unary("sin", jnp.sin), _unary("tanh", jnp.tanh),
    _unary("exp_tanh", lambda x: jnp.exp(jnp.tanh(x))), _unary("abs", jnp.abs),
    _unary("relu", jax.nn.relu), _unary("sigmoid", jax.nn.sigmoid),
    _unary("softplus", jax.nn.softplus), _unary("affine", lambda x: 1.5 * x - 0.5),
    _unary("cond", lambda x: lax.cond(jnp.sum(x) > 0, jnp.sin, jnp.cos, x)),
    _binary("add", jnp.add), _binary("sub", jnp.subtract), _binary("mul", jnp.multiply),
    _binary("maximum", jnp.maximum), _binary("where_gt", lambda a, b: jnp.where(a > b, a, 0.5 * b)),
    Op("scale_rows", 2, lambda p, a, b: a * b[:, None],
       lambda s, t: s if len(s) == 2 and len(t) == 1 and str(s[0]) == str(t[0]) else None),
    _reduction("sum", jnp.sum), _reduction("max", jnp.max), _reduction("min", jnp.min),
    _reduction("mean", jnp.mean), _reduction("var", jnp.var),
    _reduction("logsumexp", jax.nn.logsumexp),
    _reduction("prod_tanh", lambda x, axis: jnp.prod(jnp.tanh(x), axis)),
    _reduction("take_argmax", _take_argmax),
    _along("softmax", jax.nn.softmax),
    _along("center", lambda x, axis: x - jnp.mean(x, axis, keepdims=True)),
    _along("cumsum", lambda x, axis: jnp.cumsum(x, axis)),
    _along("cumsum_reverse", lambda x, axis: lax.cumsum(x, axis, reverse=True)),
    _along("cummax_ramp", _cummax_ramp),
    _along("cumlogsumexp", lambda x, axis: lax.cumlogsumexp(x, axis)),
    _along("cumprod_tanh", lambda x, axis: jnp.cumprod(jnp.tanh(x), axis)),
    _along("flip", lambda x, axis: jnp.flip(x, axis)),
    _along("roll", lambda x, axis: jnp.roll(x, 1, axis)),
    _along("sort", lambda x, axis: jnp.sort(x, axis=axis)),
    _along("sort_by_argsort", lambda x, axis: jnp.take_along_axis(x, jnp.argsort(x, axis), axis)),
    Op("top2", 1, lambda p, x: lax.top_k(x, 2)[0],
       lambda s: s[:-1] + (2,) if s and low(s[-1]) >= 2 else None),
    Op("window_sum", 1, lambda p, x: lax.reduce_window(x, 0.0, lax.add, (2,) + (1,) * (x.ndim - 1),
                                                         (1,) * x.ndim, "VALID"),
       lambda s: (s[0] - 1,) + s[1:] if s and low(s[0]) >= 2 else None),
    Op("solve", 1, lambda p, x: jnp.linalg.solve(0.1 * jnp.outer(x, x) + 2.0 * jnp.eye(x.shape[0]), x),
       lambda s: s if len(s) == 1 else None),
    Op("segment_sum", 1, lambda p, x: jax.ops.segment_sum(x, jnp.arange(x.shape[0]) % 3, 3),
       lambda s: (3,) + s[1:] if s else None),
    Op("set_first", 1, lambda p, x: x.at[0].set(x[-1]), lambda s: s if s else None),
    Op("tile", 1, lambda p, x: jnp.tile(x, (2,) + (1,) * (x.ndim - 1)),
       lambda s: (2 * s[0],) + s[1:] if s else None),
    Op("repeat", 1, lambda p, x: jnp.repeat(x, 2, axis=0), lambda s: (2 * s[0],) + s[1:] if s else None),
    Op("first", 1, lambda p, x: x[0], lambda s: s[1:] if s else None),
    Op("last", 1, lambda p, x: x[-1], lambda s: s[1:] if s else None),
    Op("drop_first", 1, lambda p, x: x[1:],
       lambda s: (s[0] - 1,) + s[1:] if s and low(s[0]) >= 2 else None),
    Op("drop_last", 1, lambda p, x: x[:-1],
       lambda s: (s[0] - 1,) + s[1:] if s and low(s[0]) >= 2 else None),
    Op("gather", 1, lambda p, x, index: x[jnp.array(index)],
       lambda s, index: (len(index),) + s[1:], _gather_choices),
    Op("concat", 2, lambda p, a, b: jnp.concatenate([a, b]), _concat_shape),
    Op("stack", 2, lambda p, a, b: jnp.stack([a, b]), lambda s, t: (2,) + s if same(s, t) else None),
    Op("pad", 1, _pad, _pad_shape),
    Op("matmul_W", 1, lambda p, x: x @ p["W"], lambda s: s if s and str(s[-1]) == str(K) else None),
    Op("outer_v", 1, lambda p, x: x[:, None] * p["v"], lambda s: s + (K,) if len(s) == 1 else None),
    Op("contract", 2, _contract, _contract_shape),
    Op("transpose", 1, lambda p, x: x.T, lambda s: s[::-1] if len(s) == 2 else None),
    Op("merge", 1, lambda p, x: x.reshape(-1),
       lambda s: (s[0] * s[1],) if len(s) == 2 and not jc.is_symbolic_dim(s[1]) else None),
    Op("scan_ys", 1, lambda p, x: _rnn(p, x)[1], _leading(lambda s: len(s) == 2 and str(s[1]) == str(K))),
    Op("scan_reverse_ys", 1, lambda p, x: _rnn(p, x, reverse=True)[1],
       _leading(lambda s: len(s) == 2 and str(s[1]) == str(K))),
    Op("scan_final", 1, lambda p, x: _rnn(p, x)[0],
       lambda s: s[1:] if len(s) == 2 and str(s[1]) == str(K) else None),
]
OPS_BY_NAME = {op.name: op for op in OPS}


# --- programs ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Step:
  op: str
  args: tuple[int, ...]      # indices of earlier values
  extra: tuple               # sorted (key, value) pairs


@dataclasses.dataclass(frozen=True)
class Program:
  steps: tuple[Step, ...]
  outputs: tuple[int, ...]

  def __call__(self, x0, x1, W, v):
    params = {"W": W, "v": v}
    values = [x0, x1]
    for step in self.steps:
      op = OPS_BY_NAME[step.op]
      values.append(op.fn(params, *(values[i] for i in step.args), **dict(step.extra)))
    return tuple(values[i] for i in self.outputs)

  def __repr__(self):
    lines = [f"def f(v0, v1, W, v):   # v0: (n,), v1: (n, {K}), W: ({K}, {K}), v: ({K},)"]
    for k, step in enumerate(self.steps, start=2):
      args = ", ".join([f"v{i}" for i in step.args] + [f"{a}={b!r}" for a, b in step.extra])
      lines.append(f"  v{k} = {step.op}({args})")
    lines.append("  return " + ", ".join(f"v{i}" for i in self.outputs))
    return "\n".join(lines)


def _candidates(shapes):
  """Every (op, args, extra) that applies to the values with these shapes."""
  out = []
  indices = range(len(shapes))
  for op in OPS:
    arg_lists = [(i,) for i in indices] if op.arity == 1 else [(i, j) for i in indices for j in indices]
    for args in arg_lists:
      arg_shapes = [shapes[i] for i in args]
      for extra in op.extras(*arg_shapes):
        shape = op.shape(*arg_shapes, **extra)
        if shape is not None and all(low(d) >= 1 for d in shape):
          out.append((op.name, args, tuple(sorted(extra.items())), shape))
  return out


@st.composite
def programs(draw):
  shapes = [(N,), (N, K)]
  steps = []
  for _ in range(draw(st.integers(1, MAX_STEPS))):
    candidates = _candidates(shapes)
    if draw(st.booleans()):  # build on the latest value, for deeper compositions
      candidates = [c for c in candidates if len(shapes) - 1 in c[1]] or candidates
    name, args, extra, shape = draw(st.sampled_from(candidates))
    steps.append(Step(name, args, extra))
    shapes.append(shape)
  last = len(shapes) - 1
  other = draw(st.integers(0, last))
  return Program(tuple(steps), (last,) if other == last else (last, other))


def _args(rng, sizes):
  n = sizes["n"]
  return [rng.standard_normal(n).astype(np.float32),
          rng.standard_normal((n, K)).astype(np.float32),
          (0.5 * rng.standard_normal((K, K))).astype(np.float32),
          rng.standard_normal(K).astype(np.float32)]


@st.composite
def setups(draw):
  program = draw(programs())
  padded = draw(st.integers(N_MIN, P_MAX))
  logical = draw(st.lists(st.integers(N_MIN, padded), min_size=1, max_size=3, unique=True))
  mode = draw(st.sampled_from(MODES))
  seed = draw(st.integers(0, 2 ** 16))
  case = Case("fuzz", program, ["n", "(n, _)", None, None], _args,
              sizes=tuple({"n": s} for s in logical), padded={"n": padded},
              constraints=(f"n >= {N_MIN}",), rtol=1e-4, atol=1e-4)
  return case, mode, seed


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG, database=None,
          suppress_health_check=list(HealthCheck), print_blob=True)
@given(setups())
def test_random_programs_match_unpadded(setup):
  case, mode, seed = setup
  check(case, mode, seed=seed)
