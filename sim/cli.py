"""``python -m sim run -n 8 prog.py --seed 3``: run a program file in the simulator.

``prog.py`` is a module with ``async def main()`` using the public aiodist
API (the same file runs under ``aiodist run``). A failing run prints its seed
and the exact command that replays it, and the process exits non-zero.

Examples::

    python -m sim run -n 8 prog.py --seed 3
    python -m sim run -n 64 prog.py --seeds 0:1000           # sweep; failing seeds listed
    python -m sim run -n 8 prog.py --seed 3 --check-determinism
    python -m sim run -n 8 prog.py --seed 3 --trace out.json  # open in ui.perfetto.dev
    python -m sim run -n 8 prog.py --crash 2@1.5 --partition 0,1/2,3@1:5 --straggler 3x4
    python -m sim run -n 8 prog.py --seeds 0:10000 -j 8 --out results.jsonl   # resumable sweep
    python -m sim run -n 8 prog.py --seeds 0:10000 --executor dask:tcp://scheduler:8786
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiodist.launch.conventions import DEFAULT_NPROC

from .errors import SweepWorkerError
from . import replay
from .chaos import parse_chaos
from .fault_flags import FAULT_FLAGS
from .faults import FaultError
from .latency import Constant, Exponential, LatencyModel, Uniform
from .network import Network
from .rank_output import RankLogCollector as RankLogCollector
from .rank_output import RankPrefixedOutput as RankPrefixedOutput
from .program import ProgramMain
from .result import Result, _shape
from .result import _ranks_text as ranks_text
from .runner import DEFAULT_MASTER_PORT, run
from .sweep import Progress, SweepReport, drive, process_executor, record_of, trace_file
from .trace import events_from_json, events_to_json, first_divergence, write_chrome


def load_main(path: str) -> Callable[..., Awaitable[Any]]:
    """Import ``path`` as a module and return its ``main`` coroutine function.

    ``FILE.py:NAME`` names another function of the file (a module holding several programs).
    """
    name = "main"
    if not Path(path).is_file() and ":" in path:
        path, _, name = path.rpartition(":")
        if not name.isidentifier():
            raise SystemExit(f"sim: {name!r} is not a function name (PROGRAM is FILE.py or FILE.py:NAME)")
    p = Path(path).resolve()
    if not p.is_file():
        raise SystemExit(f"sim: no such program file: {path}")
    if str(p.parent) not in sys.path:
        sys.path.insert(0, str(p.parent))
    main = ProgramMain(p, name)  # (a fresh module for every run: sim/program.py)
    if main.function(main.first) is None:  # the program's contract
        raise SystemExit(f"sim: {path} has no {name}()")
    return main


def parse_latency(spec: str) -> LatencyModel:
    """``0.0001`` | ``const:X`` | ``uniform:LO:HI`` | ``exp:MEAN[:MIN]`` (seconds)."""
    kind, _, rest = spec.partition(":")
    if not rest:
        return Constant(float(spec))
    args = [float(x) for x in rest.split(":")]
    if kind == "const":
        return Constant(args[0])
    if kind == "uniform":
        return Uniform(args[0], args[1])
    if kind == "exp":
        return Exponential(args[0], args[1] if len(args) > 1 else 0.0)
    raise argparse.ArgumentTypeError(f"unknown latency model {spec!r}")


def parse_seeds(spec: str) -> list[int]:
    """``A:B`` (B excluded) or ``A,B,C``."""
    if ":" in spec:
        a, b = spec.split(":", 1)
        return list(range(int(a), int(b)))
    return [int(x) for x in spec.split(",") if x]


_FAULT_FLAGS: list[tuple[str, Callable[[str], Any], str]] = [
    *FAULT_FLAGS,
    ("--chaos", parse_chaos, "crashes=N,partitions=N,clogs=N,resets=N,stragglers=N,window=A:B: random faults "
                             "drawn from the seed"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim", description="deterministic simulator for aiodist programs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run a program as N virtual ranks")
    p.add_argument("program", help="a .py file with async def main(), or FILE.py:NAME for its async def NAME()")
    p.add_argument("-n", "--nproc", "--world-size", dest="world_size", type=int, default=DEFAULT_NPROC,
                   help=f"number of virtual ranks (default {DEFAULT_NPROC}, the same as aiodist run)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--seeds", type=parse_seeds, help="sweep: A:B or A,B,C")
    p.add_argument("--schedule", choices=("fifo", "random", "pct"), default="random",
                   help="order of same-instant events across ranks (default random)")
    p.add_argument("--pct-depth", type=int, default=3, help="bug depth d for --schedule pct (d-1 change points)")
    p.add_argument("--latency", type=parse_latency, default=None,
                   help="0.0001 | const:X | uniform:LO:HI | exp:MEAN[:MIN] (default uniform:5e-05:0.00015)")
    p.add_argument("--bandwidth", type=float, default=None, help="bytes/s per host NIC (default 1.25e9)")
    p.add_argument("--infinite-bandwidth", action="store_true")
    p.add_argument("--overhead", type=float, default=0.0, help="CPU seconds per message per side")
    p.add_argument("--compute", type=float, default=0.0,
                   help="virtual seconds a call offloaded to a thread (asyncio.to_thread) takes (default 0)")
    p.add_argument("--no-contention", action="store_true")
    p.add_argument("--time-limit", type=float, default=3600.0, help="virtual seconds")
    p.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    p.add_argument("--check-determinism", action="store_true",
                   help="run the seed again in a subprocess with another PYTHONHASHSEED and compare")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace of the run")
    p.add_argument("--dump-events", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("--fail-fast", action="store_true", help="stop a sweep at the first failing seed")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="run a sweep's seeds in N local worker processes (default: one per CPU; 1: in this process)")
    p.add_argument("--executor", metavar="SPEC", default=None,
                   help="where a sweep's seeds run: 'process' (local workers, -j of them), 'inline', "
                        "'dask:ADDRESS' or 'dask:local[:N]' (a Dask cluster, pip install aiodist[cluster]), "
                        "or 'MODULE:FUNCTION' returning a concurrent.futures.Executor")
    p.add_argument("--out", metavar="RESULTS.jsonl", default=None,
                   help="stream a sweep's results to this JSON-lines file; seeds already in it are skipped (resume)")
    p.add_argument("--keep-going", action="store_true",
                   help="do not stop a run at the first rank exception (default: stop, like the launcher)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="drop what the program prints; print only the verdict (a failing seed's tracebacks, a sweep's "
                        "failure groups)")
    for flag, parse, help_text in _FAULT_FLAGS:  # (one list, in the command line's order: see _faults)
        p.add_argument(flag, type=parse, action="append", default=[], help=help_text, dest="faults",
                       metavar=flag[2:].replace("-", "_").upper())
    replay.add_plan_options(p)  # exploration, swarm, store host, shrinking (sim/replay.py)
    return parser


def _network(ns: argparse.Namespace) -> Network:
    kw: dict[str, Any] = {}
    if ns.latency is not None:
        kw["latency"] = ns.latency
    if ns.infinite_bandwidth:
        kw["bandwidth"] = None
    elif ns.bandwidth is not None:
        kw["bandwidth"] = ns.bandwidth
    kw["overhead"] = ns.overhead
    kw["contention"] = not ns.no_contention
    kw.update(replay.network_kwargs(ns))
    return Network(**kw)


def _faults(ns: argparse.Namespace) -> list[Any]:
    """The faults of the command line, in its order: faults due at the same instant or on the same trigger
    act in the order given, and a replay command lists them in the order the run had them."""
    return list(ns.faults)


def replay_command(ns: argparse.Namespace, seed: int, result: Result | None = None) -> str:
    """The exact command line that replays ``seed`` with the same options (and ``result``'s plan, spelled out)."""
    parts = ["python", "-m", "sim", "run", "-n", str(ns.world_size), ns.program,
             "--seed", str(seed)]
    if ns.schedule != "random":
        parts += ["--schedule", ns.schedule]
    if ns.pct_depth != 3:
        parts += ["--pct-depth", str(ns.pct_depth)]
    if ns.latency is not None:
        parts += ["--latency", replay.latency_spec(ns.latency)]
    if ns.infinite_bandwidth:
        parts.append("--infinite-bandwidth")
    elif ns.bandwidth is not None:
        parts += ["--bandwidth", repr(ns.bandwidth)]
    if ns.overhead:
        parts += ["--overhead", repr(ns.overhead)]
    if ns.compute:
        parts += ["--compute", repr(ns.compute)]
    if ns.no_contention:
        parts.append("--no-contention")
    if ns.time_limit != 3600.0:
        parts += ["--time-limit", repr(ns.time_limit)]
    if ns.keep_going:
        parts.append("--keep-going")
    if ns.master_port != DEFAULT_MASTER_PORT:
        parts += ["--master-port", str(ns.master_port)]
    if not replay.explicit(ns, result):
        for fault in _faults(ns):
            parts += shlex.split(fault.to_cli())
    parts += replay.plan_args(ns, result)
    cmd = " ".join(shlex.quote(p) for p in parts)
    if ns.args:
        cmd += " -- " + " ".join(shlex.quote(a) for a in ns.args)
    return cmd




def _run_once(ns: argparse.Namespace, main: Callable[..., Awaitable[Any]], seed: int, *, keep: bool,
              logs: bool = True) -> Result:
    """One run with the CLI's options; the program's output prefixed per rank (dropped with -q).

    ``logs``: print the aiodist log records the run produced (single runs; a
    sweep does not: a program that handled an error would flood it).
    """
    env = {"AIODIST_FLIGHT_RECORDER_SIZE": "100000"} if keep and ns.trace else None
    saved = sys.argv
    sys.argv = [ns.program, *ns.args]
    out = RankPrefixedOutput(io.StringIO() if ns.quiet else sys.stdout)
    err = RankPrefixedOutput(io.StringIO() if ns.quiet else sys.stderr)  # (warnings too, as under aiodist run)
    collector = RankLogCollector()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), collector.capture():
            return run(main, world_size=ns.world_size, seed=seed, network=_network(ns),
                       faults=_faults(ns) + replay.extra_faults(ns), time_limit=ns.time_limit,
                       schedule=ns.schedule, pct_depth=ns.pct_depth, trace=keep, master_port=ns.master_port,
                       env=env, stop_on_error=not ns.keep_going, compute=ns.compute, **replay.run_kwargs(ns))
    finally:
        out.flush()
        err.flush()
        sys.argv = saved
        if logs and not ns.quiet:
            collector.report(sys.stderr)


