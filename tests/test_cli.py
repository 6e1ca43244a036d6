"""`python -m polyjit`: with no subcommand or --help it lists the subcommands."""

from polyjit.__main__ import COMMANDS, main


def test_no_subcommand_prints_help_instead_of_running_the_demo(capsys):
  for argv in ([], ["--help"]):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m polyjit") and all(c in out for c in COMMANDS)


def test_an_unknown_subcommand_fails_with_the_usage(capsys):
  assert main(["nope"]) == 2
  assert "unknown command 'nope'" in capsys.readouterr().err
