"""The ``aiodist`` command: ``aiodist run``, ``aiodist store serve``, ``aiodist trace``, ``aiodist sim``."""

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
    sim_parser = sub.add_parser("sim", help="the simulator: same as python -m sim (e.g. aiodist sim run -n 8 prog.py)",
                                add_help=False)
    sim_parser.add_argument("argv", nargs=argparse.REMAINDER)
    sim_parser.set_defaults(func=_sim)
    return parser


def _sim(args: argparse.Namespace) -> int:
    from sim.cli import main as sim_main

    return int(sim_main(args.argv) or 0)


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