def _check_determinism(ns: argparse.Namespace, result: Result, seed: int) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "events.json")
        argv = [sys.executable, "-m", "sim", *shlex.split(replay_command(ns, seed, result))[3:]]
        at = argv.index("--") if "--" in argv else len(argv)
        argv[at:at] = ["--dump-events", dump, "--quiet"]
        env = dict(os.environ)
        current = env.get("PYTHONHASHSEED", "")
        env["PYTHONHASHSEED"] = "4242" if current != "4242" else "2424"
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if not os.path.exists(dump):
            print(f"sim: determinism check could not run the replay:\n{proc.stdout}{proc.stderr}")
            return False
        with open(dump) as f:
            other = json.load(f)
    if other["digest"] == result.digest:
        print(f"determinism check: ok (digest {result.digest} in both runs, "
              f"PYTHONHASHSEED {current or 'unset'} vs {env['PYTHONHASHSEED']})")
        return True
    theirs = events_from_json(other["events"])
    i = first_divergence(result.trace, theirs)
    print(f"determinism check: FAILED: digests differ ({result.digest} vs {other['digest']})")
    if i is not None:
        mine = result.trace[i].line() if i < len(result.trace) else "<end of trace>"
        them = theirs[i].line() if i < len(theirs) else "<end of trace>"
        print(f"  first divergence at event {i}:\n    this run:  {mine}\n    the other: {them}")
    return False


