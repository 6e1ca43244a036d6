"""`len(x)` of an array with a dynamic leading axis, while polyjit traces.

`len(x)` answers the symbolic size, as `x.shape[0]` does (`polyjit/_spellings/
length.py`): `loss.sum() / len(batch)`, `len(ts) > 0`, `jnp.arange(len(x))`
run exactly under pj.mask (NaN/inf padding, jit, vmap, grad), pj.jit (against
jax.jit, bounded compiles) and pj.vmap. Where a Python number is needed,
`range(len(x))`, the refusal names the user's line. The swap is thread-local
and scoped: another thread, during a trace, gets the builtin's answers and
errors; nested traces and an exception inside the trace restore the builtin;
afterwards `len` is the builtin again and len() of a traced array outside a
polyjit trace behaves as before.
"""

from __future__ import annotations

import builtins
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import polyjit as pj
from harness import Case, make, normal, table_test

BUILTIN_LEN = builtins.len


def mean_by_len(x):
  return x.sum() / len(x), jnp.arange(len(x)) * x, len(x) * 2.0 - x


def lengths_compared(x, m):
  # diffrax's `len(ts) > 0`, dynamax's `num_timesteps = len(emissions)`
  y = x * 2.0 if len(x) > 0 else x
  steps = len(m)
  w = jnp.ones(len(m[0]))          # a fixed length stays an int
  t = jnp.arange(steps)
  out = jax.lax.scan(lambda c, tr: (c + tr[1] @ w * tr[0], c), 0.0, (t, m))[1]
  return y, out, jnp.minimum(t + 1, steps - 1), len(x) == len(m)


CASES = [
    Case("mean_by_len", mean_by_len, ["n"], make(normal("n")), compiled=True),
    Case("len_compared_and_scanned", lengths_compared, ["n", "(n, 3)"],
         make(normal("n"), normal("n", 3)), compiled=True),
]

CASES_BY_NAME, test_rule = table_test(CASES)


def test_pj_jit_and_vmap_answer_len_as_the_size():
  f = pj.jit(lambda x: x.sum() / len(x))
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda e, d, **kw: compiles.append(e) if e == "/jax/core/compile/backend_compile_duration"
      else None)
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.FallbackWarning)   # no size compiled on its own
    for n in range(3, 23):
      x = np.linspace(-1.0, 2.0, n, dtype=np.float32)
      np.testing.assert_allclose(f(x), jax.jit(lambda x: x.sum() / len(x))(x), rtol=1e-6)
  assert pj.stats(f).compiles <= 6
  r = pj.Ragged.from_list([np.arange(k, dtype=np.float32) for k in (1, 4, 7)])
  out = pj.vmap(lambda x: x.sum() / len(x))(r)
  np.testing.assert_allclose(np.asarray(out), [0.0, 1.5, 3.0])


def test_range_of_len_is_refused_at_the_users_line():
  masked = pj.mask(lambda x: sum(x[i] for i in range(len(x))), ["n"])
  with pytest.raises(pj.ShapeError, match=r"range\(len\(x\)\)") as info:
    masked([np.ones(8, np.float32)], {"n": 3})
  assert "test_len_of_dynamic_axis.py" in str(info.value)
  assert builtins.len is BUILTIN_LEN


def test_len_is_the_builtin_before_and_after_a_trace_and_after_an_error():
  assert builtins.len is BUILTIN_LEN
  pj.mask(mean_by_len, ["n"])([np.ones(8, np.float32)], {"n": 3})
  assert builtins.len is BUILTIN_LEN

  def fails(x):
    assert isinstance(len(x), export.symbolic_shape("n")[0].__class__)
    raise RuntimeError("inside the trace")
  with pytest.raises(Exception, match="inside the trace"):
    pj.mask(fails, ["n"])([np.ones(8, np.float32)], {"n": 3})
  assert builtins.len is BUILTIN_LEN
  # Outside polyjit's traces, len() of a symbolic array is JAX's as before.
  n, = export.symbolic_shape("n")
  with pytest.raises(Exception):
    jax.eval_shape(lambda x: len(x) + 1, jax.ShapeDtypeStruct((n,), np.float32))
  assert jax.jit(lambda x: len(x))(np.ones(5)) == 5
  assert len([1, 2]) == 2 and len("abc") == 3


