"""What packed attention's exactness guard costs: the packed step with and without it.

    python benchmarks/packing_guard_cost.py [--model attention] [--steps 16] [--repeats 12]
                                            [--out FILE]

A packed attention product runs as one dense product per row
(`polyjit/_ragged/packed_block_dot.py`), guarded: where a result is not all
finite (an inf or NaN of one example meets its row neighbours' zero pairs), a
loop recomputes the rows that are not, exactly. The guard is a check and a
branch (`lax.cond`) per token sum: 8 per training step of the attention model
(2 layers: `P @ v` forward; `P.T @ ct`, `ct_s @ k`, `ct_s.T @ q` backward).

Contenders, on the same batches and parameters (`benchmarks/packing.py`'s),
their passes interleaved in a rotated order:

  packed      the packed step as shipped (exact)
  one_guard   the first guard traced kept, the others replaced by their
              check alone (its result kept, not branched on)
  data_branch every guard's check and branch kept, its taken branch
              only doubling the product (NOT exact): whether the branch's
              cost is its data dependence or what the exact path carries
  no_guard    every guard replaced by the dense product alone (NOT exact
              where a value is inf or NaN: a diagnostic of the guard's cost,
              not a mode polyjit offers)
  hand_branches  the hand-packed step with as many branches as the packed
              one has guards, each on one of its largest parameters (a
              `lax.cond` on that parameter's finiteness, returning it): what
              the branches alone cost a program without polyjit
  hand        the hand-packed step with segment ids (the Grain/MaxText way)

Printed and written (`--out`): per contender its per-pass median ratio to
`hand`, wall and process CPU. The guard's private function is replaced while
each variant is traced; nothing else differs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polyjit as pj  # noqa: E402
from polyjit._ragged import packed_block_dot  # noqa: E402
import packing as bench  # noqa: E402

SHIPPED = packed_block_dot._guarded


def _check_only(fast: Any, exact_row: Any) -> Any:
  """The guard's check, its result kept alive but not branched on."""
  if not jnp.issubdtype(fast.dtype, jnp.inexact):
    return fast
  return lax.optimization_barrier((fast, jnp.all(jnp.isfinite(fast))))[0]


def _first_kept(kept: int) -> Any:
  """The first `kept` guards traced as shipped, the others' check alone."""
  seen = []
  def guard(fast: Any, exact_row: Any) -> Any:
    seen.append(1)
    return SHIPPED(fast, exact_row) if len(seen) <= kept else _check_only(fast, exact_row)
  return guard


def _data_branch(fast: Any, exact_row: Any) -> Any:
  """The guard's check and branch with a branch that holds no exact path."""
  if not jnp.issubdtype(fast.dtype, jnp.inexact):
    return fast
  return lax.cond(jnp.all(jnp.isfinite(fast)), lambda: fast, lambda: fast * 2)


VARIANTS = {"packed": lambda: SHIPPED, "one_guard": lambda: _first_kept(1),
            "data_branch": lambda: _data_branch,
            "no_guard": lambda: (lambda fast, exact_row: fast)}


#: Guards per training step of the attention model (the module docstring).
BRANCHES = 8


def with_branches(loss: Any, count: int) -> Any:
  """`loss` with `count` of its largest parameters passed through a branch."""
  def branched(params: Any, *inputs: Any) -> Any:
    leaves, tree = jax.tree.flatten(params)
    for i in sorted(range(len(leaves)), key=lambda i: -leaves[i].size)[:count]:
      leaf = leaves[i]
      leaves[i] = lax.cond(jnp.all(jnp.isfinite(leaf)), lambda: leaf, lambda: leaf * 2)
    return loss(jax.tree.unflatten(tree, leaves), *inputs)
  return branched


def main(argv: list[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="attention", choices=("attention",))
  ap.add_argument("--steps", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=12)
  ap.add_argument("--out")
  args = ap.parse_args(argv)
  init, one, hand = bench.model(args.model)
  params = init(jax.random.PRNGKey(0))
  data, labels = bench.example_data(bench.sst2_batches(args.steps, 64))
  packed = [pj.Ragged.from_list(d, packing=pj.Packing(row_length=bench.ROW)) for d in data]
  steps = {}
  try:
    for name, guard in VARIANTS.items():
      packed_block_dot._guarded = guard()
      step, inputs = bench.training_step(bench.vmapped_loss(one)), list(zip(packed, labels))
      bench.timed(step, params, inputs)   # traced (with this guard), compiled, warm
      steps[name] = (step, inputs)
  finally:
    packed_block_dot._guarded = SHIPPED
  hand_inputs = bench.hand_inputs(packed, labels)
  steps["hand_branches"] = (bench.training_step(with_branches(hand, BRANCHES)), hand_inputs)
  steps["hand"] = (bench.training_step(hand), hand_inputs)
  for name in ("hand_branches", "hand"):
    bench.timed(steps[name][0], params, hand_inputs)   # compiled, warm
  names = list(steps)
  times: dict[str, list] = {k: [] for k in names}
  for rep in range(args.repeats):
    for k in names[rep % len(names):] + names[:rep % len(names)]:
      times[k].append(bench.timed(steps[k][0], params, steps[k][1]))
  out = {"model": args.model, "steps": args.steps, "repeats": args.repeats,
         "load_average": os.getloadavg()[0]}
  for k in names[:-1]:
    for i, kind in enumerate(("wall", "cpu")):
      out[f"{k}_over_hand_{kind}"] = statistics.median(
          a[i] / b[i] for a, b in zip(times[k], times["hand"], strict=True))
    print(f"{k:13s} / hand: wall {out[f'{k}_over_hand_wall']:.3f}, "
          f"CPU {out[f'{k}_over_hand_cpu']:.3f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
