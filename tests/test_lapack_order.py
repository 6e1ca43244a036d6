"""LAPACK calls in polyjit's programs run one after another (issue 26's hang).

jaxlib 0.10.x splits the batch of a CPU LAPACK call over XLA:CPU's intra-op
pool and blocks until the pieces finish; when as many independent LAPACK calls
as the pool has threads start together, every worker waits and the program
hangs (see `polyjit/_masking/lapack_order.py`). polyjit chains the LAPACK calls of a
masked evaluation, and masked calls that contain them, by data dependencies,
so no two are ever runnable at once. These tests check the compiled programs
for that order (no pair of LAPACK custom calls without a data path between
them) and the values against `jax.hessian` on the unpadded rows, with NaN in
the padding; the issue's program also runs in a subprocess under a timeout.
"""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._masking import lapack_order as _lapack_order

pytestmark = pytest.mark.skipif(
    not _lapack_order.ACTIVE,
    reason="this jaxlib does not run LAPACK batches on the intra-op pool")


def _pd(x):
  n = x.shape[0]
  a = (jnp.outer(x, x) * 0.1 + jnp.eye(n, dtype=x.dtype) * (1.0 + 0.125 * n)
       + 0.05 * jnp.tanh(x)[:, None])
  return a @ a.T


def _f(x):
  return jnp.sum(jnp.linalg.cholesky(_pd(x)) * jnp.cos(x)[:, None])


def _unordered_lapack_calls(hlo: str) -> list[tuple[str, str]]:
  """Pairs of LAPACK custom calls of one HLO computation with no data path
  from one to the other (XLA:CPU may run those at the same time)."""
  pairs = []
  for computation in re.split(r"\n(?=\S)", hlo):
    operands: dict[str, set[str]] = {}
    calls = []
    for line in computation.splitlines():
      m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*)", line)
      if not m:
        continue
      name, rest = m.groups()
      operands[name] = set(re.findall(r"%([\w.\-]+)", rest.split("), ")[0]))
      if re.search(r'custom_call_target="lapack_', rest):
        calls.append(name)
    seen: dict[str, set[str]] = {}

    def ancestors(name: str) -> set[str]:
      if name not in seen:
        seen[name] = set()
        found = set()
        for o in operands.get(name, ()):
          if o in operands:
            found |= {o} | ancestors(o)
        seen[name] = found
      return seen[name]

    for i, a in enumerate(calls):
      for b in calls[i + 1:]:
        if a not in ancestors(b) and b not in ancestors(a):
          pairs.append((a, b))
  return pairs


_ROWS = (3, 5)
_PADDED = 64   # large enough for jaxlib to split the batch over the pool


def _data():
  data = np.full((len(_ROWS), _PADDED), np.nan, np.float32)
  rng = np.random.default_rng(0)
  rows = [rng.normal(size=n).astype(np.float32) for n in _ROWS]
  for i, r in enumerate(rows):
    data[i, :len(r)] = r
  return data, np.array(_ROWS, np.int32), rows


# The reference, `jax.hessian` on each unpadded row under jax.jit: one jitted
# function for every test (a new `jax.jit` per call compiled each row's program
# again in each test), one row per program as before (two rows' LAPACK calls
# in one program would be the unordered pair these tests look for).
_hessian = jax.jit(jax.hessian(_f))


def _inside():
  m = pj.mask(jax.hessian(_f), ["n"])
  return jax.jit(jax.vmap(lambda xp, n: m([xp], {"n": n})))


def _inside_jacrev():
  m = pj.mask(jax.jacrev(jax.jacrev(_f)), ["n"])
  return jax.jit(jax.vmap(lambda xp, n: m([xp], {"n": n})))


def _outside():
  m = pj.mask(_f, ["n"])
  return jax.jit(jax.vmap(lambda xp, n: jax.hessian(lambda x: m([x], {"n": n}))(xp)))


