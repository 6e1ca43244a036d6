"""The tail steps of a packed `lax.scan` are steps the examples take themselves.

A packed scan runs over the positions of every row at once, so the tokens of
a row's unused tail (and every token of a row the row count's bucket adds)
take a step too, its outputs discarded. Its derivative must still be as
finite as a real step's: zero cotangents times an infinite derivative are
NaN in the shared parameters' gradient. A tail step ran on the zeros of an
all-tail row, and in reverse on the row's first token with the initial
carry, a step no example takes (`sqrt(|c + x w|)` at 0); the gradients were
NaN where each example alone under `jax.jit` gives finite ones.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from test_packing import _check, _examples


def _root_step(w, x, reverse):
  step = lambda c, xt: (jnp.sqrt(jnp.abs(c + xt[0] * w[0, 0])), c * w[1, 1])
  final, ys = lax.scan(step, jnp.float32(0), x, reverse=reverse)
  return final, ys


def test_rows_all_tail_step_as_an_example():
  rng = np.random.default_rng(31)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = _examples(rng, [16] * 8 + [3])   # 9 rows of 16, bucketed to 10: one all tail
  _check(lambda w, x: _root_step(w, x, reverse=False), w, xs)


def test_reverse_tail_steps_start_where_the_example_does():
  """In reverse an example's first step reads its last token: a tail step
  that read the row's first token with the initial carry hit sqrt(0)."""
  rng = np.random.default_rng(32)
  w = jnp.asarray(rng.normal(size=(3, 4)).astype(np.float32))
  xs = _examples(rng, [5, 3, 6])
  for x in xs:
    x[0] = 0.0   # (each example's own last reverse step, at c != 0, is finite)
  _check(lambda w, x: _root_step(w, x, reverse=True), w, xs)
