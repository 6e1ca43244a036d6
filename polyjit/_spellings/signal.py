"""`jax.scipy.signal.convolve` (and `correlate`), `jnp.convolve` and `jnp.correlate`
at a symbolic length.

`jnp.convolve`/`jnp.correlate` (1-d) are at the end (`conv_1d`): JAX's
`_conv` asks `len(x) == 0` and `len(x) < len(y)` for Python answers, which a
dynamic length has not; the replacement computes the full result with the
fixed operand as the kernel and slices what each mode keeps by size
expressions, so every mode is exact on either side of the comparison.

The N-d direct convolution of `jax.scipy.signal`:

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


# --- jnp.convolve / jnp.correlate ---------------------------------------------

_MODES = ("full", "same", "valid")


def _full(dyn: Any, fixed: Any, flip: bool, precision: Any, preferred: Any) -> Any:
  """`sum_j dyn[m + j - (K - 1)] * k[j]` over m < len(dyn) + K - 1, with `k` the
  `fixed` operand (flipped if `flip`): the full correlation of `dyn` with it."""
  kernel = jnp.flip(fixed) if flip else fixed
  k = kernel.shape[0]
  if not jc.is_symbolic_dim(k):   # a fixed kernel: constant padding, any length
    padding = [(k - 1, k - 1)]
  else:                           # both dynamic: the padding is a size; written out
    dyn = lax.pad(dyn, jnp.zeros((), dyn.dtype), [(k - 1, k - 1, 0)])
    padding = [(0, 0)]
  return lax.conv_general_dilated(dyn[None, None], kernel[None, None], (1,), padding,
                                  precision=precision,
                                  preferred_element_type=preferred)[0, 0]


def conv_1d(original: Callable[..., Any], a: Any, v: Any, mode: str, op: str,
            precision: Any = None, preferred_element_type: Any = None) -> Any:
  """`jnp.convolve` / `jnp.correlate` of 1-d operands, one of them of dynamic length.

  JAX's `_conv` compares the lengths (`len(x) < len(y)`) to make the shorter
  operand the kernel, then pads per mode. Every mode is a slice of the full
  result, whose value does not depend on that choice (convolution commutes;
  the full correlation of (y, x) is that of (x, y) reversed), so here the
  kernel is the fixed operand where there is one, and the slice is the one
  JAX's padding selects on either side of its comparison, as a size
  expression (lengths La, Lv; shorter one S, longer one L):

  * full: everything, La + Lv - 1;
  * same: L entries from (S - 1) // 2 for convolve; for correlate from
    (Lv - 1) // 2 when La >= Lv, else La // 2 (its output is reversed there),
    which is min((Lv - 1) // 2, La // 2) on both sides;
  * valid: L - S + 1 entries from S - 1.
  """
  if (op not in ("convolve", "correlate") or mode not in _MODES
      or np.ndim(a) != 1 or np.ndim(v) != 1 or not (_symbolic(a) or _symbolic(v))):
    return original(a, v, mode, op, precision, preferred_element_type)
  if preferred_element_type is None:
    a, v = jc.promote_dtypes_inexact(a, v)
  else:
    a, v = jc.promote_dtypes(a, v)
  la, lv = a.shape[0], v.shape[0]
  if op == "correlate":
    v = jnp.conj(v)
  if _symbolic(a) or not _symbolic(v):   # `a` slides along, `v` is the kernel
    full = _full(a, v, op == "convolve", precision, preferred_element_type)
  elif op == "convolve":                 # convolution commutes
    full = _full(v, a, True, precision, preferred_element_type)
  else:                                  # the full correlation of (v, a), reversed
    full = jnp.flip(_full(v, a, False, precision, preferred_element_type))
  if mode == "full":
    return full
  short, long = jc.min_dim(la, lv), jc.max_dim(la, lv)
  if mode == "valid":
    start, size = short - 1, long - short + 1
  elif op == "convolve":
    start, size = (short - 1) // 2, long
  else:
    start, size = jc.min_dim((lv - 1) // 2, la // 2), long
  if not jc.is_symbolic_dim(start):
    return lax.slice_in_dim(full, start, start + size)
  return lax.dynamic_slice_in_dim(full, jnp.asarray(start), size)


jc.register_spellings({jc.CONV_1D: conv_1d})
