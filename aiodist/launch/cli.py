"""The ``run`` subcommand: ``aiodist run -n N [options] (prog.py | -m module) [args...]``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from ..errors import LaunchError
from .conventions import DEFAULT_NPROC
from .security import add_security_options, job_environment
from .supervisor import LaunchConfig, launch

__all__ = ["add_cli", "configure_parser", "build_command", "ranked_by_rendezvous", "resolve_options", "run_command",
           "main"]

_DESCRIPTION = f"""\
Run a program as N ranks on this node (like torchrun --nproc-per-node N; N
defaults to {DEFAULT_NPROC}).
Each rank gets RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT/MAX_RESTARTS/RUN_ID and
AIODIST_RESTART_COUNT/MAX_RESTARTS/RUN_ID; its output lines are prefixed with
[rankN]: (torchrun's format).

When a rank fails, the launcher names the rank whose own error started it
(an exception, a signal, or a clean exit while the others still needed it),
not merely the first to exit, and by default stops the others (see
--on-failure). A program without an `if __name__ == "__main__":` guard that
defines a top-level `main` (e.g. `async def main()`) is imported and its main()
is run; when it returns, the rank's process groups are destroyed in order and
operations never awaited are an error.

torchrun's flags are accepted: --standalone, --nproc-per-node, --nnodes,
--node-rank, --master-addr/--master-port, --rdzv-backend/--rdzv-endpoint/
--rdzv-id/--rdzv-conf, --max-restarts (with dashes or underscores). With
--rdzv-backend c10d, --nnodes N > 1 and no --node-rank, the nodes get their
ranks in a rendezvous at --rdzv-endpoint (or --master-addr:--master-port), in
the order they join, as with torchrun's c10d rendezvous."""

_ON_FAILURE = ("stop", "restart", "continue")
DEFAULT_RDZV_PORT = 29400
"""The port of ``--rdzv-endpoint HOST`` (torchrun's)."""


def _nnodes_arg(raw: str) -> int | tuple[int, int]:
    """``N`` -> N; ``MIN:MAX`` -> (MIN, MAX) (elastic)."""
    from .elastic import parse_nnodes

    try:
        lo, hi = parse_nnodes(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return (lo, hi) if ":" in str(raw) else lo


def _nproc_arg(raw: str) -> int:
    """``N``, or torchrun's ``auto``/``cpu`` (this node's CPU count)."""
    if raw in ("auto", "cpu"):
        return os.cpu_count() or 1
    if raw == "gpu":
        raise argparse.ArgumentTypeError("--nproc-per-node gpu: aiodist runs on CPUs (use a number, auto or cpu)")
    try:
        n = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nproc-per-node must be a number, auto or cpu, not {raw!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--nproc-per-node must be >= 1, got {n}")
    return n


def _rdzv_conf_arg(raw: str) -> dict[str, str]:
    """torchrun's ``key=value,key=value``."""
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--rdzv-conf takes key=value pairs separated by commas, got {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def _flags(name: str) -> list[str]:
    """``--nproc-per-node`` and torchrun's ``--nproc_per_node``."""
    underscored = "--" + name[2:].replace("-", "_")
    return [name, underscored] if underscored != name else [name]


_IGNORED_TORCHRUN = {
    "--tee": "every rank's output reaches the launcher's stdout/stderr, each line prefixed with its rank",
    "--redirects": "every rank's output reaches the launcher's stdout/stderr, each line prefixed with its rank",
    "--log-dir": "no per-rank log files; the launcher's output has every rank's lines, prefixed",
    "--local-ranks-filter": "every rank's output is shown",
    "--monitor-interval": "the launcher sees a rank's end at once",
    "--start-method": "ranks are always new processes (spawn)",
    "--local-addr": "the ranks reach each other at the addresses they publish",
}
"""torchrun's options that change nothing aiodist run needs (accepted so that torchrun command lines work)."""


def _ignored_dest(name: str) -> str:
    return "ignored_" + name[2:].replace("-", "_")


def ignored_options(args: argparse.Namespace) -> list[str]:
    """The torchrun options of ``args`` that aiodist ignores, as given (for a warning)."""
    given = [f"{n} {getattr(args, _ignored_dest(n))}" for n in _IGNORED_TORCHRUN if getattr(args, _ignored_dest(n), None)]
    if getattr(args, "ignored_run_path", False):
        given.append("--run-path")
    return given


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``run`` to ``parser``."""
    parser.add_argument("-n", *_flags("--nproc-per-node"), dest="nproc_per_node", type=_nproc_arg,
                        default=DEFAULT_NPROC, metavar="N",
                        help=f"ranks to start on this node: a number, or auto/cpu for one per CPU "
                             f"(default: {DEFAULT_NPROC})")
    parser.add_argument("--nnodes", type=_nnodes_arg, default=1, metavar="N|MIN:MAX",
                        help="number of nodes (default: 1); MIN:MAX: elastic, the nodes meet in rounds at "
                             "--master-addr:--master-port (see aiodist.launch.elastic)")
    parser.add_argument(*_flags("--node-rank"), dest="node_rank", type=int, default=None,
                        help="this node's rank among the nodes (default: 0; with --rdzv-backend c10d or --nnodes "
                             "MIN:MAX and several nodes, the order in which the nodes join the rendezvous at "
                             "--master-addr:--master-port, as with torchrun's c10d rendezvous)")
    parser.add_argument(*_flags("--master-addr"), dest="master_addr", default=None, metavar="HOST",
                        help="address of rank 0's node, where the rendezvous store runs (default: 127.0.0.1)")
    parser.add_argument(*_flags("--master-port"), dest="master_port", type=int, default=None, metavar="PORT",
                        help="port of the rendezvous store (default: a free port, new for every attempt; "
                             "required with --nnodes > 1)")
    parser.add_argument("--standalone", action="store_true",
                        help="torchrun's single-node mode: the store on this host at a free port "
                             "(what aiodist does anyway with --nnodes 1)")
    parser.add_argument(*_flags("--rdzv-backend"), dest="rdzv_backend", default=None, metavar="NAME",
                        help="torchrun's rendezvous backend: c10d or static are accepted (aiodist's own "
                             "rendezvous runs either way)")
    parser.add_argument(*_flags("--rdzv-endpoint"), dest="rdzv_endpoint", default=None, metavar="HOST[:PORT]",
                        help="the rendezvous store's address: the same as --master-addr HOST --master-port PORT "
                             f"(PORT: {DEFAULT_RDZV_PORT} if not given, as in torchrun)")
    parser.add_argument(*_flags("--rdzv-id"), dest="rdzv_id", default=None, metavar="ID",
                        help="job id: the same as --run-id")
    parser.add_argument(*_flags("--rdzv-conf"), dest="rdzv_conf", type=_rdzv_conf_arg, default={},
                        metavar="K=V,...",
                        help="rendezvous options; join_timeout=SECONDS and last_call_timeout=SECONDS are used "
                             "(as --rdzv-timeout and --rdzv-last-call), others are ignored")
    parser.add_argument("--rdzv-last-call", dest="rdzv_last_call", type=float, default=None, metavar="SECONDS",
                        help="elastic: seconds more nodes may join once MIN are there (default: 1)")
    parser.add_argument("--rdzv-timeout", dest="rdzv_timeout", type=float, default=None, metavar="SECONDS",
                        help="elastic: seconds to wait for a complete round, and for the ranks of a round to "
                             "all join their rendezvous once one did (default: 300)")
    parser.add_argument(*_flags("--max-restarts"), dest="max_restarts", type=int, default=None, metavar="K",
                        help="restart the whole job up to K times after a failure (default: 0; 3 with "
                             "--on-failure restart)")
    parser.add_argument("--on-failure", dest="on_failure", choices=_ON_FAILURE, default=None,
                        help="what a rank's failure does to the others: stop (stop them and exit non-zero; the "
                             "default), restart (stop them and start the whole job again, up to --max-restarts "
                             "times; the default when --max-restarts is given), continue (let the survivors run "
                             "to their end, then report every failure and exit non-zero)")
    parser.add_argument(*_flags("--run-id"), dest="run_id", default=None,
                        help="job id given to the ranks as TORCHELASTIC_RUN_ID / AIODIST_RUN_ID (default: none)")
    parser.add_argument("--role", dest="role", default="default", metavar="NAME",
                        help="the ranks' ROLE_NAME, as torchrun's --role (default: default)")
    parser.add_argument("--grace-period", dest="grace_period", type=float, default=5.0, metavar="SECONDS",
                        help="seconds between SIGTERM and SIGKILL when stopping ranks (default: 5)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop the job and exit 124 if it runs longer than this (default: no limit)")
    parser.add_argument("--no-prefix", dest="prefix", action="store_false",
                        help="do not prefix output lines with the rank (ranks share the launcher's stdout/stderr)")
    ignored = parser.add_argument_group("torchrun options that aiodist accepts and ignores (a warning names them)")
    for name, why in _IGNORED_TORCHRUN.items():
        ignored.add_argument(*_flags(name), dest=_ignored_dest(name), default=None, metavar="V",
                             help=f"torchrun's; ignored: {why}")
    ignored.add_argument("--run-path", dest="ignored_run_path", action="store_true",
                         help="torchrun's; ignored: a script is run as python would run it anyway")
    ignored.add_argument(*_flags("--no-python"), dest="no_python", action="store_true",
                         help="torchrun's; refused: aiodist run starts Python programs only")
    add_security_options(parser)
    parser.add_argument("-m", "--module", action="store_true",
                        help="treat the program as a module name, as with `python -m`")
    parser.add_argument("program", help="the program file (or module name with -m)")
    parser.add_argument("program_args", nargs=argparse.REMAINDER,
                        help="arguments for the program (everything after it is passed on, options included)")


def resolve_options(args: argparse.Namespace) -> argparse.Namespace:
    """Fold torchrun's spellings into aiodist's options (in place); raises ValueError for a contradiction."""
    if args.rdzv_backend is not None and args.rdzv_backend not in ("c10d", "static", "etcd-v2", "etcd"):
        raise ValueError(f"--rdzv-backend {args.rdzv_backend!r}: aiodist accepts c10d or static")
    if args.rdzv_backend in ("etcd", "etcd-v2"):
        raise ValueError("--rdzv-backend etcd: aiodist has no etcd rendezvous; use c10d (its own store)")
    if args.rdzv_endpoint:
        host, sep, port = args.rdzv_endpoint.rpartition(":")
        if not sep:
            host, port = args.rdzv_endpoint, ""
        if args.master_addr is not None and args.master_addr != host:
            raise ValueError(f"--rdzv-endpoint {args.rdzv_endpoint} and --master-addr {args.master_addr} disagree")
        args.master_addr = host.strip("[]") or None
        if not port and args.master_port is None:
            args.master_port = DEFAULT_RDZV_PORT
        if port:
            try:
                p = int(port)
            except ValueError:
                raise ValueError(f"--rdzv-endpoint {args.rdzv_endpoint!r}: the port must be a number") from None
            if args.master_port is not None and args.master_port != p:
                raise ValueError(f"--rdzv-endpoint {args.rdzv_endpoint} and --master-port {args.master_port} disagree")
            args.master_port = p
    if getattr(args, "no_python", False):
        raise ValueError("--no-python: aiodist run starts Python programs only (give it the .py file or -m module)")
    if args.master_addr is None:
        args.master_addr = "127.0.0.1"
    if args.master_port == 0:  # (torchrun's "any free port", as in its docs' --rdzv-endpoint localhost:0)
        if args.nnodes not in (1, (1, 1)):
            raise ValueError("port 0 (any free port) works for one node only: give every node the same real port")
        args.master_port = None  # the launcher picks a free port, as without --master-port
    if args.rdzv_id is not None:
        if args.run_id is not None and args.run_id != args.rdzv_id:
            raise ValueError(f"--rdzv-id {args.rdzv_id} and --run-id {args.run_id} disagree")
        args.run_id = args.rdzv_id
    if args.run_id is None:
        args.run_id = "none"
    conf = args.rdzv_conf or {}
    for key, dest in (("join_timeout", "rdzv_timeout"), ("last_call_timeout", "rdzv_last_call")):
        if key in conf and getattr(args, dest) is None:
            try:
                setattr(args, dest, float(conf[key]))
            except ValueError:
                raise ValueError(f"--rdzv-conf {key}={conf[key]!r}: expected seconds") from None
    if args.rdzv_timeout is None:
        args.rdzv_timeout = 300.0
    if args.rdzv_last_call is None:
        args.rdzv_last_call = 1.0
    if args.standalone and args.nnodes not in (1, (1, 1)):
        raise ValueError("--standalone runs one node: drop --nnodes")
    if args.on_failure is None:
        args.on_failure = "restart" if args.max_restarts else "stop"
    if args.max_restarts is None:
        args.max_restarts = 3 if args.on_failure == "restart" else 0
    if args.on_failure != "restart" and args.max_restarts:
        raise ValueError(f"--max-restarts {args.max_restarts} restarts the job: it contradicts --on-failure "
                         f"{args.on_failure}")
    return args


def ranked_by_rendezvous(args: argparse.Namespace, nnodes: int) -> bool:
    """Does this node of a job of ``nnodes`` get its node rank from the rendezvous (as with torchrun's c10d)?

    Yes when there are several nodes, ``--node-rank`` was not given, and the rendezvous is torchrun's c10d
    (``--rdzv-backend c10d``, or ``--nnodes MIN:MAX`` written out, even with MIN = MAX): the job runs as an
    elastic one of exactly ``nnodes`` nodes, ranked in the order they join. Otherwise the job is static, as
    torchrun's default backend (static) has it: ``--node-rank`` (default 0) says which node this is.
    """
    if nnodes <= 1 or args.node_rank is not None or args.rdzv_backend == "static":
        return False
    return args.rdzv_backend == "c10d" or isinstance(args.nnodes, tuple)


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
    """The argv that starts one rank of ``program``: always through the bootstrap.

    The bootstrap applies the rule of :mod:`aiodist.launch.program` in the
    child (a script runs as ``python prog.py`` would run it, a module with a
    ``main`` has it called) and records how the rank ended for the launcher
    (see :mod:`aiodist.launch.outcome`).
    """
    exe = python or sys.executable
    if module:
        return [exe, "-m", "aiodist.launch_bootstrap", "-m", program, *args]
    return [exe, "-m", "aiodist.launch_bootstrap", program, *args]


def run_command(args: argparse.Namespace) -> int:
    """Run the job that ``args`` (parsed by :func:`configure_parser`) describes; return the exit code."""
    from .elastic import launch_elastic, parse_nnodes

    try:
        resolve_options(args)
        if not args.module and not os.path.isfile(args.program):
            where = "" if os.path.isabs(args.program) else f" (in {os.getcwd()})"
            what = "is a directory" if os.path.isdir(args.program) else "no such file"
            raise ValueError(f"can't open program {args.program!r}{where}: {what}")
        skipped = ignored_options(args)
        if skipped:
            print(f"aiodist run: ignoring torchrun's {', '.join(skipped)} (see `aiodist run --help`)", file=sys.stderr)
        min_nodes, max_nodes = parse_nnodes(args.nnodes) if isinstance(args.nnodes, str) else (
            args.nnodes if isinstance(args.nnodes, tuple) else (args.nnodes, args.nnodes))
        elastic = min_nodes != max_nodes or ranked_by_rendezvous(args, max_nodes)
        if elastic and args.master_port is None:
            how = "--nnodes MIN:MAX" if min_nodes != max_nodes else f"--nnodes {max_nodes} without --node-rank"
            raise ValueError(f"{how} needs --master-port PORT or --rdzv-endpoint HOST[:PORT]: the nodes meet in a "
                             f"rendezvous store there (the same on every node; the first node started hosts it)")
        env = job_environment(os.environ, secret_file=args.secret_file, insecure=args.insecure,
                              store_limits=args.store_limits, single_node=not elastic and min_nodes == 1,
                              tls_files=(args.tls_cert, args.tls_key, args.tls_ca))
        config = LaunchConfig(
            command=build_command(args.program, args.program_args, module=args.module),
            nproc_per_node=args.nproc_per_node,
            nnodes=1 if elastic else min_nodes,
            node_rank=0 if elastic else args.node_rank or 0,
            master_addr=args.master_addr,
            master_port=args.master_port,
            max_restarts=args.max_restarts,
            on_failure=args.on_failure,
            run_id=args.run_id,
            role=args.role,
            grace_period=args.grace_period,
            timeout=args.timeout,
            prefix_output=args.prefix,
            env=env,
        )
    except (ValueError, OSError) as exc:  # (SecretFileError, a TLS file that cannot be loaded)
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
