"""FFT along dynamic axes (Bluestein at the padded size) and its gradients.

Every row runs eagerly, under jit, under vmap over different logical sizes and
under grad (see harness.py), with NaN/inf/huge values in the padding; sizes
mix even and odd lengths (RFFT and IRFFT treat a Nyquist entry specially).

Tolerances. The masked transform differs from XLA's FFT by rounding only:
three FFTs of size M (the power of two >= 2P - 1) and a few elementwise
products, each O(eps log2 M) relative in the 2-norm. `test_accuracy_*`
measures it against float64 NumPy at sizes up to P = 100 and requires

    ||masked - exact||_2 <= 2 * eps * log2(M) * ||exact||_2,

about four times the worst error measured (0.44 eps log2 M, up to P = 1000;
XLA's own FFT: 0.13 eps log2 M). The table rows (P <= 8, values of order 1)
use the harness's elementwise 2e-5, some thirty times the error there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj
from harness import Case, make, normal, table_test

SIZES = ({"n": 2}, {"n": 7})   # even and odd: RFFT treats a Nyquist entry specially
NM = {"n": 6, "m": 5}
SIZES_NM = ({"n": 1, "m": 5}, {"n": 6, "m": 2})


def complexes(*shape):
  """An argument piece: complex normal values of `shape`."""
  part = normal(*shape)
  return lambda rng, s: (part(rng, s) + 1j * part(rng, s)).astype(np.complex64)


def vec(fun, name, piece=complexes, **kw):
  return Case(name, fun, ["n"], make(piece("n")), sizes=SIZES, **kw)


def irfft_odd_and_even(x):
  """IRFFT to 2n - 1 and 2n - 2 entries (jnp.fft.irfft cannot be traced with a
  symbolic length, see below; lax.fft can)."""
  return (lax.fft(x, "irfft", (2 * x.shape[0] - 1,)),
          lax.fft(x, "irfft", (2 * x.shape[0] - 2,)))


CASES = [
    vec(jnp.fft.fft, "fft"),
    vec(jnp.fft.ifft, "ifft"),
    vec(jnp.fft.rfft, "rfft", normal),
    vec(lambda x: jnp.abs(jnp.fft.rfft(x, norm="ortho")) ** 2, "periodogram", normal),
    vec(irfft_odd_and_even, "irfft_odd_and_even", constraints=("n >= 2",)),
    Case("fftn_two_dynamic_axes", jnp.fft.fftn, ["(n, m)"], make(complexes("n", "m")),
         sizes=SIZES_NM, padded=NM),
    Case("rfft2_dynamic_last", jnp.fft.rfft2, ["(_, n)"], make(normal(3, "n")), sizes=SIZES),
    Case("rfft2_dynamic_first", jnp.fft.rfft2, ["(n, _)"], make(normal("n", 4)), sizes=SIZES),
    Case("irfft2_dynamic", lambda x: lax.fft(x, "irfft", (x.shape[0], 2 * x.shape[1] - 2)),
         ["(n, m)"], make(complexes("n", "m")), sizes=SIZES_NM, padded=NM,
         constraints=("m >= 2",)),
    Case("fft_over_fixed_axis", lambda x: jnp.fft.fft(x, axis=1), ["(n, _)"],
         make(complexes("n", 5)), sizes=SIZES),
]

CASES_BY_NAME, test_rule = table_test(CASES)


# --- accuracy --------------------------------------------------------------------

P = 100
LENGTHS = (1, 2, 37, 64, 99, 100)
EPS = np.finfo(np.float32).eps
LOG2_M = np.log2(1 << (2 * P - 2).bit_length())


def _padded(x, size):
  out = np.full(size, np.nan, x.dtype)
  out[:len(x)] = x
  return out


def _assert_accurate(got, exact, what):
  err = np.linalg.norm(got - exact)
  bound = 2 * EPS * LOG2_M * np.linalg.norm(exact)
  assert err <= bound, f"{what}: error {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("op", ["fft", "ifft", "rfft"])
def test_accuracy_against_float64(op):
  rng = np.random.default_rng(0)
  masked = jax.jit(pj.mask(getattr(jnp.fft, op), ["n"]))
  for n in LENGTHS:
    x = rng.standard_normal(n) + (0 if op == "rfft" else 1j * rng.standard_normal(n))
    x = x.astype(np.float32 if op == "rfft" else np.complex64)
    exact = getattr(np.fft, op)(x.astype(np.float64 if op == "rfft" else np.complex128))
    got = np.asarray(masked([_padded(x, P)], {"n": n}))[:len(exact)]
    _assert_accurate(got, exact, f"{op} n={n}")


def test_accuracy_of_irfft_against_float64():
  rng = np.random.default_rng(1)
  masked = jax.jit(pj.mask(lambda x: lax.fft(x, "irfft", (2 * x.shape[0] - 2,)), ["n"]))
  for n in (2, 3, 26, 50):  # output lengths 2 .. 98, all even
    x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    exact = np.fft.irfft(x.astype(np.complex128), 2 * n - 2)
    got = np.asarray(masked([_padded(x, P // 2)], {"n": n}))[:2 * n - 2]
    _assert_accurate(got, exact, f"irfft n={n}")


def test_accuracy_of_rfft_gradient_against_float64():
  """The RFFT transpose polyjit supplies: Re(sum_k ct_k exp(-2 pi i jk / n))."""
  rng = np.random.default_rng(2)
  masked = pj.mask(jnp.fft.rfft, ["n"])

  @jax.jit
  def gradient(x, ct, n):
    return jax.vjp(lambda x: masked([x], {"n": n}), x)[1](ct)[0]

  for n in LENGTHS:
    x = rng.standard_normal(n).astype(np.float32)
    ct = (rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1))
    ct = ct.astype(np.complex64)
    got = np.asarray(gradient(_padded(x, P), _padded(ct, P // 2 + 1), n))
    j, k = np.arange(n)[:, None], np.arange(n // 2 + 1)[None, :]
    exact = np.real(np.exp(-2j * np.pi * j * k / n) @ ct.astype(np.complex128))
    _assert_accurate(got[:n], exact, f"rfft gradient n={n}")
    assert np.all(got[n:] == 0)


# --- JAX's own limits ---------------------------------------------------------------

@pytest.mark.xfail(raises=(TypeError, pj.PolyjitError), strict=True,
                   reason="JAX 0.10.2's jnp.fft.irfft calls int() on the output length")
def test_jnp_irfft_cannot_be_traced_with_a_dynamic_length():
  """When JAX lets jnp.fft.irfft trace, this fails: then add rows for it."""
  masked = pj.mask(lambda x: jnp.fft.irfft(x, n=2 * x.shape[0] - 2), ["n"])
  masked([np.zeros(8, np.complex64)], {"n": 5})


@pytest.mark.parametrize("n", [5, 6])
@pytest.mark.parametrize("fft_type", ["RFFT", "IRFFT"])
def test_real_fft_transposes_match_jax_at_fixed_sizes(fft_type, n):
  """The RFFT/IRFFT transposes polyjit supplies at symbolic sizes equal JAX's."""
  from polyjit._masking.rules import fft
  rng = np.random.default_rng(3)
  fft_type = lax.FftType[fft_type]
  if fft_type == lax.FftType.RFFT:
    x = rng.standard_normal(n).astype(np.float32)
    ct = (rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1))
  else:
    x = (rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1))
    ct = rng.standard_normal(n)
  f = lambda x: lax.fft(x, fft_type, (n,))
  _, pullback = jax.vjp(f, jnp.asarray(x, np.float32 if fft_type == lax.FftType.RFFT
                                       else np.complex64))
  ct = jnp.asarray(ct, np.complex64 if fft_type == lax.FftType.RFFT else np.float32)
  expected, = pullback(ct)
  np.testing.assert_allclose(fft._transpose(ct, fft_type, (n,)), expected,
                             rtol=1e-5, atol=1e-5)