def print_tracebacks(result: Result) -> None:
    """Each distinct traceback once; ranks that raised the same way (up to numbers) are listed after it."""
    groups: dict[str, list[Any]] = {}
    for failure in result.failures:
        if failure.traceback:
            groups.setdefault(_shape(failure.traceback), []).append(failure)
    for members in groups.values():
        first = members[0]
        print(f"rank {first.rank}:" if first.rank is not None else "traceback:")
        print(first.traceback.rstrip())
        others = [f.rank for f in members[1:] if f.rank is not None]
        if others:
            print(f"(ranks {ranks_text(others)} raised the same way)")


def cmd_run(ns: argparse.Namespace) -> int:
    main = load_main(ns.program)
    if ns.seeds is None:
        keep = bool(ns.trace or ns.check_determinism or ns.dump_events)
        result = _run_once(ns, main, ns.seed, keep=keep)
        if ns.dump_events:
            with open(ns.dump_events, "w") as f:
                json.dump({"digest": result.digest, "events": events_to_json(result.trace)}, f)
        if ns.trace:
            write_chrome(result.trace, ns.trace, ops=result.ops)
        print(result.summary())  # (-q drops the program's own output, not the verdict)
        print_tracebacks(result)
        ok = result.ok
        if ns.check_determinism and not _check_determinism(ns, result, ns.seed):
            ok = False
        if not ok:
            print(f"FAILED seed {ns.seed}. Replay with:\n  {replay_command(ns, ns.seed, result)}")
            if ns.shrink and not result.ok:
                kw = dict(world_size=ns.world_size, time_limit=ns.time_limit, schedule=ns.schedule,
                          pct_depth=ns.pct_depth, master_port=ns.master_port, stop_on_error=not ns.keep_going,
                          store_host=ns.store_host)
                replay.shrink_and_report(ns, main, result, _network(ns), kw, replay_command)
            return 1
        return 0
    _loaded[ns.program] = main
    return _sweep(ns)


_loaded: dict[str, Callable[..., Awaitable[Any]]] = {}


