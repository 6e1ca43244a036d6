"""polyjit's traces follow JAX's configuration between calls, as jax.jit's do.

`jax.jit` keys its traces on the trace context (`jax_enable_x64`, dtype and
rank promotion, `jax_default_matmul_precision`, `jax_softmax_custom_jvp`,
...): a configuration changed between two calls of one jitted function traces
it again. polyjit keeps traces of its own (pj.jit's structures and plans,
pj.mask's traces, which pj.vmap's padded and packed paths trace through,
pj.vmap's plans) and keys them the same way. Each test calls one polyjit
function, changes the configuration (with a context manager and with
`jax.config.update`), calls it again and compares with `jax.jit` (answers,
dtypes, errors) or, where the configuration only shows in the trace, with a
polyjit function made under that configuration (its jaxpr). Every test puts
the configuration back, whatever happens (`configured`), so nothing leaks
into other tests.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj

X = np.linspace(0.5, 4.5, 5, dtype=np.float32)
PADDED = np.concatenate([X, [np.nan, np.inf, -np.inf]]).astype(np.float32)  # 8 long


@contextlib.contextmanager
def configured(name, value):
  """`jax.config.update(name, value)` within the block, the old value after."""
  old = getattr(jax.config, name)
  jax.config.update(name, value)
  try:
    yield
  finally:
    jax.config.update(name, old)


def x64(on, how):
  return jax.enable_x64(on) if how == "context manager" else configured("jax_enable_x64", on)


# --- the ways polyjit runs `f(x)`: each gives a thunk returning [f(X[:3]), f(X)] -----

def _jit(f):
  g = pj.jit(f)
  return lambda: [g(X[:3]), g(X)]


def _jit_explicit(f):
  g = pj.jit(f, polymorphic_shapes=["n"])
  return lambda: [g(X[:3]), g(X)]


def _mask(f):
  m = pj.mask(f, ["n"])
  return lambda: [m([PADDED], {"n": 3}), m([PADDED], {"n": 5})]


def _vmap(f, packing=None):
  g = pj.vmap(f)
  def run():
    out = g(pj.Ragged.from_list([X[:3], X], packing=packing))
    return [out[0], out[1]]
  return run


PATHS = {
    "pj.jit": _jit,
    "pj.jit explicit": _jit_explicit,
    "pj.mask": _mask,
    "pj.vmap padded": _vmap,
    "pj.vmap packed": lambda f: _vmap(f, pj.Packing(row_length=8)),
}


def assert_like_jax_jit(got, f):
  want = [jax.jit(f)(X[:3]), jax.jit(f)(X)]
  for g, w in zip(got, want, strict=True):
    assert jnp.result_type(g) == jnp.result_type(w), (jnp.result_type(g), jnp.result_type(w))
    assert np.shape(g) == np.shape(w)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def widened_sum(x):
  # float64 under x64, float32 without: only the configuration decides
  return jnp.sum(x.astype(float) * x.shape[0]) + jnp.sum(jnp.arange(x.shape[0]))


def broadcast_sum(x):
  # rank promotion of (n,) against (2, 1): refused under jax_numpy_rank_promotion='raise'
  return jnp.sum(x + jnp.ones((2, 1), x.dtype), axis=1)


@pytest.mark.parametrize("how", ["context manager", "config.update"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_x64_changed_between_calls(path, how):
  run = PATHS[path](widened_sum)
  for on in (False, True, False):   # off -> on, and on -> off
    with x64(on, how):
      assert_like_jax_jit(run(), widened_sum)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_x64_first_then_off(path):
  run = PATHS[path](widened_sum)
  for on in (True, False):
    with jax.enable_x64(on):
      assert_like_jax_jit(run(), widened_sum)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_rank_promotion_raise_changed_between_calls(path):
  run = PATHS[path](broadcast_sum)
  for mode in ("allow", "raise", "allow", "raise"):
    with jax.numpy_rank_promotion(mode):
      if mode == "allow":
        assert_like_jax_jit(run(), broadcast_sum)
        continue
      with pytest.raises(ValueError, match="rank_promotion"):
        jax.jit(broadcast_sum)(X)
      # (pj.mask and pj.vmap say where their trace failed: JAX's error in a MaskingError)
      with pytest.raises((ValueError, pj.MaskingError), match="rank_promotion"):
        run()


# --- configurations that show in the trace only ---------------------------------------

def softmax_first(w, x):
  return jax.nn.softmax(x * w)[0]


def self_product(w, x):
  return jnp.dot(x * w, x)


# (name, the value other than the test's default, a function whose trace shows it)
TRACE_ONLY = {
    "jax_softmax_custom_jvp": (True, softmax_first),
    "jax_default_matmul_precision": ("bfloat16", self_product),
}


def _vmap_jaxpr(packing):
  # the jaxpr of the gradient of the batch's total (the derivative shows
  # jax.nn.softmax's custom_jvp rule)
  def observe(g):
    batch = pj.Ragged.from_list([X[:3], X], packing=packing)
    return str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(g(w, batch))))(1.0))
  return lambda f: pj.vmap(f, in_axes=(None, 0)), observe


TRACED = {
    # (its program's text: a pj.jit trace is the masked call of a trace it keeps;
    # the precision is written into the program, softmax's custom_jvp is not)
    "pj.jit explicit": (lambda f: pj.jit(f, polymorphic_shapes=[None, "n"]),
                        lambda g: g.lower(np.float32(1.0), X).as_text()),
    "pj.mask": (lambda f: pj.mask(f, [None, "n"]),
                lambda g: str(g.trace([np.float32(1.0), PADDED]).jaxpr)),
    "pj.vmap padded": _vmap_jaxpr(None),
    "pj.vmap packed": _vmap_jaxpr(pj.Packing(row_length=8)),
}


@pytest.mark.parametrize("name, path", [(name, path) for name in sorted(TRACE_ONLY)
                                        for path in sorted(TRACED)
                                        if (name, path) != ("jax_softmax_custom_jvp",
                                                            "pj.jit explicit")])
def test_config_that_shows_in_the_trace_changed_between_calls(name, path):
  other, fun = TRACE_ONLY[name]
  make, observe = TRACED[path]
  default = getattr(jax.config, name)
  with configured(name, other):   # (the configuration changes jax.jit's trace)
    changed = str(jax.make_jaxpr(fun)(1.0, X))
  assert changed != str(jax.make_jaxpr(fun)(1.0, X))
  reused = make(lambda w, x: fun(w, x))
  seen = {}
  for value in (default, other):
    with configured(name, value):
      seen[value] = observe(reused)
      assert seen[value] == observe(make(lambda w, x: fun(w, x))), value  # made under it
  assert seen[default] != seen[other]
  assert observe(reused) == seen[default]   # back: the first trace again
