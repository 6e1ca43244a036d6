"""Command line: `python -m polyjit demo` and `python -m polyjit bench`."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  command = argv.pop(0) if argv else "demo"
  if command == "demo":
    from . import _demo
    _demo.main(argv)
    return 0
  if command == "bench":
    from . import _bench
    return _bench.main(argv)
  print("usage: python -m polyjit [demo|bench] [options]", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
