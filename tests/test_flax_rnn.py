"""Flax's own recurrent modules over a variable-length axis (issue 33 §1).

`nn.RNN`, `nn.scan` and `nn.Bidirectional` collect their scan lengths with
`set(jax.tree_util.tree_leaves(lengths))` (flax/core/lift.py): a set *built*
from sizes, which needs no size's value (`_jax.decisions.SIZE_HASH`). Each
model runs exactly under `pj.vmap` over a NaN-padded `pj.Ragged` (against
`model.apply` on each unpadded example), under `jax.jit(pj.mask)` with a
traced length, and under `pj.jit` in both modes, compiling once per bucket
(counted with jax.monitoring). A lookup of a size by value (`n in {1, 2}`),
and a set of sizes that meets other values (`{n, 5}`, `5 in sizes`, a set
passed on), stay exact at concrete sizes and refused when sizes are traced.
Skipped without Flax."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from harness import assert_pj_jit_matches_jax_jit, nan_padded, reference_options
from test_jit import default_compiles as expected_compiles

nn = pytest.importorskip("flax.linen")

D, H = 4, 6
LENGTHS = (5, 9, 3, 17, 12)
PADDED = 17


def sequence(n, seed=0):
  return np.random.default_rng(100 * n + seed).standard_normal((n, D)).astype(np.float32)


MODELS = {
    "lstm": lambda: nn.RNN(nn.LSTMCell(H)),
    "optimized_lstm": lambda: nn.RNN(nn.OptimizedLSTMCell(H)),
    "bidirectional": lambda: nn.Bidirectional(nn.RNN(nn.LSTMCell(H)), nn.RNN(nn.GRUCell(H))),
    "reverse_gru": lambda: nn.RNN(nn.GRUCell(H), reverse=True, keep_order=True),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
  """A model and its parameters, built once per module (no test changes them)."""
  m = MODELS[request.param]()
  return m, m.init(jax.random.key(0), jnp.ones((3, D)))


TRACED = (1, 4, PADDED)   # the lengths of test_rnn_under_jit_of_mask_with_a_traced_length


@pytest.fixture(scope="module")
def references(model):
  """Every test's unpadded references for this model, each sequence alone at
  its own length, in one `jax.jit` program (compiled with the references'
  options, tests/harness.py): the outputs of test_rnn_under_pj_vmap_is_exact
  and test_rnn_under_jit_of_mask_with_a_traced_length, the gradients of
  test_rnn_gradient_under_pj_vmap_is_exact, the losses of both modes of
  test_rnn_under_pj_jit_compiles_once_per_bucket. (Eagerly, or a `jax.jit` per
  length and test, each length's scans were compiled once per test.)"""
  m, params = model
  grad = jax.grad(lambda p, x: loss(m.apply, p, x))

  def run(p, outputs, gradients, traced, losses):
    return {"outputs": [m.apply(p, x) for x in outputs],
            "gradients": [grad(p, x) for x in gradients],
            "traced": [m.apply(p, x) for x in traced],
            "losses": [loss(m.apply, p, x) for x in losses]}
  return jax.jit(run, compiler_options=reference_options())(
      params, [sequence(n) for n in LENGTHS], [sequence(n, 1) for n in LENGTHS],
      [sequence(n, 2) for n in TRACED], [sequence(n, 3) for n in LENGTHS])


def loss(apply, params, x):
  return jnp.sum(jnp.tanh(apply(params, x)) ** 2)


def ragged(xs):
  """A pj.Ragged whose padding holds NaN (it must not matter)."""
  data = np.stack([nan_padded(x, PADDED) for x in xs])
  return pj.Ragged(data, np.array([len(x) for x in xs], np.int32))


def test_rnn_under_pj_vmap_is_exact(model, references):
  m, params = model
  xs = [sequence(n) for n in LENGTHS]
  outs = pj.vmap(m.apply, in_axes=(None, 0))(params, ragged(xs)).to_list()
  for out, ref in zip(outs, references["outputs"], strict=True):
    ref = np.asarray(ref)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_rnn_gradient_under_pj_vmap_is_exact(model, references):
  m, params = model
  xs = [sequence(n, 1) for n in LENGTHS]
  grad = jax.jit(jax.grad(lambda p, r: jnp.sum(pj.vmap(lambda p, x: loss(m.apply, p, x), in_axes=(None, 0))(p, r))))
  got = grad(params, ragged(xs))
  # the unpadded reference: each length's jitted gradient (eager JAX
  # differentiated the scans op by op at each length, most of the time here)
  want = jax.tree.map(lambda *g: sum(g), *references["gradients"])
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert np.isfinite(np.asarray(a)).all()
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_rnn_under_jit_of_mask_with_a_traced_length(model, references):
  m, params = model
  f = jax.jit(lambda p, xp, n: pj.mask(m.apply, [None, "(n, _)"])([p, xp], {"n": n}))
  for n, ref in zip(TRACED, references["traced"], strict=True):
    x = sequence(n, 2)
    out = np.asarray(f(params, nan_padded(x, PADDED), n))[:n]
    np.testing.assert_allclose(out, np.asarray(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_rnn_under_pj_jit_compiles_once_per_bucket(model, references, mode):
  m, params = model
  fun = lambda p, x: loss(m.apply, p, x)
  shapes = None if mode == "auto" else [None, "(n, _)"]
  f = pj.jit(fun, polymorphic_shapes=shapes, fallback="error")
  refs = references["losses"]
  with warnings.catch_warnings():
    warnings.simplefilter("error", pj.FallbackWarning)
    with pj.diagnostics.count_compiles() as compiles:
      outs = [f(params, sequence(n, 3)) for n in LENGTHS]
  for out, ref in zip(outs, refs, strict=True):
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-5)
  if mode == "auto":
    assert len(compiles) == expected_compiles(LENGTHS)
  else:
    assert len(compiles) < len(set(LENGTHS))


# --- hashing sizes: building a set of them, looking one up --------------------------

def _set_of_sizes(x, y):
  return jnp.sum(x) * len({x.shape[0], y.shape[0]}) + len(set([x.shape[0], x.shape[0]]))


def test_a_set_of_sizes_deduplicates_as_the_sizes_compare():
  f = pj.jit(_set_of_sizes, fallback="error")
  for a, b in ((3, 3), (3, 4), (6, 6), (7, 2)):
    x, y = np.ones(a, np.float32), np.ones(b, np.float32)
    assert float(f(x, y)) == float(_set_of_sizes(x, y))
  g = jax.jit(lambda xp, yp, n, m: pj.mask(_set_of_sizes, ["n", "m"])([xp, yp], {"n": n, "m": m}))
  for a, b in ((3, 3), (3, 4)):
    x, y = np.ones(a, np.float32), np.ones(b, np.float32)
    out = g(nan_padded(x, 8), nan_padded(y, 8), a, b)
    assert float(out) == float(_set_of_sizes(x, y))


def test_a_lookup_by_value_stays_exact_or_refused():
  fun = lambda x: jnp.sum(x) + (7.0 if x.shape[0] in {1, 2} else 1.0) + {1: 3.0}.get(x.shape[0], 0.0)
  f = pj.jit(fun, polymorphic_shapes=["n"])
  for n in (1, 2, 3, 5):
    x = np.ones(n, np.float32)
    assert float(f(x)) == float(fun(x))
  with pytest.raises(pj.MaskingError, match="dictionary key or set member"):
    jax.jit(lambda xp, n: pj.mask(fun, ["n"])([xp], {"n": n}))(np.ones(4, np.float32), 2)


def _mixed_display(x):
  return jnp.sum(x) * len({x.shape[0], 5})


def _probed_later(x):
  sizes = {x.shape[0]}
  return jnp.sum(x) * (5 in sizes)


def _mixed_call(x):
  sizes = set([x.shape[0], 4])
  return jnp.sum(x) * len(sizes)


def _comprehension(x):
  return jnp.sum(x) * len({d for d in (x.shape[0], 5)})


def _escaping(x):
  sizes = set(jax.tree_util.tree_leaves([x.shape[0]]))
  return jnp.sum(x) * _contains_five(sizes)


def _contains_five(s):
  return 5 in s


def _proven(x):
  sizes = set(jax.tree_util.tree_leaves([x.shape[0], x.shape[0]]))
  (only,) = sizes
  return jnp.sum(x) * len(sizes) * only


SETS_WITH_VALUES = [_mixed_display, _probed_later, _mixed_call, _comprehension, _escaping]


@pytest.mark.parametrize("fun", SETS_WITH_VALUES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["auto", "explicit"])
def test_a_set_that_meets_other_values_is_exact(fun, mode):
  # A size sharing one hash would miss the int 5 (or 4): the set would keep
  # two members, or `5 in s` answer False, at exactly the size that equals it.
  assert_pj_jit_matches_jax_jit(fun, mode, (5, 4, 6, 5))


@pytest.mark.parametrize("fun", SETS_WITH_VALUES, ids=lambda f: f.__name__)
def test_a_set_that_meets_other_values_is_refused_with_traced_sizes(fun):
  g = jax.jit(lambda xp, n: pj.mask(fun, ["n"])([xp], {"n": n}))
  with pytest.raises(pj.MaskingError, match="dictionary key or set member"):
    g(np.ones(8, np.float32), 5)


def test_a_set_of_sizes_alone_counted_and_unpacked_needs_no_value():
  f = pj.jit(_proven, polymorphic_shapes=["n"], fallback="error")
  xs = [np.ones(n, np.float32) for n in (3, 5, 7)]
  want = [float(_proven(x)) for x in xs]
  with pj.diagnostics.count_compiles() as compiles:
    got = [float(f(x)) for x in xs]
  assert got == want
  assert len(compiles) == 1   # (one bucket: no size's value was taken)
  g = jax.jit(lambda xp, n: pj.mask(_proven, ["n"])([xp], {"n": n}))
  for n in (5, 6):
    assert float(g(nan_padded(np.ones(n, np.float32), 8), n)) == float(_proven(np.ones(n)))


def test_a_size_looked_up_in_a_set_of_itself_is_exact():
  fun = lambda x: jnp.sum(x) * (x.shape[0] in {x.shape[0]})
  f = pj.jit(fun, polymorphic_shapes=["n"], fallback="error")
  for n in (3, 4):
    assert float(f(np.ones(n, np.float32))) == float(fun(np.ones(n, np.float32)))
