"""The suite compiles every program at XLA's backend optimization level 0
(tests/conftest.py, which says why the checks keep their meaning there); users
compile at XLA's defaults. This file keeps the default compiler covered: a
sample of the suite runs in a fresh process at XLA's default options, where
LLVM's O3 code generator fuses a product and a sum into one multiply-add
(rounded once) and level 0 does not: rule-table rows in every mode (products,
reductions, transcendental functions, a scan, linear algebra, an FFT), a packed
model's training step, tests that compare polyjit's program with jax.jit's
bit for bit, and the tests marked `xla_defaults` (bits that depend on LLVM's
rounding, skipped at level 0).

It also checks that this session compiles at the level tests/conftest.py
chose (level 0, or XLA's default in the sample's process)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULTS = "POLYJIT_TEST_XLA_DEFAULTS"

SAMPLE = [
    *(f"tests/test_rules.py::test_rule[softmax-{mode}]"
      for mode in ("eager", "jit", "vmap", "grad", "jvp")),
    "tests/test_rules.py::test_rule[attention-jit]",
    "tests/test_rules.py::test_rule[gelu-jit]",
    "tests/test_rules.py::test_rule[scan_rnn-jit]",
    "tests/test_rules.py::test_rule[gram-jvp]",
    "tests/test_rules_linalg.py::test_rule[cho_solve-jit]",
    "tests/test_rules_fft.py::test_rule[rfft-jit]",
    # a packed model: embedding, per-token targets, a label, the mean loss and its gradient
    "tests/test_packing.py::test_training_step_with_tokens_targets_and_labels",
    # bit for bit against jax.jit
    "tests/test_size_set_uses.py::test_a_set_used_after_its_block_is_exact[auto-_finally]",
    "tests/test_debug_nans_masked_padding.py::test_pj_jit_runs_where_jax_jit_runs[log-nans]",
    "tests/test_rules_misc.py::test_dynamic_keys_need_no_counter_based_prng",
    "tests/test_inline_cpu_programs.py::"
    "test_small_programs_run_inline_and_give_the_default_clients_bits",
    "tests/test_default_xla_options.py::test_the_session_compiles_at_the_chosen_level",
]

#: The tests marked `xla_defaults` (tests/conftest.py): skipped at level 0, run here.
XLA_DEFAULTS = [
    "tests/test_converging_special_functions_padding.py::test_ragged_batch_and_gradient",
]


def _bits(f, options, *args):
  return np.asarray(jax.jit(f, compiler_options=options)(*args)).tobytes()


def test_the_session_compiles_at_the_chosen_level():
  """`a * b + c`: jax.jit with no options gives the bits of level 0 in the
  suite, and those of XLA's default level (3) in the sample's process."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  if (not os.environ.get(DEFAULTS) and "--xla_backend_optimization_level=0" not in flags
      and any("xla_backend_optimization_level" in f for f in flags)):
    pytest.skip("the user's XLA_FLAGS name another backend optimization level")
  rng = np.random.default_rng(0)
  a, b, c = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
  f = lambda a, b, c: a * b + c   # noqa: E731
  level_0 = _bits(f, {"xla_backend_optimization_level": 0}, a, b, c)
  level_3 = _bits(f, {"xla_backend_optimization_level": 3}, a, b, c)
  if level_0 == level_3:
    pytest.skip("this CPU's code is the same at both levels (no fused multiply-add)")
  assert _bits(f, None, a, b, c) == (level_3 if os.environ.get(DEFAULTS) else level_0)


def test_a_sample_is_exact_at_xla_default_options(request):
  """The sample, and every test marked `xla_defaults` (skipped at level 0)."""
  if os.environ.get(DEFAULTS):
    pytest.skip("this process is the sample's")
  marked = {item.nodeid for item in request.session.items
            if item.get_closest_marker("xla_defaults")}
  assert marked <= set(XLA_DEFAULTS), f"add {sorted(marked - set(XLA_DEFAULTS))} to XLA_DEFAULTS"
  sample = SAMPLE + XLA_DEFAULTS
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                   if "xla_backend_optimization_level" not in f)
  env = dict(os.environ, XLA_FLAGS=flags, **{DEFAULTS: "1"})
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
       *sample],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  tail = (result.stdout + result.stderr)[-6000:]
  assert result.returncode == 0, tail
  assert f"{len(sample)} passed" in result.stdout, tail   # none skipped, none deselected