def test_nested_traces_answer_their_own_sizes():
  inner = pj.mask(lambda y: y.sum() / len(y), ["m"])

  def outer(x):
    assert builtins.len is not BUILTIN_LEN
    # a polyjit trace inside one: each answers its own size, and the outer
    # swap survives the inner trace's exit
    r = inner([jnp.ones(6, np.float32)], {"m": 4})
    return x.sum() / len(x) + r

  out = pj.mask(outer, ["n"])([np.arange(8, dtype=np.float32)], {"n": 5})
  np.testing.assert_allclose(out, 2.0 + 1.0)
  assert builtins.len is BUILTIN_LEN


def test_other_threads_get_the_builtins_answers_during_a_trace():
  inside, release = threading.Event(), threading.Event()
  seen = {}

  def traced(x):
    inside.set()
    release.wait(30)
    return x.sum() / len(x)

  def other():
    inside.wait(30)
    n, = export.symbolic_shape("n")
    seen["list"] = len([1, 2, 3])
    try:   # a symbolic array traced by JAX in this thread: JAX's own refusal
      jax.eval_shape(lambda x: len(x), jax.ShapeDtypeStruct((n,), np.float32))
      seen["symbolic"] = "answered"
    except Exception as e:
      seen["symbolic"] = type(e).__name__
    seen["concrete"] = jax.jit(lambda x: len(x))(np.ones(4))
    release.set()

  t = threading.Thread(target=other)
  t.start()
  out = pj.mask(traced, ["n"])([np.arange(8, dtype=np.float32)], {"n": 4})
  t.join(30)
  np.testing.assert_allclose(out, 1.5)
  assert seen == {"list": 3, "symbolic": "TypeError", "concrete": 4}
  assert builtins.len is BUILTIN_LEN


def test_two_threads_tracing_at_once_answer_their_own_sizes():
  # Both inside a polyjit trace at the same time (the first to enter installs
  # the swap, the last to leave restores it): each gets its own size.
  barrier = threading.Barrier(2, timeout=30)
  outs, errors = {}, []

  def traced(x):
    barrier.wait()          # both traces are inside now
    n = len(x)
    barrier.wait()          # neither has left
    return x.sum() / n + (1.0 if isinstance(n, int) else 0.0)

  def run(name, k):
    try:
      outs[name] = float(pj.mask(traced, ["n"])([np.arange(16, dtype=np.float32)], {"n": k}))
    except Exception as e:   # (reported below, with the thread's name)
      errors.append((name, e))

  threads = [threading.Thread(target=run, args=(name, k)) for name, k in (("a", 4), ("b", 9))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert not errors, errors
  assert outs == {"a": 1.5 + 1.0, "b": 4.0 + 1.0}
  assert builtins.len is BUILTIN_LEN


def test_an_error_in_an_inner_trace_caught_by_the_outer_leaves_the_outer_swap():
  inner = pj.mask(lambda y: y[:len(y)][range(len(y))], ["m"])   # refused: range(len(y))

  def outer(x):
    try:
      inner([jnp.ones(6, np.float32)], {"m": 4})
    except pj.ShapeError:
      pass
    assert builtins.len is not BUILTIN_LEN   # still the outer trace's
    return x.sum() / len(x)

  out = pj.mask(outer, ["n"])([np.arange(8, dtype=np.float32)], {"n": 5})
  np.testing.assert_allclose(out, 2.0)
  assert builtins.len is BUILTIN_LEN
  n, = export.symbolic_shape("n")
  assert n.__class__ is type(n) and not isinstance(n, int)
