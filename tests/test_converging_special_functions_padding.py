"""Special functions that loop until every lane converges ignore the padding.

JAX lowers `lax.betainc` to a continued fraction that updates every lane on
every step until all lanes have converged, so padding lanes that converge
late changed the valid results (and two calls of one pj.jit function on the
same values could differ, as the host buffer's garbage went). The padding
of their operands now repeats a valid lane. Results are compared bit for bit
with jax.jit on the unpadded arrays, with NaN, inf, huge and slowly
converging garbage in the padding, under pj.mask (eager, jit), pj.vmap,
pj.jit (repeated calls) and grad.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import polyjit as pj

pytestmark = pytest.mark.filterwarnings("ignore::polyjit.PerformanceWarning")

FUNS = {
    "betainc": lambda a, b, x: lax.betainc(a, b, x),
    "igamma": lambda a, b, x: lax.igamma(a * b, x * 4),
    "igammac": lambda a, b, x: lax.igammac(a * b, x * 4),
}
P = 128


def _operands(rng, n):
  return [(rng.random(n) * 5 + 0.1).astype(np.float32),
          (rng.random(n) * 5 + 0.1).astype(np.float32),
          rng.random(n).astype(np.float32)]


def _paddings(rng):
  """Per operand (a, b, x): constant garbage, and lanes that converge slowly."""
  for g in (np.nan, np.inf, 1e30):
    yield [np.full(P, g, np.float32)] * 3
  yield [(rng.random(P) * 450 + 50).astype(np.float32),
         (rng.random(P) * 0.01 + 0.01).astype(np.float32),
         (rng.random(P) * 0.1 + 0.9).astype(np.float32)]


@pytest.mark.parametrize("name, sizes", [("betainc", (9, 100)), ("igamma", (31,)),
                                         ("igammac", (31,))])
def test_valid_lanes_do_not_see_the_padding(name, sizes):
  fun, rng = FUNS[name], np.random.default_rng(0)
  masked = pj.mask(fun, ["n", "n", "n"])
  jitted = jax.jit(lambda a, b, x, n: masked([a, b, x], {"n": n}))
  for n in sizes:
    ops = _operands(rng, n)
    want = np.asarray(jax.jit(fun)(*ops))
    for padding in _paddings(rng):
      args = [np.concatenate([o, p[n:]]) for o, p in zip(ops, padding, strict=True)]
      np.testing.assert_array_equal(np.asarray(jitted(*args, n))[:n], want)
  if name == "betainc":  # (eagerly too)
    np.testing.assert_array_equal(np.asarray(masked(args, {"n": n}))[:n], np.asarray(fun(*ops)))


def test_pj_jit_betainc_is_jax_jit_s_on_every_call(monkeypatch):
  fun = FUNS["betainc"]
  f = pj.jit(fun, polymorphic_shapes=["n", "n", "n"], buckets=[128])
  empty, values = np.empty, iter(np.tile(np.float32([1000.0, 1000.0, 0.5]), 1000))

  def slow_garbage(shape, dtype=float, *args, **kwargs):
    out = empty(shape, dtype, *args, **kwargs)
    if np.dtype(dtype).kind in "fu":   # (a, b, x in turn: slower to converge than the data)
      raw = out.reshape(-1).view(np.uint8)
      raw[:raw.size // 4 * 4].view(np.float32)[...] = next(values)
    return out

  monkeypatch.setattr(np, "empty", slow_garbage)
  rng = np.random.default_rng(1)
  for n in (9, 31, 100):
    ops = _operands(rng, n)
    want = np.asarray(jax.jit(fun)(*ops))
    for _ in range(3):
      np.testing.assert_array_equal(np.asarray(f(*ops)), want)


def test_ragged_batch_and_gradient():
  fun = FUNS["betainc"]
  rng = np.random.default_rng(2)
  examples = [_operands(rng, n) for n in (9, 3, 30)]
  batch = [pj.Ragged.from_list([jnp.asarray(e[i]) for e in examples]) for i in range(3)]
  got = pj.vmap(fun)(*batch).to_list()
  for g, e in zip(got, examples, strict=True):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(jax.vmap(fun)(*e)))
  loss = lambda s, a, b, x: jnp.sum(fun(a, b, x * s))
  masked = pj.mask(loss, [None, "n", "n", "n"])
  padding = list(_paddings(rng))[-1]
  for a, b, x in examples:
    n = len(x)
    args = [np.concatenate([o, p[n:]]) for o, p in zip((a, b, x), padding, strict=True)]
    got = jax.jit(jax.grad(lambda s, *args: masked([s, *args], {"n": n})))(np.float32(0.7), *args)
    want = jax.jit(jax.grad(loss))(np.float32(0.7), a, b, x)
    np.testing.assert_allclose(got, want, rtol=1e-5)
