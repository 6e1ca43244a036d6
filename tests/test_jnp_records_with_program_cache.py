"""JAX's jnp op records under `pj.jit` at every size, 0 included, with
polyjit's on-disk program cache on (a temporary directory; the suite runs with
it off: tests/conftest.py). These are the ops whose programs at one size have
the text of another size's (JAX prunes an argument the result does not read),
or another op's, so a cache keyed by text alone loaded a program compiled for
other argument types (`tests/test_cache_key_calling_convention.py` tests the key itself).
Each call is compared with `jax.jit` on the same input: values, dtype, shape
and weak type."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._caching import disk as _disk_cache

SIZES = (1, 2, 9, 0)


def floats(n, seed):
  return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def ints(dtype):
  return lambda n, seed: np.random.default_rng(seed).integers(1, 12, size=n).astype(dtype)


def scalar(value):
  return lambda n, seed: value


CASES = {  # name: (function, argument makers (size, seed) -> value)
    "ldexp": (jnp.ldexp, (floats, ints(np.int32))),
    "ldexp scalar": (jnp.ldexp, (floats, scalar(np.int32(3)))),
    "array_equal": (jnp.array_equal, (floats, scalar(np.float32(0.5)))),
    "fmin": (jnp.fmin, (floats, scalar(np.float32(0.5)))),
    "fmax": (jnp.fmax, (floats, floats)),
    "heaviside": (jnp.heaviside, (floats, scalar(np.float32(0.5)))),
    "hypot": (jnp.hypot, (floats, scalar(np.float32(2.0)))),
    "isrealobj": (jnp.isrealobj, (floats,)),
    "copysign": (jnp.copysign, (floats, scalar(np.float32(-1.0)))),
    "lcm int32": (jnp.lcm, (ints(np.int32), scalar(np.int32(4)))),
    "lcm int8": (jnp.lcm, (ints(np.int8), ints(np.int8))),
    "nancumsum axis=None": (lambda x: jnp.nancumsum(x, axis=None), (floats,)),
    "nancumprod axis=None": (lambda x: jnp.nancumprod(x, axis=None), (floats,)),
    # the same ops on integer vectors: at n = 0 their programs prune every
    # argument and share one text with the float rows' (one directory for all)
    "fmin int32": (jnp.fmin, (ints(np.int32), ints(np.int32))),
    "fmax int8": (jnp.fmax, (ints(np.int8), ints(np.int8))),
    "heaviside int32": (jnp.heaviside, (ints(np.int32), ints(np.int32))),
    "hypot int8": (jnp.hypot, (ints(np.int8), ints(np.int8))),
    "copysign float32 int32": (jnp.copysign, (floats, ints(np.int32))),
    "ldexp int8": (jnp.ldexp, (ints(np.int8), ints(np.int8))),
}


@pytest.fixture(scope="module")
def cache_on(tmp_path_factory):
  # one directory for the whole table, as one user's runs share one: the
  # programs of different ops at one size can have one text (at n = 0 every
  # argument can be pruned), and must still not share an entry
  assert pj.enable_persistent_cache(str(tmp_path_factory.mktemp("programs"))) is not None
  try:
    yield
  finally:
    _disk_cache.disable()  # (as POLYJIT_NO_CACHE=1, the suite's setting)


@pytest.mark.parametrize("name", list(CASES))
def test_a_jnp_record_at_every_size_with_the_program_cache_on(cache_on, name):
  fun, makers = CASES[name]
  f = pj.jit(lambda *args: fun(*args))
  for n in SIZES:
    args = [make(n, seed) for seed, make in enumerate(makers)]
    got, want = f(*args), jax.jit(fun)(*args)
    got, want = jnp.asarray(got), jnp.asarray(want)
    assert (got.dtype, got.shape, got.weak_type) == (want.dtype, want.shape, want.weak_type), (
        name, n, got, want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"{name} n={n}")
