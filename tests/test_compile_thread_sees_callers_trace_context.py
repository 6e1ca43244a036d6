"""A program `pj.jit` compiles in a thread sees the trace context of the call that asked for it.

`pj.jit` keys its programs by `jc.trace_context()` (what `jax.jit` keys its
traces on), and lowers some of them in a thread pool (`precompile`,
`background_compile=True`, a cost-aware bucket bought while calls go on).
In that thread the trace context must be the submitter's, or a program is
lowered under another context than its key's. JAX keeps some contexts
outside its registered options (`jax.set_mesh`'s abstract mesh and devices,
`with mesh:`): those were not carried over, and `precompile` under
`jax.set_mesh` of arguments sharded on two devices raised JAX's "Please
enter your `jit` into a mesh context" where the same call on the calling
thread (and `jax.jit`) ran (`test_precompile_examples.py` runs that on two
devices).
"""

from __future__ import annotations

import jax

from polyjit import _jax as jc
from polyjit._caching.executables import ExecutableCache


def test_the_compile_thread_sees_the_callers_trace_context():
  mesh = jax.make_mesh((1,), ("x",))
  cache = ExecutableCache()
  with jax.set_mesh(mesh), jax.numpy_rank_promotion("raise"):
    here = jc.trace_context()
    there = cache.submit("key", jc.trace_context).result()
  assert there == here
  assert cache.submit("other", jc.trace_context).result() == jc.trace_context()
