"""The call path's lookups per call: the trace context is compared with the
last one looked up, not hashed (it is a 46-item tuple: hashing it was a
measurable part of every call), and a switch of context still finds the
other context's plans, never the wrong ones. Counted by wrapping
(monkeypatch), never timed.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

import polyjit as pj
from polyjit import _jax as jc
from polyjit._jit import plans, planner


def loglik(x, mu, log_sigma):
  z = (x - mu) * jnp.exp(-log_sigma)
  return jnp.sum(-0.5 * z * z - log_sigma) - 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


MU, LS = np.float32(0.1), np.float32(0.3)
DATA = np.random.default_rng(0).standard_normal(5000)  # float64: its dtype follows x64


class _CountedContext(tuple):
  """A trace context whose hashes are counted."""
  hashes = 0

  def __hash__(self):
    _CountedContext.hashes += 1
    return tuple.__hash__(self)


def test_calls_under_one_context_do_not_hash_it(monkeypatch):
  original = jc.trace_context
  monkeypatch.setattr(jc, "trace_context", lambda: _CountedContext(original()))
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[4096])
  f(DATA[:3000], MU, LS)
  f(DATA[:1000], MU, LS)
  _CountedContext.hashes = 0
  for n in list(range(1000, 1050)) + list(range(1000, 1050)):  # never seen, then repeated
    f(DATA[:n], MU, LS)
  assert _CountedContext.hashes == 0
  np.testing.assert_allclose(f(DATA[:1049], MU, LS), jax.jit(loglik)(DATA[:1049], MU, LS),
                             rtol=1e-5)


def test_switching_contexts_finds_each_contexts_own_plans(monkeypatch):
  built: collections.Counter[str] = collections.Counter()
  for owner, name in ((plans.Plan, "__init__"), (plans.Template, "plan_at"),
                      (planner.Planner, "prepare")):
    original = getattr(owner, name)

    def wrapper(*args, _original=original, _name=name, **kwargs):
      built[_name] += 1
      return _original(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapper)
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[4096])
  ref = jax.jit(loglik)
  for _ in range(2):  # each context's plans, made on the first round
    f(DATA[:300], MU, LS)
    with jax.enable_x64():
      f(DATA[:300], MU, LS)
  built.clear()
  for _ in range(3):
    got32 = f(DATA[:300], MU, LS)
    with jax.enable_x64():
      got64 = f(DATA[:300], MU, LS)
      want64 = ref(DATA[:300], MU, LS)
  assert built == {}, dict(built)  # repeated under either context: nothing built
  assert got32.dtype == np.float32 and got64.dtype == np.float64
  np.testing.assert_allclose(got32, ref(DATA[:300], MU, LS), rtol=1e-5)
  np.testing.assert_allclose(got64, want64, rtol=1e-12)


def test_a_vectors_resized_plan_is_the_general_loops():
  # `Template.plan_at`'s one-vector case (`one_leaf`) against its general loop.
  f = pj.jit(loglik, polymorphic_shapes=["n", None, None], buckets=[4096])
  f(DATA[:3000].astype(np.float32), MU, LS)
  (struct,) = f._structures.values()
  (template,) = struct.templates.values()
  assert template.one_leaf is not None
  for n in (1, 17, 3000, 4095, 4096):
    shapes, logical = ((n,), (), ()), {"n": n}
    fast = template.plan_at(shapes, logical)
    one, template.one_leaf = template.one_leaf, None
    try:
      general = template.plan_at(shapes, logical)
    finally:
      template.one_leaf = one
    assert fast.pads == general.pads and fast.waste == general.waste
    assert [int(v) for v in fast.logical] == [int(v) for v in general.logical] == [n]
    assert [v.dtype for v in fast.logical] == [v.dtype for v in general.logical]
    assert (fast.out_shapes, fast.dynamic_outputs) == (general.out_shapes, general.dynamic_outputs)
  np.testing.assert_allclose(f(DATA[:17].astype(np.float32), MU, LS),
                             jax.jit(loglik)(DATA[:17].astype(np.float32), MU, LS), rtol=1e-5)