def _outside_jacrev():
  m = pj.mask(_f, ["n"])
  return jax.jit(jax.vmap(
      lambda xp, n: jax.jacrev(jax.jacrev(lambda x: m([x], {"n": n})))(xp)))


@pytest.mark.parametrize("make", [_inside, _inside_jacrev, _outside, _outside_jacrev],
                         ids=["hessian-inside", "jacrev2-inside", "hessian-outside",
                              "jacrev2-outside"])
def test_lapack_calls_of_a_batched_cholesky_hessian_are_ordered(make):
  data, ns, rows = _data()
  g = make()
  hlo = g.lower(data, ns).compile().as_text()
  assert len(re.findall(r'custom_call_target="lapack_', hlo)) >= 2
  assert _unordered_lapack_calls(hlo) == []
  out = np.asarray(g(data, ns))
  for row, r in zip(out, rows, strict=True):
    n = len(r)
    np.testing.assert_allclose(row[:n, :n], _hessian(r), rtol=1e-4, atol=1e-5)
    assert np.all(np.isfinite(row[:n, :n]))


def test_pj_vmap_hessian_over_ragged_is_exact():
  data, ns, rows = _data()
  out = pj.vmap(jax.hessian(_f))(pj.Ragged(data, ns))
  for h, r in zip(out.to_list(), rows, strict=True):
    np.testing.assert_allclose(np.asarray(h), _hessian(r), rtol=1e-4, atol=1e-5)


def test_the_order_does_not_change_values_bit_for_bit():
  # `x + (-0.0 * token)` is x for -0, inf and NaN too.
  x = jnp.array([[-0.0, 0.0, np.inf, -np.inf, np.nan, 1.5]], jnp.float32)
  token = _lapack_order.token_after(None, [jnp.array([[np.nan]], jnp.float32)])
  y, = _lapack_order.after(token, [x])
  assert np.array_equal(np.asarray(y).view(np.uint32), np.asarray(x).view(np.uint32))
  z = jnp.array([complex(-0.0, -0.0), complex(np.nan, np.inf)], jnp.complex64)
  w, = _lapack_order.after(token, [z])
  assert np.array_equal(np.asarray(w).view(np.uint32), np.asarray(z).view(np.uint32))


_PROGRAM = """
import jax, jax.numpy as jnp, numpy as np, polyjit as pj
def pd(x):
  n = x.shape[0]
  a = (jnp.outer(x, x) * 0.1 + jnp.eye(n, dtype=x.dtype) * (1.0 + 0.125 * n)
       + 0.05 * jnp.tanh(x)[:, None])
  return a @ a.T
f = lambda x: jnp.sum(jnp.linalg.cholesky(pd(x)) * jnp.cos(x)[:, None])
m = pj.mask(jax.hessian(f), ["n"])
data = np.full((2, 64), np.nan, np.float32)   # rows of lengths 3 and 5
data[0, :3] = 0.0
data[1, :5] = 0.0
g = jax.jit(jax.vmap(lambda xp, n: m([xp], {"n": n})))
for _ in range(8):   # each run could hang before the fix (all runs did in 20)
  out = g(data, np.array([3, 5], np.int32)).block_until_ready()
for row, n in zip(np.asarray(out), (3, 5), strict=True):
  np.testing.assert_allclose(row[:n, :n], jax.hessian(f)(jnp.zeros(n)), rtol=1e-4, atol=1e-5)
print("done")
"""


def test_batched_cholesky_hessian_finishes():
  # The program, in a subprocess with a timeout, so that a hang
  # fails this test instead of hanging the suite.
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.dirname(os.path.abspath(pj.__file__))),
       os.environ.get("PYTHONPATH", "")]))
  try:
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True,
                          text=True, timeout=240, env=env)
  except subprocess.TimeoutExpired:
    pytest.fail("the batched masked Cholesky Hessian did not finish in 240 s (a hang)")
  assert done.returncode == 0 and "done" in done.stdout, done.stderr[-2000:]
