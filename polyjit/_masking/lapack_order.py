"""One LAPACK call at a time: a chain through the masked evaluation.

Why
---
jaxlib 0.10.0 to 0.11.0 run the batch of a CPU LAPACK call (`potrf`, `trsm`,
`getrf`, ...) in parallel: when the batch's work passes about 2e5 FLOP, the
call schedules chunks of it on XLA:CPU's intra-op thread pool and blocks its
own thread until they finish (`ParallelBatchMap` in
jaxlib/cpu/lapack_kernels.cc; open-source builds turn this off after 0.11.0).
XLA:CPU's thunk executor runs independent thunks on that same pool. When as
many independent LAPACK calls as the pool has threads start together, every
worker blocks waiting for chunks that only a free worker could run, and the
program never returns (0% CPU; gdb shows every `tf_XLAEigen` thread in
`BlockingCounter::Wait` under `ParallelBatchMap`). On a 2-core machine two
are enough: the Hessian of a Cholesky under `vmap` has several independent
batched triangular solves. Plain `jax.jit` hangs the same way once the
matrices are large enough (64 x 64, batch 2); polyjit met it first because it
pads small matrices up to their bucket size, which puts the calls over the
threshold.

What
----
Within one masked evaluation, every equation that is or contains a LAPACK
call runs after the previous one has finished: its floating inputs get
`x + (-0.0 * token)`, which is `x` bit for bit (also for -0, inf and NaN),
and its outputs update the token (a float32 scalar that is always 0 or 1, so
`-0.0 * token` is always -0.0). XLA cannot drop these dependencies (it keeps
float `t * -0.0` and `x + y`); `lax.optimization_barrier` does not work here:
XLA:CPU expands it away before the thunk graph is built. So at most one
LAPACK call of the evaluation is running at any time, and a blocked call
always leaves a worker free for its chunks.

Only for jaxlib versions with the parallel path; elsewhere this is a no-op.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Sequence

import numpy as np
from jax import lax
import jax.numpy as jnp

from .. import _jax as jc

#: Whether this jaxlib parallelises LAPACK batches on the intra-op pool.
ACTIVE = jc.LAPACK_BATCHES_BLOCK_THE_POOL

#: Primitives that lower to a LAPACK custom call on CPU.
LAPACK_PRIMITIVES = frozenset({
    "cholesky", "eig", "eigh", "geqp3", "geqrf", "hessenberg",
    "householder_product", "lu", "ormqr", "qr", "schur", "svd",
    "triangular_solve", "tridiagonal", "tridiagonal_solve"})

_calls_cache: "weakref.WeakKeyDictionary[Any, tuple[bool, ...]]" = weakref.WeakKeyDictionary()


def _jaxpr_calls(jaxpr: Any) -> bool:
  return any(lapack_calls(jaxpr))


def lapack_calls(jaxpr: Any) -> tuple[bool, ...]:
  """Per equation of `jaxpr`: whether it is or contains a LAPACK call."""
  try:
    return _calls_cache[jaxpr]
  except KeyError:
    pass
  flags = tuple(
      eqn.primitive.name in LAPACK_PRIMITIVES
      or any(_jaxpr_calls(j) for j in jc.subjaxprs_in_params(eqn.params))
      for eqn in jaxpr.eqns)
  _calls_cache[jaxpr] = flags
  return flags


def _is_float_array(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return (dtype is not None and hasattr(x, "shape")
          and jnp.issubdtype(dtype, jnp.inexact))


def gives_token(x: Any) -> bool:
  """Whether `token_after` can read `x` (an array or an aval)."""
  return (_is_float_array(x) and all(isinstance(d, int) for d in x.shape)
          and math.prod(x.shape) > 0)


def after(token: Any, args: Sequence[Any]) -> list[Any]:
  """`args` made to depend on `token` (values unchanged, bit for bit)."""
  if token is None:
    return list(args)
  neg_zero = token * np.float32(-0.0)  # always -0.0: the token is 0 or 1
  out = []
  for x in args:
    if _is_float_array(x):
      if jnp.issubdtype(x.dtype, jnp.complexfloating):
        z = neg_zero.astype(np.finfo(x.dtype).dtype)
        x = x + lax.complex(z, z)
      else:
        x = x + neg_zero.astype(x.dtype)
    out.append(x)
  return out


def _bit(x: Any) -> Any:
  """0.0 or 1.0 (float32), from the first entry of `x`'s bits."""
  s = lax.reshape(lax.slice(x, (0,) * x.ndim, (1,) * x.ndim), ())
  if jnp.issubdtype(s.dtype, jnp.complexfloating):
    s = lax.real(s)
  bits = lax.bitcast_convert_type(s, np.dtype(f"int{8 * s.dtype.itemsize}"))
  return lax.convert_element_type(lax.bitwise_and(bits, np.ones((), bits.dtype)),
                                  np.float32)


def token_after(token: Any, outs: Sequence[Any]) -> Any:
  """A new token that depends on `token` and on every output in `outs`."""
  new = None if token is None else token * np.float32(0.0)  # token is finite
  for x in outs:
    if gives_token(x):
      bit = _bit(x)
      new = bit if new is None else lax.max(new, bit)
  return token if new is None else new



# --- between masked calls ----------------------------------------------------
#
# Derivatives of a masked function taken outside it (`jax.hessian(pj.mask(f))`)
# are several `polyjit_masked_call` equations in the caller's program, each
# with its own chain. Those that contain LAPACK calls are chained the same way
# when they are lowered (`_jax/calls.py`), where no transformation can see the
# extra dependencies any more: all float inputs of one wait for the token, and
# the token waits for all its outputs, so after XLA inlines the calls every
# LAPACK call of one finishes before any of the next one starts.

_node_flags: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


class _Order:
  after = staticmethod(after)
  token_after = staticmethod(token_after)
  gives_token = staticmethod(gives_token)

  @staticmethod
  def wants(node: Any) -> bool:
    flag = _node_flags.get(node)
    if flag is None:
      inner = node
      while getattr(inner, "inner", None) is not None:  # Batched
        inner = inner.inner
      traced = getattr(inner, "traced", None)
      # (a node that says it calls no LAPACK, native.py's gathers, is left
      # unchained: a chain also keeps XLA from fusing across it)
      flag = (not getattr(inner, "calls_no_lapack", False)
              and (traced is None or _jaxpr_calls(traced.jaxpr)))
      _node_flags[node] = flag
    return flag


if ACTIVE:
  jc.set_lowering_order(_Order)
