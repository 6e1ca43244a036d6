"""`pj.stats` and `pj.explain`: what a `pj.jit` function compiled, and why.

Every program a `pj.jit` function builds is recorded (`_jit/stats.py`) with
its cause (the first call, an axis that changed and became dynamic, a new
bucket, a fallback to exact shapes, an empty dynamic axis, a precompile) and
with the compile events `jax.monitoring` reported for it, so the counts here
are measured. `explain` turns that record into text and ends with advice on
bucket policies for the sizes each dynamic axis actually took.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from .._jit.function import JitFunction
from .._jit.stats import Cause, SizeRecord
from .._buckets.cost_aware import CostAware
from ._advice import advise, distinct


@dataclasses.dataclass(frozen=True)
class JitStats:
  """A snapshot of a `pj.jit` function's activity.

  `buckets` maps a bucket, as a tuple of (dimension, padded size) pairs, to
  the number of calls it served; `padding_waste` is the mean fraction of the
  arguments' elements that were padding; `compiles` counts the backend
  compiles `jax.monitoring` reported for this function's programs.
  """
  calls: int
  compiles: int
  compile_seconds: float
  buckets: dict[tuple[tuple[str, int], ...], int]
  padding_waste: float
  fallback_calls: int
  cache_loads: int


def _check(f: object) -> JitFunction:
  f = getattr(f, "jit_function", f)  # pj.filter_jit's functions wrap a pj.jit one
  if not isinstance(f, JitFunction):
    raise TypeError(f"expected a function made by pj.jit, got {type(f).__name__}; for "
                    "plain jax.jit functions use `with pj.watch() as report:`.")
  return f


def stats(f: JitFunction) -> JitStats:
  """The activity of a `pj.jit` function so far."""
  s = _check(f).stats
  return JitStats(calls=s.calls, compiles=s.compiles, compile_seconds=s.compile_seconds,
                  buckets=dict(s.bucket_hits), padding_waste=s.padding_waste,
                  fallback_calls=s.fallback_calls, cache_loads=s.cache_loads)


def explain(f: JitFunction) -> str:
  """Each compile of a `pj.jit` function and its cause, then advice."""
  f = _check(f)
  s = f.stats
  name = getattr(f.fun, "__name__", "fun")
  exact = sum(1 for e in s.compile_events if e.exact)
  buckets = len(s.compile_events) - exact
  split = f" ({exact} exact-shape program{'s' * (exact != 1)}, {buckets} bucket{'s' * (buckets != 1)})" if exact else ""
  head = (f"pj.jit({name}): {_count(s.calls, 'call')}, {_count(s.compiles, 'compile')}{split}, "
          f"{s.compile_seconds:.2f} s compiling")
  if sum(s.bucket_hits.values()):
    head += (f"; padding {s.padding_waste:.0%} of the argument elements of a bucketed "
             "call, on average")
  if s.fallback_calls:
    head += (f"; {_count(s.fallback_calls, 'call')} ran at exact shapes because the function "
             "could not be masked for them (see the fallback compiles below)")
  lines = [head]
  if s.cache_loads:
    lines[0] += f"; {s.cache_loads} program(s) loaded from the persistent cache"
  lines.append("compiles:")
  for i, event in enumerate(s.compile_events, 1):
    lines.append(f"  {i}. {_describe(event.cause)} ({event.seconds:.2f} s)")
  advice = _advice(f)
  if advice:
    lines.append("advice:")
    lines.extend(f"  {a}" for a in advice)
  return "\n".join(lines)


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}{'s' * (n != 1)}"


def axis_sizes(f: JitFunction) -> dict[tuple[str, int], SizeRecord]:
  """Every size each argument axis took. A dimension's record has the sizes of
  its bucketed calls; the sizes of calls made at exact shapes before the axis
  became dynamic (the first call's) are known from the compile causes. With
  both, `explain` counts the sizes `pj.watch` counts for the same calls
  (past `2 * SizeRecord.LIMIT` distinct sizes, an estimate from a sample)."""
  out: dict[tuple[str, int], SizeRecord] = {}
  for event in f.stats.compile_events:
    for name, axis, old, new in event.cause.changed:
      out.setdefault((name, axis), SizeRecord()).update((old, new))
  for entry in f.stats.dims.values():
    if entry.where:
      out.setdefault(entry.where, SizeRecord()).update(entry.sizes)
  return out


def _axis(name: str, axis: int) -> str:
  return f"argument `{name}` axis {axis}"


def _changes(cause: Cause) -> str:
  return "; ".join(f"{_axis(n, a)} changed {old} -> {new}" for n, a, old, new in cause.changed)


def _bucket(cause: Cause) -> str:
  return ", ".join(f"{d}={p}" for d, p in sorted((cause.bucket or {}).items()))


def _describe(cause: Cause) -> str:
  kind = cause.kind
  if kind == "first call":
    return "first call, compiled for its exact shapes"
  if kind == "precompile":
    return f"precompiled bucket {_bucket(cause)}"
  if kind == "fallback":
    error = (cause.error or "").strip().splitlines()
    return (f"{_changes(cause) or 'new shapes'}; exact shapes because the function "
            f"cannot run with dynamic sizes ({error[0] if error else 'unknown reason'})")
  if kind == "zero size":
    return (f"{_changes(cause) or 'new shapes'}; exact shapes because a dynamic axis is "
            "empty (jax.jit's own program for empty arrays)")
  if kind == "failing side":
    error = (cause.error or "").strip().splitlines()
    return (f"{_changes(cause) or 'new shapes'}; exact shapes because the function fails "
            f"traced at these sizes ({error[0] if error else 'unknown reason'}), while "
            "other sizes run masked")
  if kind == "exact":
    return f"{_changes(cause)}; exact shapes"
  if kind == "hot shape":
    return (f"shapes {list(cause.shapes or ())} called so often that their bucket's overhead "
            f"paid for their own program ({cause.reason}); jax.jit runs them from now on")
  sizes = ", ".join(f"{d}={n}" for d, n in sorted((cause.sizes or {}).items()))
  became = ""
  if cause.became_dynamic:
    became = "; now dynamic: " + ", ".join(cause.became_dynamic)
  variant = f"; the side where {cause.variant}" if cause.variant else ""
  if cause.shapes is None:  # bought by a cost-aware policy's account
    # (measured estimates compile in the background: their reason is "waste ...")
    where = " in the background" if (cause.reason or "").startswith("waste") else ""
    return f"bucket {_bucket(cause)}{where}{variant} ({cause.reason})"
  reason = f" ({cause.reason})" if cause.reason else ""
  return (f"{_changes(cause) or 'new sizes'}{became}; bucket {_bucket(cause)} for "
          f"{sizes}{variant}{reason}")


def _cost_aware_note(f: JitFunction, where: str, dim: str, sizes: Collection[int]) -> str:
  events = [e for e in f.stats.compile_events if not e.exact and dim in dict(e.key.bucket)]
  buckets = sorted({dict(e.key.bucket)[dim] for e in events})
  note = (f"{where} took {distinct(sizes)} distinct sizes in [{min(sizes)}, {max(sizes)}]: "
          f"the cost-aware buckets compiled {len(events)} program(s) for it in "
          f"{len(buckets)} bucket(s) ({', '.join(map(str, buckets)) or 'none'}); a tighter "
          "bucket is compiled once the run time its padding wastes exceeds a compile.")
  if len(events) > 2 * len(buckets):  # one program per side of a comparison, per size
    note += (" More programs than buckets: the function branches on this size in a way "
             "that gives sizes sides of their own (`n in range(...)`, a hash, `==` per "
             "size); each side is compiled per bucket.")
  return note


def _advice(f: JitFunction) -> list[str]:
  out = []
  seen = axis_sizes(f)
  for dim, entry in sorted(f.stats.dims.items()):
    sizes = seen[entry.where] if entry.where else entry.sizes
    if len(sizes) < 3:
      continue
    where = _axis(*entry.where) if entry.where else f"dimension `{dim}`"
    policy = f.bucket_policy(dim)
    if isinstance(policy, CostAware):
      out.append(_cost_aware_note(f, where, dim, sizes))
    else:
      out.append(advise(where, sizes, policy))
  if f.stats.fallback_calls:
    out.append("calls ran at exact shapes after a fallback: give polymorphic_shapes (and "
               "constraints for size comparisons) so that they can be masked.")
  return out
