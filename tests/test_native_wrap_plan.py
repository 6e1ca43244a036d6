"""Native mode masks a cotangent only where it may be nonzero in the padding.

`native.wrap_plan` skips the wrap of a value whose every consumer already
delivers a cotangent that is zero in the padding (a fill, a LINEAR equation,
or an elementwise one whose derivative cannot turn 0 into NaN: add, select,
max, a relu). These tests check both halves: the gradients stay exact and
finite with NaN/inf padding where the derivative *can* turn 0 into NaN
(mul by a padded value, exp, a custom rule dividing by its input, a scalar
broadcast into a nonlinear op), and the wraps skipped are the ones that are
redundant (relu's output feeding a contraction).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._masking import native

GARBAGE = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30], np.float32)
LENGTHS = (3, 1, 7, 5)
PADDED, D = 8, 4


@jax.custom_jvp
def log_rule(x):
  return jnp.log(x * x + 1.0)


@log_rule.defjvp
def _log_rule_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return log_rule(x), 2.0 * x * t / (x * x + 1.0)   # t / padding: 0 * NaN


def _models():
  return {
      # relu's output feeds a contraction: its wrap is redundant
      "relu_chain": lambda p, x: jnp.sum(jax.nn.relu(jax.nn.relu(x @ p["w"] + p["b"]) @ p["v"])),
      # a zero-preserving chain (sub, max, mul and div by constants) into a sum
      "preserving": lambda p, x: jnp.sum(jnp.maximum((x @ p["w"] - p["b"]) * 0.5 / 4.0, -1.0)),
      # a scalar broadcast into a product with padded values
      "scalar_times_padded": lambda p, x: jnp.sum(jnp.tanh(x @ p["w"]) * p["s"]),
      # exp's derivative reads the padding
      "exp_then_sum": lambda p, x: jnp.sum(jnp.exp(-jnp.abs(x @ p["w"])) @ p["v"]),
      # a custom rule whose tangent multiplies by the input
      "custom_rule": lambda p, x: jnp.sum(log_rule(x @ p["w"] + p["b"]) @ p["v"]),
      # a scalar times the raw padding (NaN, inf) of an input
      "scalar_times_input": lambda p, x: jnp.sum(jnp.sin(x) * p["s"]),
      # log of a contraction: its filled padding is 0, log's derivative there inf
      "log_after_fill": lambda p, x: jnp.sum(jnp.log(jnp.abs(x @ p["w"])) @ p["v"]),
      "inverse_after_fill": lambda p, x: jnp.sum(1.0 / (x @ p["w"] + 1e-30 * p["b"])),
      # a padded product of two padded values, then a max over positions' mean
      "padded_product": lambda p, x: jnp.mean(jnp.max((x @ p["w"]) * (x @ p["v"]), axis=1)),
  }


def _params(rng):
  n = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.5, jnp.float32)
  return {"w": n(D, D), "b": n(D), "v": n(D, D), "s": n()}


def _batch(examples, rng):
  data = rng.choice(GARBAGE, (len(examples), PADDED, D)).astype(np.float32)
  for i, x in enumerate(examples):
    data[i, :len(x)] = x
  return pj.Ragged(jnp.asarray(data), jnp.asarray([len(x) for x in examples], jnp.int32))


@pytest.mark.parametrize("name", list(_models()))
def test_gradients_stay_exact_where_wraps_are_skipped(name):
  rng = np.random.default_rng(3)
  fun, params = _models()[name], _params(rng)
  examples = [rng.standard_normal((n, D)).astype(np.float32) for n in LENGTHS]
  batch = _batch(examples, rng)
  got = jax.jit(jax.grad(lambda p: pj.vmap(fun, in_axes=(None, 0))(p, batch).sum()))(params)
  grads = [jax.grad(fun)(params, jnp.asarray(x)) for x in examples]
  want = jax.tree.map(lambda *g: sum(g), *grads)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


def _plan_of(fun):
  n = jax.export.symbolic_shape("n")[0]
  p = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                   _params(np.random.default_rng(0)))
  closed = jax.make_jaxpr(fun)(p, jax.ShapeDtypeStruct((n, D), jnp.float32))
  return closed.jaxpr, native.wrap_plan(closed.jaxpr)


def test_relu_output_feeding_a_contraction_is_not_wrapped():
  jaxpr, plan = _plan_of(_models()["relu_chain"])
  relus = [e for e in jaxpr.eqns if e.primitive.name == "custom_jvp_call"]
  dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
  assert len(relus) == 2 and len(dots) == 2
  # the first relu feeds the second contraction (whose fill cleans its
  # cotangent); the second feeds the sum, whose fill does the same
  assert [plan[id(e)] for e in relus] == [(False,), (False,)]
  # the contractions' outputs meet relu's derivative (a select): clean too
  assert [plan[id(e)] for e in dots] == [(False,), (False,)]


def test_outputs_meeting_a_nonlinear_derivative_are_wrapped():
  jaxpr, plan = _plan_of(_models()["exp_then_sum"])
  (first, _) = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
  assert plan[id(first)] == (True,)
  jaxpr, plan = _plan_of(_models()["custom_rule"])
  (rule,) = [e for e in jaxpr.eqns if e.primitive.name == "custom_jvp_call"]
  (first, _) = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
  assert plan[id(first)] == (True,)
