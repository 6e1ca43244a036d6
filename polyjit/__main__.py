"""Command line: `python -m polyjit demo`, `python -m polyjit bench`.

With no subcommand, or with `--help`, it prints what each subcommand does.
"""

from __future__ import annotations

import sys
from typing import Sequence

from ._cli import bench as _bench, demo as _demo

COMMANDS = {
    "demo": "jax.jit and polyjit side by side on the seed workload and on ragged RNN "
            "training; prints a table and writes polyjit-demo.png (needs the [demo] extra)",
    "bench": "the benchmark suite against the peers (torch.compile, tf.function when "
             "installed); --quick for a few minutes; bench --help for its options",
}


def usage() -> str:
  lines = ["usage: python -m polyjit <command> [options]", "", "commands:"]
  lines += [f"  {name:<6} {text}" for name, text in COMMANDS.items()]
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  command = argv.pop(0) if argv else None
  if command in (None, "-h", "--help", "help"):
    print(usage())
    return 0
  if command == "demo":
    _demo.main(argv)
    return 0
  if command == "bench":
    return _bench.main(argv)
  print(f"unknown command {command!r}\n{usage()}", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
