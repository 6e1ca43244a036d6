"""`jnp.diag_indices` at a dynamic size.

JAX converts `n` with `operator.index` before it builds `lax.iota(dtype, n)`
for each of the `ndim` axes, so `x.at[jnp.diag_indices(x.shape[0])]` (how
tinygp adds a diagonal), `jnp.diag_indices_from(x)` and `jnp.fill_diagonal`
(which call it as a module global) were refused at a dynamic size, although
`lax.iota` takes a symbolic size. The replacement is JAX's own statement,
`(lax.iota(dtype, n),) * ndim`, with `n` kept symbolic: the same indices at
every size, in JAX's default integer dtype (what JAX gives wherever an int32
holds `n`). Padding positions index the padding of the array (i >= n), and
polyjit's gather and scatter rules bound indices by the logical size.

`jnp.tril_indices`/`triu_indices` (and their `_from` forms) select the
triangle with `jnp.nonzero(..., size=_triu_size(n, m, k))`. JAX's
`_triu_size` branches in Python on `k >= m`: at k = 1, m = n that is a size
comparison (`1 >= n`) whose two sides give the sizes 0 and
`floordiv(n^2 - n, 2)`, equal at every size (0 where n = 1) but not the same
expression, so with traced sizes the outputs seemed to depend on a size
comparison. `triu_size` below is the same count without the branch: with
r = max(m - k, 0) and mk = min(n, r) (JAX's own `min(n, m - k)` where
k < m, and 0 where k >= m), `mk * (mk + 1) // 2 + mk * (r - mk)`; for k < 0,
`n * m - triu_size(m, n, 1 - k)` as in JAX.

`jnp.eye`, `jnp.identity` and `jnp.tri` trace at symbolic sizes as they are.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import _jax as jc


def diag_indices(original: Callable[..., Any], n: Any, ndim: int = 2) -> Any:
  if not (jc.is_symbolic_dim(n) and not isinstance(n, jc.Tracer)):
    return original(n, ndim)
  ndim = operator.index(ndim)
  if ndim < 0:
    raise ValueError(f"ndim argument to diag_indices must be nonnegative, got {ndim}")
  size: Any = n   # (a symbolic size: lax.iota takes one, its annotation says int)
  return (lax.iota(jax.dtypes.canonicalize_dtype(jnp.int_), size),) * ndim


def triu_size(original: Callable[..., Any], n: Any, m: Any, k: Any) -> Any:
  """The number of entries of `triu(ones((n, m)), k)`, without a branch on sizes."""
  if isinstance(k, jc.Tracer) or jc.is_symbolic_dim(k) or not (
      jc.is_symbolic_dim(n) or jc.is_symbolic_dim(m)):
    return original(n, m, k)
  k = operator.index(k)
  if k < 0:
    return n * m - triu_size(original, m, n, 1 - k)
  r = jc.max_dim(m - k, 0)
  mk = jc.min_dim(n, r)
  return mk * (mk + 1) // 2 + mk * (r - mk)


jc.register_spellings({jnp.diag_indices: diag_indices, jc.TRIU_SIZE: triu_size})
