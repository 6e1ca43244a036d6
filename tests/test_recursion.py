"""Recursion on sizes finishes, exact or refused (issue 31).

`rec` splits its argument in halves and recurses on both: every level
doubles the size expressions (`n - floordiv(n, 2)`, then that minus its own
half, ...). `pj.jit(rec, polymorphic_shapes=["n"])` at 8 elements ran for over
120 s: the gather rule asked JAX's decision procedure whether those
expressions are monotone, in time exponential in their nesting. Monotonicity
of `e - floordiv(e, c)` is now decided structurally (`_masking/dims.py`), and a
comparison too large for the procedure is refused with a MaskingError that
says what to do (`_jax/decisions.py`). Each mode runs in a subprocess under a
timeout, so a hang fails the test instead of stalling the suite.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 240

WORKER = textwrap.dedent('''
    import json, sys, warnings
    import jax, jax.numpy as jnp, numpy as np
    import polyjit as pj

    def rec(x):
      if x.shape[0] <= 1:
        return x.sum()
      h = x.shape[0] // 2
      return rec(x[:h]) + 2 * rec(x[h:])

    def example(n):
      return (np.arange(n, dtype=np.float32) % 3 + 1.0)

    def padded(x, size):
      out = np.full(size, np.nan, np.float32)
      out[:x.shape[0]] = x
      return out

    def explicit(n):
      return pj.jit(rec, polymorphic_shapes=["n"])(example(n))

    def automatic(n):
      f = pj.jit(rec)
      for m in (n - 2, n - 1):
        f(example(m))
      return f(example(n))

    def mask_concrete(n):
      return pj.mask(rec, ["n"])([padded(example(n), 8)], {"n": n})

    def mask_traced(n):
      masked = pj.mask(rec, ["n"])
      return jax.jit(lambda a, k: masked([a], {"n": k}))(padded(example(n), 8), n)

    def ragged(n):
      out = pj.vmap(rec)(pj.Ragged.from_list([example(n), example(2)]))
      return np.asarray(out)[0]

    mode, n = sys.argv[1], int(sys.argv[2])
    warnings.simplefilter("ignore")
    want = float(jax.jit(rec)(example(n)))
    try:
      got = float(globals()[mode](n))
      print(json.dumps({"got": got, "want": want}))
    except pj.PolyjitError as e:
      print(json.dumps({"refused": type(e).__name__, "message": str(e), "want": want}))
''')


def run(mode, n):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  try:
    proc = subprocess.run([sys.executable, "-c", WORKER, mode, str(n)], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
  except subprocess.TimeoutExpired:
    pytest.fail(f"{mode} at n = {n} still ran after {TIMEOUT_S} s")
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n", [5, 8])
def test_explicit_specs_are_exact(n):
  out = run("explicit", n)
  assert out.get("got") == out["want"], out


def test_deep_recursion_is_refused_with_advice():
  out = run("explicit", 1000)
  assert out.get("refused") == "MaskingError", out
  assert "polyjit stops" in out["message"] and "What to do" in out["message"]


@pytest.mark.parametrize("mode", ["automatic", "mask_concrete", "mask_traced", "ragged"])
def test_other_modes_finish_exact_or_refused(mode):
  out = run(mode, 5)
  assert out.get("got") == out["want"] or out.get("refused"), out
  if mode in ("automatic", "mask_concrete"):
    assert out.get("got") == out["want"], out


def test_automatic_jit_falls_back_to_exact_shapes_when_deep():
  out = run("automatic", 200)
  assert out.get("got") == out["want"], out
