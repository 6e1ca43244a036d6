"""Specs: solving padded sizes from shapes, and checking logical sizes."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj


def padded_of(in_shapes, *args, **kw):
  return pj.mask(lambda *a: a, in_shapes, **kw).bind(list(args)).padded


def test_padded_sizes_are_solved_from_linear_specs():
  assert padded_of(["(m+1, n+1)"], np.zeros((6, 5))) == {"m": 5, "n": 4}
  assert padded_of(["(b, 2*n)"], np.zeros((4, 10))) == {"b": 4, "n": 5}
  assert padded_of(["n", "(n, n+m)"], np.zeros(3), np.zeros((3, 7))) == {"n": 3, "m": 4}


def test_fixed_scalar_and_none_specs():
  assert padded_of(["(n, _)", "", None], np.zeros((4, 3)), np.float32(1), np.zeros(7)) == {"n": 4}


def test_a_spec_is_a_prefix_of_its_argument():
  args = {"a": np.zeros(5), "b": (np.zeros(5), np.zeros((5, 2)))}
  assert padded_of([{"a": "n", "b": ("n", "(n, _)")}], args) == {"n": 5}
  assert padded_of(["(n, ...)"], np.zeros((5, 2))) == {"n": 5}


def test_a_size_that_no_whole_number_fits():
  with pytest.raises(pj.ShapeError, match=r"argument 0 axis 1 has padded size 9.*2\*n"):
    padded_of(["(b, 2*n)"], np.zeros((4, 9)))


def test_inconsistent_padding_names_both_places():
  with pytest.raises(pj.ShapeError) as e:
    padded_of(["n", "(_, n)"], np.zeros(8), np.zeros((2, 6)))
  msg = str(e.value)
  assert "argument 1 axis 1 has size 6" in msg and "argument 0 axis 0 (size 8)" in msg


def test_unsolvable_dimension():
  with pytest.raises(pj.ShapeError, match=r"cannot solve the padded size of \['m', 'n'\]"):
    padded_of(["n*m"], np.zeros(6))


def test_rank_and_prefix_mismatches():
  with pytest.raises(pj.ShapeError, match="has 2 dims but the argument has shape"):
    padded_of(["(n, m)"], np.zeros(3))
  with pytest.raises(pj.ShapeError, match="one spec per positional argument"):
    padded_of(["n"], np.zeros(3), np.zeros(3))
  for spec, x, rank in [("(n, _)", np.zeros(4), "2 dims"), ("n", np.zeros((4, 2)), "1 dim"),
                        ("(n,)", np.zeros((4, 2)), "1 dim"), ("(n, _, 3)", np.zeros((4, 3)),
                                                              "3 dims")]:
    with pytest.raises(pj.ShapeError, match=rf"the spec '{re.escape(spec)}' has {rank} but "
                       r"the argument has shape") as e:
      padded_of([spec], x)
    assert "syntax error" not in str(e.value)
  with pytest.raises(pj.ShapeError, match="not a pytree prefix"):
    padded_of([("n", "n")], np.zeros(3))


@pytest.mark.parametrize("env, match", [
    ({"n": 9}, "n=9 does not fit: it must be between 0 and its padded size 8"),
    ({"n": -1}, "n=-1 does not fit"),
    ({}, r"missing sizes for \['n'\]"),
    ({"n": 3, "k": 2}, r"sizes for \['k'\], which no spec mentions"),
    ({"n": 2.5}, "must be an integer scalar"),
])
def test_logical_sizes_are_checked(env, match):
  masked = pj.mask(jnp.sum, ["n"])
  with pytest.raises(pj.ShapeError, match=match):
    masked([np.zeros(8, np.float32)], env)


def test_logical_sizes_of_derived_dims_fit():
  masked = pj.mask(lambda x: x.sum(), ["n+1"])
  assert float(masked([np.ones(5, np.float32)], {"n": 4})) == 5.0
  assert float(masked([np.ones(5, np.float32)], {"n": 1})) == 2.0


def test_traced_logical_sizes_are_accepted_unchecked():
  import jax
  masked = pj.mask(jnp.sum, ["n"])
  f = jax.jit(lambda x, n: masked([x], {"n": n}))
  assert float(f(np.ones(8, np.float32), np.int32(3))) == 3.0
