"""Diagnostics: stats match jax.monitoring, explanations name what varied."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polyjit as pj
from test_jit import default_compiles


def loglik(x, mu):
  return jnp.sum(-0.5 * (x - mu) ** 2)


def some_lengths(k, seed=0):
  return np.random.default_rng(seed).choice(np.arange(100, 9_901), k, replace=False)


def test_stats_count_what_jax_monitoring_counts():
  f = pj.jit(loglik)
  lengths = some_lengths(25)
  with pj.diagnostics.count_compiles() as compiles:
    for n in lengths:
      f(np.ones(n, np.float32), 0.5)
  s = pj.stats(f)
  assert s.compiles == len(compiles) > 0
  assert s.calls == 25 and sum(s.buckets.values()) == 24  # the first call is exact
  (bucket,), = s.buckets  # a cheap function: one headroom bucket serves them all
  # (of the argument elements: x and the scalar mu)
  assert s.padding_waste == pytest.approx(
      np.mean([1 - (n + 1) / (bucket[1] + 1) for n in lengths[1:]]))
  assert s.compile_seconds == pytest.approx(sum(c.seconds for c in compiles))
  assert s.fallback_calls == 0


def test_explain_names_argument_axis_sizes_and_buckets():
  f = pj.jit(loglik)
  lengths = some_lengths(30, seed=1)
  for n in lengths:
    f(np.ones(n, np.float32), 0.5)
  text = pj.explain(f)
  assert text.startswith("pj.jit(loglik): 30 calls")
  assert "first call, compiled for its exact shapes" in text
  first, second = lengths[:2]
  assert f"argument `x` axis 0 changed {first} -> {second}; now dynamic: x_0" in text
  # the default (cost-aware) policy: the second call compiles with headroom
  headroom = pj.buckets.CostAware().roomy(second, first)
  assert f"bucket x_0={headroom} for x_0={second}" in text
  assert "headroom 2x the largest size seen" in text
  # every size the axis took, the first call's included, written as numbers
  took = (f"argument `x` axis 0 took {len(set(lengths))} distinct sizes in "
          f"[{min(lengths)}, {max(lengths)}]: ")
  assert took + "the cost-aware buckets compiled" in text
  assert "fallback" not in text.splitlines()[0]  # nothing to explain without one
  fixed = pj.jit(loglik, buckets=pj.buckets.PowersOfTwo())
  for n in lengths:
    fixed(np.ones(n, np.float32), 0.5)
  text = pj.explain(fixed)
  assert f"bucket x_0={pj.buckets.PowersOfTwo()(second)} for x_0={second}" in text
  assert took + "powers of two need" in text and "would need" in text


def test_watch_and_explain_count_the_same_sizes_the_same_way(monkeypatch):
  monkeypatch.chdir(Path(__file__).resolve().parent.parent)
  lengths = some_lengths(12, seed=3)
  plain, bucketed = jax.jit(loglik), pj.jit(loglik)
  with pj.watch() as report:
    for n in lengths:
      plain(np.ones(n, np.float32), 0.5)
  for n in lengths:
    bucketed(np.ones(n, np.float32), 0.5)
  watched, explained = str(report), pj.explain(bucketed)
  advice = [line.strip() for line in watched.splitlines() if " distinct sizes in " in line]
  assert len(advice) == 1 and f"took {len(set(lengths))} distinct sizes" in advice[0]
  took = advice[0].split(": ")[0]
  assert took + ": " in explained  # the same sizes, counted the same way
  assert report["loglik"].pj_jit_compiles() == pj.stats(bucketed).compiles
  assert f"{pj.stats(bucketed).compiles} (the first call's shapes + " in watched
  assert "defined at tests/test_diagnostics.py:" in watched  # no absolute path


def test_explain_reports_a_fallback():
  def branchy(x):
    return x.sum() if int(x.shape[0]) % 2 else x.max()

  f = pj.jit(branchy)
  for n in (3, 4, 5):
    f(np.ones(n, np.float32))
  text = pj.explain(f)
  assert "cannot run with dynamic sizes" in text and "give polymorphic_shapes" in text
  assert (f"{pj.stats(f).fallback_calls} calls ran at exact shapes because the function "
          "could not be masked") in text.splitlines()[0]


def test_watch_sees_recompiles_of_plain_jax_jit(caplog):
  @jax.jit
  def loss(x, w):
    return jnp.sum(x @ w)

  lengths = some_lengths(12, seed=2)
  with caplog.at_level(logging.WARNING), pj.watch() as report:
    with pj.diagnostics.count_compiles() as compiles:
      for n in lengths:
        loss(np.ones((n, 3), np.float32), np.ones((3, 2), np.float32))
  f = report["loss"]
  assert f.compiles == len(compiles) == 12
  assert f.varying == {("x", 0): set(int(n) for n in lengths)}
  # what pj.jit's default would compile: the first call's shapes, then headroom buckets
  assert f.pj_jit_compiles() == default_compiles([int(n) for n in lengths])
  text = str(report)
  assert "loss" in text and "x axis 0 (12)" in text and "use pj.jit(loss)" in text
  assert report.as_dict()["loss"]["varying"] == {"x axis 0": sorted(int(n) for n in lengths)}
  assert not [r for r in caplog.records if "CACHE MISS" in r.getMessage()]


def test_assert_max_compiles_names_the_argument():
  scaled = jax.jit(lambda x, s: x * s)

  @pj.assert_max_compiles(2)
  def step(x, scale):
    return scaled(x, scale)

  step(np.ones(3), 2.0)
  step(np.ones(3), 2.0)
  step(np.ones(4), 2.0)
  with pytest.raises(pj.CompileLimitError,
                     match=r"argument `x` had the new shape \(5,\) \(before: \(3,\), \(4,\)\)"):
    step(np.ones(5), 2.0)


def test_the_budget_advice_fits_what_the_function_is():
  @pj.assert_max_compiles(2)
  @pj.jit
  def total(x):
    return jnp.sum(x)

  total(np.ones(5, np.float32))
  total(np.ones(9, np.float32))
  with pytest.raises(pj.CompileLimitError, match="already a pj.jit function") as e:
    total(np.ones(40, np.float32))
  assert "wrap" not in str(e.value) and "pj.explain" in str(e.value)

  plain = pj.assert_max_compiles(1)(jax.jit(jnp.sum))
  plain(np.ones(3))
  with pytest.raises(pj.CompileLimitError, match="use pj.jit in place of jax.jit"):
    plain(np.ones(4))


def test_no_compile_after_warm_up():
  f = pj.jit(loglik, polymorphic_shapes=["n", None])
  f(np.ones(100, np.float32), 0.5)
  with pj.assert_max_compiles(0):
    for n in (70, 90, 128):
      f(np.ones(n, np.float32), 0.5)  # same bucket: fine
  with pytest.raises(pj.CompileLimitError, match=r"1 compiles in a block limited to 0"):
    with pj.assert_max_compiles(0):
      f(np.ones(1000, np.float32), 0.5)


def test_shapecheck_passes_and_fails_at_decoration():
  def cat(x, y):
    return jnp.concatenate([x, y])

  assert pj.shapecheck(["n", "m"], "n + m")(cat) is cat
  assert pj.shapecheck([("(n, 3)", jnp.int32)], "(3, n)")(lambda x: x.T) is not None
  with pytest.raises(pj.ShapeError, match=r"has shape \(n \+ m,\) but out_shape declares "
                                          r"\(2\*n,\).*argument specs: \['n', 'm'\]"):
    pj.shapecheck(["n", "m"], "2*n")(cat)
  with pytest.raises(pj.ShapeError, match="every dim needs a name or a number"):
    pj.shapecheck(["(n, _)"], "n")(lambda x: x[:, 0])


def test_nothing_prints_unless_asked_and_a_fallback_warns_once():
  script = textwrap.dedent("""
      import numpy as np, polyjit as pj
      f = pj.jit(lambda x: x.sum() if int(x.shape[0]) % 2 else x.max(), fallback=FALLBACK)
      g = pj.jit(lambda x: x.sum() * 2)
      for n in (3, 4, 5, 6):
        f(np.ones(n, np.float32)); g(np.ones(n, np.float32))
  """)
  for fallback in ("silent", "warn"):
    run = subprocess.run([sys.executable, "-c", script.replace("FALLBACK", repr(fallback))],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    if fallback == "silent":
      assert run.stderr == ""
    else:  # once, attributed to the user's line, naming the cause and the fix
      assert run.stderr.count("FallbackWarning") == 1, run.stderr
      assert "<string>:6" in run.stderr and "int" in run.stderr and "fallback=" in run.stderr
