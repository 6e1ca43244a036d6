"""`python -m polyjit`: with no subcommand or --help it lists the subcommands."""

import numpy as np
import pytest

from polyjit._cli import demo as _demo
from polyjit.__main__ import COMMANDS, main


def test_no_subcommand_prints_help_instead_of_running_the_demo(capsys):
  for argv in ([], ["--help"]):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m polyjit") and all(c in out for c in COMMANDS)


def test_an_unknown_subcommand_fails_with_the_usage(capsys):
  assert main(["nope"]) == 2
  assert "unknown command 'nope'" in capsys.readouterr().err


def test_the_demo_plot_starts_its_axes_at_zero_and_writes_the_speedup():
  plt = pytest.importorskip("matplotlib.pyplot")
  results = {name: {"jax.jit": (np.array([2.0, 4.0, 6.0]), [0] * 3),
                    "polyjit": (np.array([1.5, 1.8, 2.0]), [0]), "polyjit_name": "pj.jit"}
             for name in ("seed log-likelihood", "ragged RNN gradients")}
  fig = _demo.figure(results, plt)
  try:
    for ax in fig.axes:
      assert ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0
      assert [t.get_text() for t in ax.texts] == ["pj.jit: 3.0x faster than jax.jit"]
  finally:
    plt.close(fig)


def test_the_demo_says_which_programs_were_loaded_from_disk_not_compiled():
  from polyjit._caching.compiles import CompileEvent, CompileLog
  loaded = CompileLog()
  loaded.append(CompileEvent("jit_f", 0.0, 0.0))
  loaded.cache_loads += [CompileEvent("jit_f", 0.0, 0.0)] * 2
  results = {"seed log-likelihood": {
      "calls": 3, "shapes": 3, "max_diff": 0.0, "polyjit_name": "pj.jit",
      "jax.jit": (np.array([2.0, 4.0, 6.0]), CompileLog()), "polyjit": (np.array([1.0, 1.1, 1.2]), loaded)}}
  text = _demo.table(results)
  row = text.splitlines()[3].split()
  assert row[:6] == ["pj.jit", "3", "3", "1", "2", "0.00"], row
  assert "2 program(s) loaded from disk" in text
