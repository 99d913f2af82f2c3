"""The ``run`` subcommand: ``aiodist run -n N [options] (prog.py | -m module) [args...]``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from ..auth import SecretFileError
from ..errors import LaunchError
from .program import ProgramKind, classify_source
from .security import add_security_options, job_environment
from .supervisor import LaunchConfig, launch

__all__ = ["add_cli", "configure_parser", "build_command", "run_command", "main"]

_DESCRIPTION = """\
Run a program as N ranks on this node (like torchrun --nproc-per-node N).
Each rank gets RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT/MAX_RESTARTS/RUN_ID and
AIODIST_RESTART_COUNT/MAX_RESTARTS/RUN_ID; its output lines are prefixed with
[rankN]. When a rank fails the others are stopped and the launcher exits
non-zero naming it. A program without an `if __name__ == "__main__":` guard
that defines a top-level `main` (e.g. `async def main()`) is imported and its
main() is run."""


def _nnodes_arg(raw: str) -> int | tuple[int, int]:
    """``N`` -> N; ``MIN:MAX`` -> (MIN, MAX) (elastic)."""
    from .elastic import parse_nnodes

    try:
        lo, hi = parse_nnodes(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return (lo, hi) if ":" in str(raw) else lo


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``run`` to ``parser``."""
    parser.add_argument("-n", "--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int, default=1,
                        metavar="N", help="ranks to start on this node (default: 1)")
    parser.add_argument("--nnodes", type=_nnodes_arg, default=1, metavar="N|MIN:MAX",
                        help="number of nodes (default: 1); MIN:MAX: elastic, the nodes meet in rounds at "
                             "--master-addr:--master-port (see aiodist.launch.elastic)")
    parser.add_argument("--rdzv-last-call", dest="rdzv_last_call", type=float, default=1.0, metavar="SECONDS",
                        help="elastic: seconds more nodes may join once MIN are there (default: 1)")
    parser.add_argument("--rdzv-timeout", dest="rdzv_timeout", type=float, default=300.0, metavar="SECONDS",
                        help="elastic: seconds to wait for a complete round (default: 300)")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                        help="this node's rank among the nodes (default: 0)")
    parser.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1",
                        help="address of rank 0's node (default: 127.0.0.1)")
    parser.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None,
                        help="port of the rendezvous store (default: a free port, new for every attempt; "
                             "required with --nnodes > 1)")
    parser.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0,
                        help="restart the whole job up to this many times after a failure (default: 0)")
    parser.add_argument("--run-id", "--run_id", dest="run_id", default="none",
                        help="job id given to the ranks as TORCHELASTIC_RUN_ID / AIODIST_RUN_ID (default: none)")
    parser.add_argument("--grace-period", dest="grace_period", type=float, default=5.0, metavar="SECONDS",
                        help="seconds between SIGTERM and SIGKILL when stopping ranks (default: 5)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop the job and exit 124 if it runs longer than this (default: no limit)")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false",
                        help="do not prefix output lines with the rank (ranks share the launcher's stdout/stderr)")
    add_security_options(parser)
    parser.add_argument("-m", "--module", action="store_true",
                        help="treat the program as a module name, as with `python -m`")
    parser.add_argument("program", help="the program file (or module name with -m)")
    parser.add_argument("program_args", nargs=argparse.REMAINDER, help="arguments for the program")


def add_cli(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand to an ``argparse`` subparsers object.

    The parsed namespace gets ``func=run_command``; call ``args.func(args)``
    and exit with the integer it returns.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run a program as N ranks (like torchrun)", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure_parser(parser)
    parser.set_defaults(func=run_command)
    return parser


def build_command(program: str, args: Sequence[str], *, module: bool = False, python: str | None = None) -> list[str]:
    """The argv that starts one rank of ``program`` (rule: :mod:`aiodist.launch.program`)."""
    exe = python or sys.executable
    if module:  # the bootstrap decides in the child, where the module's sys.path is right
        return [exe, "-m", "aiodist.launch_bootstrap", "-m", program, *args]
    try:
        with open(program, "rb") as f:
            source = f.read()
    except OSError:
        return [exe, program, *args]  # python reports the missing file in each rank
    if classify_source(source, filename=program) is ProgramKind.MAIN_FUNCTION:
        return [exe, "-m", "aiodist.launch_bootstrap", program, *args]
    return [exe, program, *args]


def run_command(args: argparse.Namespace) -> int:
    """Run the job that ``args`` (parsed by :func:`configure_parser`) describes; return the exit code."""
    from .elastic import launch_elastic, parse_nnodes

    try:
        min_nodes, max_nodes = parse_nnodes(args.nnodes) if isinstance(args.nnodes, str) else (
            args.nnodes if isinstance(args.nnodes, tuple) else (args.nnodes, args.nnodes))
        elastic = min_nodes != max_nodes
        env = job_environment(os.environ, secret_file=args.secret_file, insecure=args.insecure,
                              store_limits=args.store_limits, single_node=not elastic and min_nodes == 1)
        config = LaunchConfig(
            command=build_command(args.program, args.program_args, module=args.module),
            nproc_per_node=args.nproc_per_node,
            nnodes=1 if elastic else min_nodes,
            node_rank=0 if elastic else args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
            max_restarts=args.max_restarts,
            run_id=args.run_id,
            grace_period=args.grace_period,
            timeout=args.timeout,
            prefix_output=args.prefix,
            env=env,
        )
    except (ValueError, SecretFileError) as exc:
        print(f"aiodist run: error: {exc}", file=sys.stderr)
        return 2
    try:
        if elastic:
            result = asyncio.run(launch_elastic(config, min_nodes=min_nodes, max_nodes=max_nodes,
                                                last_call=args.rdzv_last_call, rdzv_timeout=args.rdzv_timeout))
        else:
            result = asyncio.run(launch(config))
    except LaunchError as exc:
        print(f"aiodist run: error: {exc}", file=sys.stderr)
        return 1
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m aiodist.launcher [run] [options] prog.py [args...]``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="aiodist")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_cli(subparsers)
    if not argv or argv[0] not in ("run", "-h", "--help"):
        argv = ["run", *argv]
    args = parser.parse_args(argv)
    return int(args.func(args))
