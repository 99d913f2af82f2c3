"""The ``aiodist`` command: ``aiodist run``, ``aiodist store serve``, ``aiodist trace``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from .flight import add_cli as add_trace
    from .launcher import add_cli as add_run
    from .store.cli import add_cli as add_store

    parser = argparse.ArgumentParser(prog="aiodist", description="asyncio-native distributed runtime")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_run(sub)
    add_store(sub)
    add_trace(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
