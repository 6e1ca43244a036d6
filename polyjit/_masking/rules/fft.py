"""FFT along a dynamic axis: Bluestein's algorithm at the padded size.

Why
---
`fft` with a symbolic length n transforms the leading n entries of an axis;
on the padded axis XLA would compute the DFT of length P (the padded size)
instead, whose frequencies are multiples of 1/P, not 1/n: every output entry
would be wrong, not just the padding. No masking of the input fixes that.

Decision: compute it exactly (up to float rounding), not refuse
---------------------------------------------------------------
Bluestein's chirp-z identity jk = (j^2 + k^2 - (k - j)^2) / 2 turns the DFT of
any length n into a convolution:

    X[k] = c[k] * sum_{j<n} (x[j] c[j]) conj(c[k - j]),   c[m] = exp(-i pi m^2 / n),

and a linear convolution of two length-n sequences is a circular one of any
size M >= 2n - 1, computed with FFTs of size M. Taking M a power of two with
M >= 2P - 1 fixes the size at trace time, while n (in the chirp, and in the
masks that zero the input and kernel past n) stays a traced value: one
program serves every length up to P, under jit and vmap. The cost is three
FFTs of size M (2P - 1 <= M < 4P) instead of one of size n.

The result differs from XLA's FFT only by rounding. The chirp's phase
pi * m^2 / n is reduced to [0, 2 pi) with exact integer arithmetic
(m^2 mod 2n in uint32, `_square_mod`) before it becomes a float, so each chirp
entry carries one rounding whatever n is; then three FFTs of size M and three
elementwise products each add O(eps log M) relative error (in the 2-norm),
a small constant times the error of the FFT itself. tests/test_rules_fft.py
measures it and states its tolerances.

A refusal would have been the alternative; it was rejected because the
transform is well defined and the algorithm is exact in exact arithmetic:
nothing is guessed, only rounded differently.

Transform types
---------------
Multi-dimensional transforms are separable, so each transformed axis is done
on its own: fixed-length axes with the plain FFT, dynamic ones with
Bluestein. RFFT along a dynamic last axis is the complex transform of the
real input, cut to its first P // 2 + 1 entries (the valid ones are the first
n // 2 + 1). IRFFT along a dynamic last axis rebuilds the full spectrum from
the half one by Hermitian symmetry, X[k] = conj(X[n - k]) for k > n // 2 (a
gather with traced indices), inverts it with Bluestein and keeps the real
part: exactly XLA's C2R, which also ignores the imaginary parts of X[0] and
X[n / 2].

Derivatives at symbolic sizes
-----------------------------
The transposes of FFT and IFFT are FFTs of the same lengths, which this rule
masks. JAX's transposes of RFFT and IRFFT weight the DC and Nyquist entries
and decide whether a Nyquist entry exists with `if not n % 2`, which is
silently False for a symbolic n: their gradients would be wrong for every
even length. At symbolic sizes (only there) this module supplies both
transposes with the parity decided at run time.
"""

from __future__ import annotations

from typing import Any, Callable

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _jax as jc
from ..core import RuleContext, register

FftType = lax.FftType
_is_dyn = jc.is_symbolic_dim


def _square_mod(j: Any, m: Any, bits: int) -> Any:
  """`j * j mod m` for uint32 `j` < 2**bits and `m` < 2**31, exactly.

  Double-and-add over the bits of j: every intermediate stays below 2 m, so
  nothing overflows, whatever the size (j * j alone would from j = 2**16).
  """
  def reduce(r: Any) -> Any:
    return lax.select(r >= m, r - m, r)

  j = lax.rem(j, m)
  r = jnp.zeros_like(j)
  for bit in reversed(range(bits)):
    r = reduce(r + r)
    r = lax.select((j >> bit) & 1 == 1, reduce(r + j), r)
  return r


def _chirp(n: Any, size: int, dtype: Any, inverse: bool) -> Any:
  """exp(-+ i pi j^2 / n) for j < size (minus for the forward transform)."""
  real = np.finfo(dtype).dtype
  j = lax.iota(np.uint32, size)
  m = lax.convert_element_type(n, np.uint32) * np.uint32(2)
  phase = _square_mod(j, lax.broadcast(m, (size,)), max(size - 1, 1).bit_length())
  theta = np.asarray(np.pi, real) * phase.astype(real) / lax.convert_element_type(n, real)
  sign = 1 if inverse else -1
  return lax.complex(jnp.cos(theta), sign * jnp.sin(theta))


