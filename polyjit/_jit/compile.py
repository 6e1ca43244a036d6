"""`pj.jit`'s programs: compiled once per key, through the function's executable cache.

A `Compiler` belongs to one `pj.jit` function. Everything that compiles goes
through it: a call's new bucket, the exact-shape program of a fallback, a
bucket a cost-aware account paid for, `precompile` and the ahead-of-time
`compile()`. It lowers the program body for the structure's placement (one
device, or per-leaf shardings on a mesh: `_sharding.placement`), records the
compile in `pj.stats` with its cause, and tells the structure's cost-aware
rental how long the compile took. With `background_compile`, a new bucket can
run on a larger one already compiled while its own compiles in a thread
(`program`).
"""

from __future__ import annotations

import functools
import math
import time
from concurrent.futures import Future
from typing import Any, Callable

from .. import _jax as jc
from .._caching import disk as _disk_cache
from .._caching.compiles import count_compiles
from .._caching.executables import ExecutableCache
from .._masking.mask import Masked
from .._masking.spec import Binding
from .._masking.variants import Variant
from .._sharding import placement as _sharding
from . import inline as _inline
from .args import ArgLayout
from .plans import ProgramKey, Shapes, Structure, borrow, masked_body, padded_shapes
from .stats import Cause, Stats


#: Seconds spent in `Compiler.compile` by every function in this process (a
#: hot shape's account leaves calls that compiled out: `hot_shapes.py`).
_seconds_compiling = [0.0]


def seconds_compiling() -> float:
  return _seconds_compiling[0]


class Compiler:
  """Compiles (and caches) the programs of one `pj.jit` function."""
  SECONDS_KEPT = 4096

  def __init__(self, name: str, label: str, args: ArgLayout, stats: Stats, cache: ExecutableCache,
               *, out_shardings: Any = None, background: bool = False) -> None:
    self.name = name            # the programs' name for JAX (and in their on-disk entries' names)
    self.label = label          # the function, in messages: "pj.jit(f)"
    self.cache = cache
    self.background = background
    self._args = args
    self._stats = stats
    self._out_shardings = out_shardings
    # program -> its compile's wall seconds, or for a program loaded from a
    # cache the cost model's estimate of one (the price of a hot shape's own
    # program: `hot_shapes.py`)
    # (keyed by the program's id: hashing its ProgramKey would hash the trace
    # context on the call path; a reused id after an eviction misprices once)
    self.seconds: dict[int, float] = {}

  def donated(self, struct: Structure) -> tuple[int, ...]:
    """The leaves of `struct` whose buffers the program may reuse."""
    return self._args.donated_leaves(struct.treedef, struct.static_key)

  def cached(self, key: ProgramKey, body: Callable[..., Any], struct: Structure, cause: Cause,
             n_dims: int = 0) -> Any:
    """The program `key` from the cache, compiled here the first time."""
    return self.cache.get(key, functools.partial(self.compile, key, body, struct, cause, n_dims))

  def masked(self, struct: Structure, masked: Masked, binding: Binding, variant: Variant,
             env: dict[str, int], cause: Cause) -> tuple[ProgramKey, Callable[[], Any]]:
    """(key, build) of the program of `variant` at the padded sizes `env`."""
    key = ProgramKey.masked(struct, variant, padded_shapes(binding, env), env)
    body = masked_body(struct.treedef, masked, variant, env)
    return key, functools.partial(self.compile, key, body, struct, cause, len(binding.dim_names))

  def program(self, key: ProgramKey, build: Callable[[], Any], shapes: Shapes
              ) -> tuple[ProgramKey, Any, Future[Any] | None]:
    """(key, program, provisional): the program for `key`, compiled here if
    needed; or, with `background_compile`, a larger compiled bucket's program
    while `key` compiles in a thread (`provisional` is that future)."""
    if self.background and _sharding.single_process():  # timing-free across processes
      fut = self.cache.peek(key)
      if fut is None or not fut.done():
        borrowed = borrow(self.cache.done(), key, shapes)
        if borrowed is not None:
          return (*borrowed, self.cache.submit(key, build))
    return key, self.cache.get(key, build), None

  def compile(self, key: ProgramKey, body: Callable[..., Any], struct: Structure,
              cause: Cause, n_dims: int = 0) -> Any:
    """Compiles `body` at `key`'s padded shapes (plus `n_dims` logical sizes)
    for the structure's placement, and records it."""
    donate = self.donated(struct)
    t0 = time.perf_counter()
    if struct.on_mesh:  # (outside count_compiles: the check runs a collective)
      _sharding.agree_on_program(key.padded_shapes, key.bucket, self.label)
    kept: list[bytes] = []   # the program's bytes, for its inline copy
    with count_compiles(this_thread_only=True) as log:
      lowered = _sharding.lower(body, self.name, key.padded_shapes, struct.avals, n_dims,
                                donate, struct.shardings, self._out_shardings)
      # polyjit's own on-disk programs: one device only (a mesh program compiles
      # in each process)
      program = _disk_cache.load_or_compile(
          lowered, jc.jit_program_name(self.name),
          keep=struct.shardings is None and self._out_shardings is None, kept=kept)
    # small single-device programs run on the calling thread (`inline.py`)
    program = _inline.inline(program, struct.dtypes,
                             placed=struct.on_mesh or self._out_shardings is not None,
                             donated=bool(donate), data=kept[0] if kept else None,
                             fresh=not log.cache_loads)
    seconds = time.perf_counter() - t0
    _seconds_compiling[0] += seconds
    if len(self.seconds) >= self.SECONDS_KEPT:
      self.seconds.clear()
    if not log.cache_loads:
      self.seconds[id(program)] = seconds
    elif struct.rental is not None and math.isfinite(struct.rental.compile_estimate):
      self.seconds[id(program)] = struct.rental.compile_estimate  # (a load: the model's compile)
    self._stats.record_compile(key, cause, log, program_name=jc.jit_program_name(self.name),
                               wall_seconds=seconds)
    if struct.rental is not None and not key.exact:
      struct.rental.compiled(key.bucket, dict(key.bucket), seconds)
    return program
