"""The checking mode (`pj.verify()`, `_masking/verify.py`): a wrong factor of 2
never passes, whatever the values' magnitude and dtype; it checks `pj.jit`,
`pj.mask` with concrete sizes and `pj.vmap` over `pj.Ragged`; and it is per
thread, as `jax.debug_nans` is (issues 31 and 34).

Its tolerance was `eps * 1e3 * max(|want|, 1)`: an absolute floor of 1, under
which `v.sum() * 2` passed for values near 1e-4 in float32 and below about 1
in float16.
"""
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from polyjit._masking import verify as _verify


def sneaky(v):
  # `type(n) is int` of a size: no hook sees it (`isinstance` is answered as
  # jax.jit's Python int answers it), so every trace takes the `2.` side
  return v.sum() * (1.0 if type(v.shape[0]) is int else 2.0)


def honest(v):
  return jnp.sum(jnp.cumsum(v) * v) - jnp.mean(v)


CASES = [(np.float32, 1e-4), (np.float32, 3e-6), (np.float32, 1.0), (np.float16, 0.5),
         (np.float16, 0.01), (jnp.bfloat16, 0.3)]


def example(n, dtype, scale):
  return (np.linspace(1.0, 2.0, n) * scale).astype(dtype)


def nan_padded(x, size=8):
  out = np.full(size, np.nan, x.dtype)
  out[: x.shape[0]] = x
  return out


def run_jit(f, x):
  return pj.jit(f, polymorphic_shapes=["n"])(x)


def run_jit_auto(f, x):
  g = pj.jit(f)
  for n in (x.shape[0] - 2, x.shape[0] - 1):
    g(x[:n])   # the axis becomes dynamic
  return g(x)


def run_mask(f, x):
  return pj.mask(f, ["n"])([nan_padded(x)], {"n": x.shape[0]})


def run_vmap(f, x):
  return pj.vmap(f)(pj.Ragged.from_list([x, x[:3]]))


RUNS = [run_jit, run_jit_auto, run_mask, run_vmap]
ids = lambda c: f"{np.dtype(c[0]).name}-{c[1]}" if isinstance(c, tuple) else c.__name__


@pytest.mark.parametrize("run", RUNS, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_a_factor_of_two_never_passes(case, run):
  x = example(5, *case)
  with pj.verify():
    with pytest.raises(pj.VerificationError, match="differs"):
      run(sneaky, x)


@pytest.mark.parametrize("run", RUNS, ids=ids)
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_right_results_pass(case, run):
  for n in (5, 7):
    with pj.verify():
      run(honest, example(n, *case))


def test_long_float16_sums_pass_and_doubling_does_not():
  x = np.random.default_rng(0).uniform(0.0, 1.0, 3000).astype(np.float16)
  with pj.verify():
    pj.jit(jnp.sum, polymorphic_shapes=["n"])(x)
    with pytest.raises(pj.VerificationError):
      pj.jit(sneaky, polymorphic_shapes=["n"])(x)


def test_the_switch_and_the_block_are_per_thread():
  seen = {}

  def other():
    seen["other"] = _verify.enabled()

  assert not _verify.enabled()
  with pj.verify():
    assert _verify.enabled()
    t = threading.Thread(target=other)
    t.start()
    t.join()
    with pj.verify(False):
      assert not _verify.enabled()
    assert _verify.enabled()
  assert seen == {"other": False}
  assert not _verify.enabled()

  def switch_in_a_thread():
    pj.verify()   # a switch: this thread only
    seen["thread"] = _verify.enabled()

  t = threading.Thread(target=switch_in_a_thread)
  t.start()
  t.join()
  assert seen["thread"] and not _verify.enabled()


def test_a_thread_checks_while_another_does_not():
  """Two threads call the same sneaky function: the one in the block raises,
  the other gets polyjit's (unchecked) value."""
  x = example(5, np.float32, 1.0)
  errors, values = [], []
  go = threading.Barrier(2)

  def checked():
    with pj.verify():
      go.wait()
      try:
        run_mask(sneaky, x)
      except pj.VerificationError as e:
        errors.append(e)

  def unchecked():
    go.wait()
    values.append(run_mask(sneaky, x))

  threads = [threading.Thread(target=checked), threading.Thread(target=unchecked)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(errors) == 1 and len(values) == 1
