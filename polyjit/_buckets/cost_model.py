"""A deterministic cost model of a traced function: run time per bucket, compile time.

The default bucket policy (`CostAware`, `_buckets/cost_aware.py`) decides when a tighter
bucket pays for its compile. Measured times would make that decision, and so
which program serves a call, depend on the machine's load: two runs of the
same script could run a size in different buckets, whose float results can
differ in the last bit. The decision is made from this model instead, which
depends only on the function's jaxpr and the padded sizes:

* run time of a bucket: what a call costs on the host, then on the device.
  The host: a fixed dispatch cost per call and, per byte of the padded
  arguments, the host padding (a zeroed buffer, the data copied in) and the
  transfer (`HOST`). The device: the function's jaxpr (traced once with
  symbolic sizes) is walked with the bucket's sizes substituted:
  floating-point work (2 per multiply-add of a `dot_general`/convolution, one
  per output element of anything else, a reduction's input elements) and
  memory traffic (each equation's output written once, a contraction's
  operands read), a scan's body counted `length` times and a `cond` as its
  costliest branch, turned into seconds with per-platform throughputs and a
  fixed cost per loop iteration (`THROUGHPUT`), plus XLA:CPU's thread-pool
  hand-off for programs above its inline threshold (`HANDOFF`);
* compile time: a fixed cost plus a cost per equation (sub-jaxprs included,
  a scan body once) and per loop, per platform (`COMPILE`).

What the policy acts on is the *difference* between two buckets' run times
(the waste of running in the larger one) against the compile time, so the
per-element terms and the compile cost are what must be right; the fixed
per-call terms cancel. The CPU constants were fitted on a 2-core x86 CPU
with jaxlib 0.10.2 by `benchmarks/cost_model_check.py` (the seed likelihood,
a small MLP, a scan RNN; never-seen sizes in a bucket, blocking on the
result; two runs): there the modelled waste per padded row is 1.1x-1.7x
the measured one and the compile estimate 1.0x-1.15x (the earlier
constants were 1.3x-3.9x and 1.7x-2.6x too high, so tighter buckets were
bought late). The GPU and TPU figures are nominal, not fitted. The
ski-rental rule tolerates errors (an error in the ratio only moves the
point where a bucket is bought). Costs are cached per (jaxpr, sizes): the
same history gives the same choices on every run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .._masking import dims as _dims
from .. import _jax as jc

#: platform -> (floating-point operations per second, bytes per second,
#: seconds per loop iteration). Bytes are counted unfused (every equation's
#: output written), so the bandwidth is an effective one, above the memory's.
THROUGHPUT: dict[str, tuple[float, float, float]] = {
    "cpu": (2.0e11, 2.5e10, 3.5e-8),
    "gpu": (1.0e14, 5.0e12, 1e-5),
    "tpu": (1.0e14, 5.0e12, 2e-6),
}
#: platform -> (flops, seconds): XLA:CPU runs a program whose cost analysis
#: counts fewer flops than this on the calling thread, a larger one through its
#: thread pool, which costs a hand-off per call (measured: 5 to 15 us).
HANDOFF: dict[str, tuple[float, float]] = {"cpu": (1000.0, 1e-5)}
#: platform -> (seconds of dispatch per call, seconds per padded argument
#: byte: host padding plus transfer; on a CPU the transfer is a copy).
HOST: dict[str, tuple[float, float]] = {
    "cpu": (1.5e-5, 1.0e-10),
    "gpu": (1.5e-5, 1.0e-10),
    "tpu": (1.5e-5, 1.0e-10),
}
#: platform -> (seconds per compile, per jaxpr equation, per loop).
COMPILE: dict[str, tuple[float, float, float]] = {
    "cpu": (0.035, 0.0005, 0.03),
    "gpu": (0.15, 0.004, 0.1),
    "tpu": (0.3, 0.004, 0.1),
}
CONTRACTIONS = ("dot_general", "conv_general_dilated", "ragged_dot_general", "ragged_dot")
REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
              "reduce_or", "reduce_xor", "argmax", "argmin", "reduce_precision")


@dataclasses.dataclass(frozen=True)
class Work:
  """Floating-point operations and bytes moved by one run."""
  flops: float = 0.0
  bytes: float = 0.0
  iterations: float = 0.0   # loop iterations run (each has a fixed cost)

  def __add__(self, other: Work) -> Work:
    return Work(self.flops + other.flops, self.bytes + other.bytes,
                self.iterations + other.iterations)

  def times(self, k: float) -> Work:
    return Work(self.flops * k, self.bytes * k, self.iterations * k)

  def seconds(self, platform: str) -> float:
    flops, bandwidth, iteration = THROUGHPUT.get(platform, THROUGHPUT["cpu"])
    inline, handoff = HANDOFF.get(platform, (math.inf, 0.0))
    return (self.flops / flops + self.bytes / bandwidth + self.iterations * iteration
            + (handoff if self.flops >= inline else 0.0))


class CostModel:
  """Run-time and compile-time estimates of one traced function (`jaxpr`)."""

  def __init__(self, jaxpr: jc.Jaxpr, platform: str) -> None:
    self.jaxpr = jaxpr
    self.platform = platform
    self._seconds: dict[tuple[tuple[str, int], ...], float] = {}
    self.equations, self.loops = count_equations(jaxpr)

  def run_seconds(self, env: dict[str, int]) -> float:
    """Estimated seconds per call with the dimension variables at `env`."""
    key = tuple(sorted(env.items()))
    seconds = self._seconds.get(key)
    if seconds is None:
      dispatch, per_byte = HOST.get(self.platform, HOST["cpu"])
      host = dispatch + per_byte * sum(_nbytes(v, env) for v in self.jaxpr.invars)
      seconds = self._seconds[key] = host + work(self.jaxpr, env).seconds(self.platform)
    return seconds

  def compile_seconds(self) -> float:
    base, per_equation, per_loop = COMPILE.get(self.platform, COMPILE["cpu"])
    return base + per_equation * self.equations + per_loop * self.loops


def count_equations(jaxpr: jc.Jaxpr) -> tuple[int, int]:
  """(equations, loops) in `jaxpr`, sub-jaxprs included (each body once)."""
  equations = loops = 0
  for eqn in jaxpr.eqns:
    equations += 1
    loops += eqn.primitive.name in ("scan", "while")
    for sub in jc.subjaxprs_in_params(eqn.params):
      e, l = count_equations(sub)
      equations, loops = equations + e, loops + l
  return equations, loops


def work(jaxpr: jc.Jaxpr, env: dict[str, int]) -> Work:
  """The work of one run of `jaxpr` with its dimension variables at `env`."""
  total = Work()
  for eqn in jaxpr.eqns:
    total = total + _equation_work(eqn, env)
  return total


def _equation_work(eqn: Any, env: dict[str, int]) -> Work:
  name = eqn.primitive.name
  subs = list(jc.subjaxprs_in_params(eqn.params))
  if subs:
    inner = [work(sub, env) for sub in subs]
    if name == "scan":
      length = _size(eqn.params.get("length", 1), env)
      return (sum(inner, Work()) + Work(iterations=1.0)).times(length)
    if name == "cond":  # one branch runs: the costliest
      return max(inner, key=lambda w: w.flops + w.bytes)
    return sum(inner, Work())  # a call, a custom rule, a loop run once
  out_elems = sum(_elements(v, env) for v in eqn.outvars)
  out_bytes = sum(_nbytes(v, env) for v in eqn.outvars)
  if name in CONTRACTIONS and len(eqn.invars) >= 2:
    lhs, rhs = eqn.invars[0], eqn.invars[1]
    in_bytes = _nbytes(lhs, env) + _nbytes(rhs, env)
    # multiply-adds per output element: the operands' elements the output does not have
    per_output = math.sqrt(max(_elements(lhs, env) * _elements(rhs, env), 1)
                           / max(out_elems, 1)) if name != "dot_general" else \
        _contracted(eqn, env)
    return Work(2.0 * out_elems * per_output, out_bytes + in_bytes)
  if name in REDUCTIONS:
    return Work(float(sum(_elements(v, env) for v in eqn.invars)), out_bytes
                + sum(_nbytes(v, env) for v in eqn.invars))
  return Work(float(out_elems), out_bytes)


def _contracted(eqn: Any, env: dict[str, int]) -> float:
  (lhs_contract, _), _ = eqn.params["dimension_numbers"]
  shape = _shape(eqn.invars[0], env)
  return float(math.prod(shape[i] for i in lhs_contract)) if shape else 1.0


def _size(d: Any, env: dict[str, int]) -> int:
  """`d` at `env`; a variable `env` lacks (a data-dependent size, whose value
  is known only when the program runs) counts as the largest size in `env`."""
  missing = _dims.dim_vars(d) - env.keys()
  if missing:
    env = {**env, **dict.fromkeys(missing, max(env.values(), default=1))}
  return max(int(_dims.evaluate_dim(d, env)), 0)


def _shape(v: Any, env: dict[str, int]) -> tuple[int, ...]:
  aval = getattr(v, "aval", None)
  shape = getattr(aval, "shape", None)
  if shape is None:
    return ()
  return tuple(_size(d, env) for d in shape)


def _elements(v: Any, env: dict[str, int]) -> int:
  return math.prod(_shape(v, env))


def _nbytes(v: Any, env: dict[str, int]) -> float:
  dtype = getattr(getattr(v, "aval", None), "dtype", None)
  try:
    itemsize = np.dtype(dtype).itemsize if dtype is not None else 0
  except TypeError:  # extended dtypes (PRNG keys): count a word
    itemsize = 4
  return float(_elements(v, env) * itemsize)
