"""What is not supported raises, naming the primitive, the place and a remedy."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive

import polyjit as pj

# A primitive no rule will ever know about (real ones may get rules later).
mystery_p = Primitive("mystery")
mystery_p.def_abstract_eval(lambda x: x)
mystery_p.def_impl(lambda x: x)


def test_a_primitive_without_a_rule_is_refused():
  def f(x):
    return mystery_p.bind(x * 2).sum()  # the line the error must point to

  masked = pj.mask(f, ["(n, _)"])
  with pytest.raises(pj.MaskingError) as e:
    masked([np.zeros((8, 3), np.float32)], {"n": 3})
  err = e.value
  assert err.primitive == "mystery"
  line = inspect.getsourcelines(f)[1] + 1
  assert f"test_errors.py:{line}" in err.source and ".f)" in err.source
  msg = str(err)
  assert "operand 0 float32[n,3]: axis 0 (n)" in msg
  assert "What to do:" in msg
  assert any("while masking f" in note for note in err.__notes__)


def test_a_primitive_without_a_rule_on_fixed_axes_runs():
  masked = pj.mask(lambda x, w: x.sum() + mystery_p.bind(w).sum(), ["n", None])
  assert float(masked([np.ones(8, np.float32), np.ones(3, np.float32)], {"n": 2})) == 5.0


def test_reverse_mode_through_a_dynamic_trip_count_loop():
  # (a fori_loop from a constant to a size is a scan: see tests/test_spellings.py)
  f = lambda x: lax.while_loop(lambda c: c[0] < x.shape[0],
                               lambda c: (c[0] + 1, c[1] + x[c[0]] ** 2), (0, 0.0))[1]
  masked = pj.mask(f, ["n"])
  x = np.ones(6, np.float32)
  assert float(masked([x], {"n": 4})) == 4.0  # forward is fine
  with pytest.raises(pj.MaskingError, match=r"lax.scan"):
    jax.grad(lambda x: masked([x], {"n": 4}))(x)


def test_out_shape_mismatch_shows_both_shapes():
  masked = pj.mask(lambda x, y: jnp.concatenate([x, y]), ["n", "m"], out_shape="2*n")
  with pytest.raises(pj.ShapeError, match=r"output 0 has shape \(n \+ m,\) but out_shape "
                                          r"declares \(2\*n,\)"):
    masked([np.zeros(4), np.zeros(3)], {"n": 2, "m": 1})
