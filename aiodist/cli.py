"""The ``aiodist`` command: ``aiodist run``, ``aiodist store serve``, ``aiodist trace``, ``aiodist sim``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from .flight import add_cli as add_trace
    from .launcher import add_cli as add_run
    from .store.cli import add_cli as add_store

    parser = argparse.ArgumentParser(
        prog="aiodist",
        description="asyncio-native distributed runtime. `aiodist COMMAND --help` describes each command.",
        epilog="After `make`, the command is .venv/bin/aiodist (or `source .venv/bin/activate` first); "
               "`python -m aiodist` is the same.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_run(sub)
    add_store(sub)
    add_trace(sub)
    sub.add_parser("sim", help="the simulator: the same as python -m sim (e.g. aiodist sim run -n 4 prog.py; "
                               "aiodist sim --help)", add_help=False)
    return parser


def _sim(argv: Sequence[str]) -> int:
    from sim.cli import main as sim_main

    return int(sim_main(list(argv)) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":  # everything after it is the simulator's, --help included
        return _sim(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