class CliSeed:
    """One seed of a CLI sweep, as a picklable task for any executor: the options and the program's path."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns

    def __call__(self, seed: int) -> dict[str, Any]:
        ns = self.ns
        main = _loaded.get(ns.program)
        if main is None:
            main = _loaded[ns.program] = load_main(ns.program)
        result = _run_once(ns, main, seed, keep=False, logs=False)
        extra = {}
        if not result.ok:
            extra["replay"] = replay_command(ns, seed, result)  # (its plan spelled out: sim/replay.py)
        if not result.ok and ns.trace:
            again = _run_once(ns, main, seed, keep=True, logs=False)
            stem, ext = os.path.splitext(ns.trace)
            extra["trace"] = trace_file(f"{stem}-seed{seed}{ext or '.json'}", again, result.digest)
        return record_of(result, **extra)


def _executor(ns: argparse.Namespace) -> tuple[Any, Any]:
    """(the executor for a sweep or None to run here, the one to shut down afterwards or None)."""
    jobs = ns.jobs if ns.jobs is not None else (os.cpu_count() or 1)
    spec = ns.executor or ("process" if jobs > 1 else "inline")
    if spec == "inline":
        return None, None
    if spec == "process":
        ex = process_executor(jobs)
        return ex, ex
    if spec.startswith("dask:"):
        try:
            distributed: Any = importlib.import_module("distributed")
        except ImportError:
            raise SystemExit("sim: --executor dask:... needs Dask's distributed: pip install 'aiodist[cluster]'")
        where = spec[len("dask:"):]
        if where == "local" or where.startswith("local:"):
            n = int(where.partition(":")[2] or ns.jobs or 1)
            client = distributed.Client(distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                                               dashboard_address=None))
        else:
            client = distributed.Client(where)
        return client.get_executor(), client
    module, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"sim: unknown --executor {spec!r}")
    factory = getattr(importlib.import_module(module), attr)
    ex = factory()
    return ex, ex


def _sweep(ns: argparse.Namespace) -> int:
    seeds = ns.seeds
    bar = Progress(len(seeds)) if sys.stderr.isatty() and not ns.quiet else None
    announced: set[str] = set()

    def on_record(rec: dict[str, Any]) -> None:
        if bar is not None:
            bar.update(rec)
        if not rec["ok"] and not ns.quiet and rec["signature"] not in announced:
            announced.add(rec["signature"])
            if bar is not None:
                bar.close()
            first = rec["failures"][0]
            print(f"seed {rec['seed']}: FAILED: [{first['kind']}] {first['message']}", flush=True)

    executor, owned = _executor(ns)
    try:
        report = drive(CliSeed(ns), seeds, executor=executor, out=ns.out, fail_fast=ns.fail_fast,
                       on_record=on_record)
    finally:
        if bar is not None:
            bar.close()
        if owned is not None:
            owned.shutdown() if hasattr(owned, "shutdown") else owned.close()
    return _report_sweep(ns, report)


def _report_sweep(ns: argparse.Namespace, report: SweepReport) -> int:
    if report.skipped:
        print(f"{report.skipped} seeds were already in {ns.out}")
    failing = report.failing
    if not failing:
        print(report.summary())
        return 0
    shown = " ".join(str(s) for s in failing[:50]) + (" ..." if len(failing) > 50 else "")
    print(f"{len(failing)} of {len(report.records)} seeds failed: {shown}")
    replays = {rec["seed"]: rec["replay"] for rec in report.records if rec.get("replay")}
    print("\n".join(report.group_lines(replay=lambda seed: replays.get(seed) or replay_command(ns, seed))))
    for rec in report.records:
        if rec.get("trace"):
            print(f"trace of seed {rec['seed']}: {rec['trace']}")
    print(f"Replay the first with:\n  {replays.get(failing[0]) or replay_command(ns, failing[0])}")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, prog_args = argv[:i], argv[i + 1:]
    ns = build_parser().parse_args(argv)
    ns.args = prog_args
    if ns.command == "run" and ns.seeds is not None:
        single = [flag for flag, on in (("--check-determinism", ns.check_determinism), ("--shrink", ns.shrink)) if on]
        if single:
            print(f"sim: {' and '.join(single)} work{'s' if len(single) == 1 else ''} on one seed (--seed N): run the replay command a sweep "
                  f"prints for a failing seed with {' '.join(single)}", file=sys.stderr)
            return 2
    if ns.command == "run":
        try:
            return cmd_run(ns)
        except FaultError as e:  # a fault this world cannot have: the command line's mistake
            print(f"sim: {e}", file=sys.stderr)
            return 2
        except SweepWorkerError as e:  # (the runs it finished are reported as they came, or in --out)
            print(f"sim: {e}", file=sys.stderr)
            for seed in e.seeds[:5]:
                print(f"  {replay_command(ns, seed)}", file=sys.stderr)
            return 1
    return 2  # pragma: no cover - argparse enforces the command
