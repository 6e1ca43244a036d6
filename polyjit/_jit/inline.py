"""`pj.jit`'s small CPU programs run on the calling thread, not handed to a thread pool.

With JAX's asynchronous CPU dispatch on (its default), XLA:CPU hands every
call of a program of more than 1,000 flops to its thread pool; the caller
waits for that thread when it reads the result. For the programs of a long
run of small calls (a likelihood in an optimizer or a sampler, tens of
microseconds each) that hand-off cost as much as the program itself (issue
35: 44 us a call handed off against 14 us on the calling thread). The switch
(`jax_cpu_enable_async_dispatch`) is process-wide and the user's; so polyjit
runs a copy of each of its small programs on a synchronous CPU client of its
own (`_jax/inline_cpu.py`: the same executable, serialized and loaded there,
so the same results bit for bit) and moves arrays between the clients on
the host: a program's outputs come back on the default device with their
dtype and weak type, uncommitted, as the program on the default client gives them.

Which programs: single-device ones (no shardings given, no mesh), without
donated arguments (donation frees the caller's buffer; a copy on another
client cannot), without PRNG-key (extended-dtype) arguments or outputs, whose
XLA cost analysis is at most `INLINE_FLOPS` flops and `INLINE_BYTES` bytes
(about a millisecond: beyond it the hand-off is a small part of a call, and
asynchronous dispatch lets Python run ahead of the computation). Everything
else, and every backend but CPU, runs as JAX runs it.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .. import _jax as jc
from .kept import KeptWhileAlive

INLINE_FLOPS = 1e7   # XLA's cost analysis of a program run inline, at most
INLINE_BYTES = 1e7   # bytes it accesses, at most
#: Arguments whose copy on the synchronous client is kept (`crossed`), and
#: the largest one kept.
CROSSED = 32
CROSSED_BYTES = 1 << 20

# a default-client array -> its copy on polyjit's client
_crossed = KeptWhileAlive(CROSSED)


def crossed(a: Any) -> Any:
  """`a` (a default-client `jax.Array`) on polyjit's synchronous client. An
  argument passed again unchanged (a model's data, a fixed parameter: arrays
  are immutable) crosses once: its copy is kept while it lives, for the last
  `CROSSED` arguments of at most `CROSSED_BYTES` (a crossing costs about as
  much as the program of a small call)."""
  kept = _crossed.get(a)
  if kept is not None and not a.is_deleted():
    return kept
  moved = jc.to_inline(a)
  if a.nbytes <= CROSSED_BYTES:
    _crossed.put(a, moved)
  return moved


class InlineProgram:
  """A compiled program that runs on polyjit's synchronous CPU client: its
  `jax.Array` arguments cross to that client, its outputs come back to the
  default client. Everything else (`out_info`, `as_text`, ...) is the program's."""
  __slots__ = ("program", "size_sharding", "single")

  def __init__(self, program: Any) -> None:
    self.program = program
    # the device of the program's size arguments (`Plan.logical`)
    self.size_sharding = jc.inline_sharding()
    self.single = jax.tree_util.treedef_is_leaf(program.out_tree)

  def __call__(self, *args: Any) -> Any:
    # (the crossings between the clients are polyjit's own transfers: explicit)
    return jc.explicitly(self._call, *args)

  def _call(self, *args: Any) -> Any:
    moved: list[Any] | None = None
    for i, a in enumerate(args):  # (the size tuple, last, is on this client already)
      if type(a) is jc.ARRAY_TYPE:
        if moved is None:
          moved = list(args)
        moved[i] = crossed(a)
    outs = self.program(*(args if moved is None else moved))
    # Uncommitted, as the program on the default client gives them (it was
    # lowered for uncommitted arguments).
    if self.single:
      return jc.to_default(outs) if type(outs) is jc.ARRAY_TYPE else outs
    leaves, tree = jax.tree.flatten(outs)
    # jaxlib's PyTreeDef is not visible to mypy (a stub gap): its methods are unknown.
    return tree.unflatten(  # type: ignore[attr-defined]
        [jc.to_default(o) if type(o) is jc.ARRAY_TYPE else o for o in leaves])

  def __getattr__(self, name: str) -> Any:
    return getattr(self.program, name)


def inline(program: Any, dtypes: tuple[Any, ...], *, placed: bool, donated: bool,
           data: bytes | None, fresh: bool) -> Any:
  """`program` as an `InlineProgram` where it qualifies (see the module
  docstring), else `program` itself. `placed`: shardings were given or the
  arguments are on a mesh; `donated`: some argument is donated; `data`: its
  bytes from polyjit's disk cache, if any; `fresh`: compiled in this process
  (not loaded from a cache: only then can it be serialized again)."""
  if placed or donated or not all(isinstance(d, np.dtype) for d in dtypes):
    return program
  device = jc.inline_device()
  if device is None:
    return program
  cost = jc.program_cost(program)
  if cost is None or cost[0] > INLINE_FLOPS or cost[1] > INLINE_BYTES:
    return program
  try:
    outs = jax.tree.leaves(program.out_info)
  except Exception:  # noqa: BLE001  (no output avals: run it as JAX does)
    return program
  if not all(isinstance(o.dtype, np.dtype) for o in outs):
    return program
  copy = jc.inline_copy(program, device, data, fresh)
  return program if copy is None else InlineProgram(copy)


def size_sharding(program: Any) -> Any:
  """Where a program's size arguments are put once (`Plan.logical`)."""
  return program.size_sharding if type(program) is InlineProgram else jc.default_sharding()
