"""`jax.scipy.signal.convolve` (and `correlate`) at a symbolic length.

JAX's direct convolution (`_convolve_nd`) swaps its operands so that the
smaller one is the kernel: `all(s1 <= s2 ...)` on the shapes. With a dynamic
example `x` of length `n` and a fixed kernel `k` of length K that comparison
depends on `n`, and on the side `n < K` the padding it computes for
mode="same" is symbolic, which `lax.conv_general_dilated` refuses: examples
shorter than the kernel were refused, although NumPy and `jax.jit` handle them.

Why this replacement is exact: convolution commutes, and the "full" result,
`sum_j a[j] b[i - j]` of length `s1 + s2 - 1` on each axis, is the same
whichever operand is the kernel; JAX computes it as a correlation of the
larger operand with the flipped smaller one, padded by `smaller - 1` on both
sides. Here the fixed operand is always the kernel (constant padding, any
`n`): on the side `n >= K` that is exactly JAX's computation; on the other it
is the same sum in another order (equal up to rounding). mode="same" is the
centred part of "full" on each axis, `full[(s2 - 1) // 2 :][: s1]`, which is
what JAX's padding selects on both sides of its swap (s1, s2 the lengths of
`in1`, `in2` as given). mode="valid" (whose length, `|n - K| + 1`, depends on
the side), two operands that both have dynamic axes, and concrete shapes go
to JAX's own function.
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax as jc


def _symbolic(x: Any) -> bool:
  return any(jc.is_symbolic_dim(d) for d in np.shape(x))


def convolve_nd(original: Callable[..., Any], in1: Any, in2: Any, mode: str, *,
                precision: Any = None) -> Any:
  if (mode not in ("full", "same") or np.ndim(in1) != np.ndim(in2) or np.ndim(in1) == 0
      or _symbolic(in1) == _symbolic(in2)):
    return original(in1, in2, mode, precision=precision)
  in1, in2 = jc.promote_dtypes_inexact(in1, in2)
  s1, s2 = np.shape(in1), np.shape(in2)
  big, kernel = (in2, in1) if _symbolic(in2) else (in1, in2)   # the fixed one is the kernel
  ks = np.shape(kernel)
  full = lax.conv_general_dilated(big[None, None], jnp.flip(kernel)[None, None],
                                  (1,) * len(ks), [(k - 1, k - 1) for k in ks],
                                  precision=precision)[0, 0]
  if mode == "full":
    return full
  starts = [(b - 1) // 2 for b in s2]
  if not any(jc.is_symbolic_dim(b) for b in starts):
    return lax.slice(full, starts, [b + a for b, a in zip(starts, s1, strict=True)])
  return lax.dynamic_slice(full, [jnp.asarray(b) for b in starts], s1)


jc.register_spellings({jc.CONVOLVE_ND: convolve_nd})