def _bluestein(x: Any, axis: int, n: Any, inverse: bool) -> Any:
  """The length-n DFT (or inverse DFT) of the first n entries along `axis`.

  `n` is a traced scalar <= P = x.shape[axis]; entries from n on are ignored
  (replaced by zeros with `select`, so NaN there cannot leak). Entries from n
  on of the result are unspecified.
  """
  size = x.shape[axis]
  fft_size = 1 << (2 * size - 2).bit_length()  # a power of two >= 2 P - 1
  chirp = _chirp(n, size, x.dtype, inverse)
  valid = lax.iota(jc.dim_value_dtype(), size) < n
  along: Callable[[Any], Any] = lambda v: lax.broadcast_in_dim(v, x.shape, (axis,))
  a = lax.select(along(valid), x * along(chirp), lax.full_like(x, 0))
  # The kernel conj(c[m]) for -n < m < n, laid out circularly.
  kernel = lax.select(valid, jnp.conj(chirp), lax.full_like(chirp, 0))
  kernel = jnp.concatenate([kernel, jnp.zeros(fft_size - 2 * size + 1, x.dtype),
                            kernel[:0:-1]])
  spectrum = jnp.fft.fft(a, n=fft_size, axis=axis)  # zero-extended to fft_size
  kernel = lax.broadcast_in_dim(jnp.fft.fft(kernel), spectrum.shape, (axis,))
  conv = jnp.fft.ifft(spectrum * kernel, axis=axis)
  out = lax.slice_in_dim(conv, 0, size, axis=axis) * along(chirp)
  if inverse:
    out = out / lax.convert_element_type(n, np.finfo(x.dtype).dtype)
  return out


def _c2c(ctx: RuleContext, x: Any, axis: int, length: Any, inverse: bool) -> Any:
  if _is_dyn(length):
    return _bluestein(x, axis, ctx.logical(length), inverse)
  return (jnp.fft.ifft if inverse else jnp.fft.fft)(x, axis=axis)


def _hermitian_full(ctx: RuleContext, x: Any, length: Any) -> Any:
  """The full length-n spectrum along the last axis from its first n // 2 + 1."""
  n = ctx.logical(length)
  k = lax.iota(n.dtype, ctx.padded(length))
  upper = k > n // 2
  index = jnp.clip(lax.select(upper, n - k, k), 0, x.shape[-1] - 1)
  full = jnp.take(x, index, axis=-1)
  along = lax.broadcast_in_dim(upper, full.shape, (full.ndim - 1,))
  return lax.select(along, jnp.conj(full), full)


@register("fft")
def _fft(ctx: RuleContext, x: Any, *, fft_type: Any, fft_lengths: Any) -> list[Any]:
  if not any(map(_is_dyn, fft_lengths)):  # only batch axes are dynamic
    return ctx.bind(x, fft_type=fft_type, fft_lengths=fft_lengths)
  out_aval, = ctx.out_avals
  first = x.ndim - len(fft_lengths)
  others = [(first + i, d) for i, d in enumerate(fft_lengths[:-1])]
  last, n = x.ndim - 1, fft_lengths[-1]
  if fft_type in (FftType.FFT, FftType.IFFT):
    for axis, d in [*others, (last, n)]:
      x = _c2c(ctx, x, axis, d, fft_type == FftType.IFFT)
    return [x]
  if fft_type == FftType.RFFT:
    if _is_dyn(n):
      x = _bluestein(x.astype(out_aval.dtype), last, ctx.logical(n), inverse=False)
      x = lax.slice_in_dim(x, 0, ctx.padded(out_aval.shape[-1]), axis=last)
    else:
      x = jnp.fft.rfft(x, axis=last)
    for axis, d in others:
      x = _c2c(ctx, x, axis, d, inverse=False)
    return [x]
  for axis, d in others:  # IRFFT: the complex axes first, as XLA does
    x = _c2c(ctx, x, axis, d, inverse=True)
  if _is_dyn(n):
    x = jnp.real(_bluestein(_hermitian_full(ctx, x, n), last, ctx.logical(n), inverse=True))
  else:
    x = jnp.fft.irfft(x, n=n, axis=last)
  return [x.astype(out_aval.dtype)]


# --- derivatives at symbolic sizes ---------------------------------------------

def _half_spectrum_weights(n: Any, m: int, dtype: Any) -> Any:
  """1 at DC and at Nyquist (k = n / 2, even n only), 2 elsewhere: how often
  each entry of a half spectrum of length m stands in the full one."""
  k = lax.iota(jc.dim_value_dtype(), m)
  once = (k == 0) | (k * 2 == n)
  return jnp.where(once, 1, 2).astype(dtype)


def _transpose(t: Any, fft_type: Any, fft_lengths: Any) -> Any:
  """The transpose of RFFT or IRFFT, with the Nyquist entry found at run time."""
  n = fft_lengths[-1]
  size = jnp.asarray(math.prod(fft_lengths))
  if fft_type == FftType.RFFT:
    # rfft^T t = Re(sum_k t_k w^{jk}) over the half spectrum = size * irfft(conj(t) / weights)
    weights = _half_spectrum_weights(n, t.shape[-1], t.dtype)
    out = lax.fft(jnp.conj(t) / weights, FftType.IRFFT, fft_lengths)
    return out * size.astype(out.dtype)
  x = lax.fft(t, FftType.RFFT, fft_lengths)
  weights = _half_spectrum_weights(n, x.shape[-1], x.dtype)
  return jnp.conj(weights * x / size.astype(x.dtype))


def fft_transpose_rule(_: Any, original: Callable[..., Any]) -> Callable[..., Any]:
  def rule(t: Any, operand: Any, *, fft_type: Any, fft_lengths: Any) -> Any:
    if fft_type not in (FftType.RFFT, FftType.IRFFT) or not _is_dyn(fft_lengths[-1]):
      return original(t, operand, fft_type=fft_type, fft_lengths=fft_lengths)
    return (_transpose(t, fft_type, fft_lengths),)
  return rule
