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
import hashlib
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
from .cli_checks import (HASH_SEED, UsageError, executor_of, explain_types, parse_seeds, positive_float, positive_int,
                         pinned_hash_seed, program_file, swarm_before_program, writable_dir_of)
from .sweep import (Progress, SweepInterrupted, SweepReport, check_seed_timeout, drive, record_of, stop_executor,
                    trace_file)
from .sweep_limit import limit_record, wall_clock_limit
from .sweep_file import SweepFileError, key_of
from .sweep_streams import LastLines, capture_logs, current, routed
from .trace import events_from_json, events_to_json, first_divergence, write_chrome


def load_main(path: str, *, isolate: bool = True) -> Callable[..., Awaitable[Any]]:
    """Import ``path`` as a module and return its ``main`` coroutine function.

    ``FILE.py:NAME`` names another function of the file (a module holding several programs).
    ``isolate=False`` (``--no-isolate``): one fresh module per run, shared by its ranks (a restarted rank
    still runs its own), instead of one per rank.
    """
    name = "main"
    if not Path(path).is_file() and ":" in path:
        path, _, name = path.rpartition(":")
        if not name.isidentifier():
            raise UsageError(f"{name!r} is not a function name (PROGRAM is FILE.py or FILE.py:NAME)")
    p = Path(path).resolve()
    if not p.is_file():
        raise UsageError(f"no such program file: {path}")
    if str(p.parent) not in sys.path:
        sys.path.insert(0, str(p.parent))
    main = ProgramMain(p, name, per_rank=isolate)  # (a fresh module for every run and rank: sim/program.py)
    if main.function(main.first) is None:  # the program's contract
        raise UsageError(f"{path} has no {name}()")
    return main


def parse_latency(spec: str) -> LatencyModel:
    """``0.0001`` | ``const:X`` | ``uniform:LO:HI`` | ``exp:MEAN[:MIN]`` (seconds)."""
    kind, _, rest = spec.partition(":")
    try:
        if not rest:
            return Constant(float(spec))
        args = [float(x) for x in rest.split(":")]
        if kind == "const":
            return Constant(args[0])
        if kind == "uniform":
            return Uniform(args[0], args[1])
        if kind == "exp":
            return Exponential(args[0], args[1] if len(args) > 1 else 0.0)
    except (ValueError, IndexError) as e:
        raise argparse.ArgumentTypeError(f"bad latency {spec!r}: {e}") from None
    raise argparse.ArgumentTypeError(f"unknown latency model {spec!r}")


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
    p.add_argument("-j", "--jobs", type=positive_int, default=None,
                   help="run a sweep's seeds in N local worker processes (default: one per CPU; 1: in this process)")
    p.add_argument("--executor", metavar="SPEC", default=None,
                   help="where a sweep's seeds run: 'process' (local workers, -j of them), 'inline', "
                        "'dask:ADDRESS' or 'dask:local[:N]' (a Dask cluster, pip install aiodist[cluster]), "
                        "or 'MODULE:FUNCTION' returning a concurrent.futures.Executor")
    p.add_argument("--seed-timeout", metavar="SECONDS", type=positive_float, default=None,
                   help="a sweep's wall-clock limit per seed (a seed stuck in pure-Python code never ends otherwise): "
                        "reported as a 'wall_clock_limit' failure, not deterministic, not saved to --out; needs "
                        "local worker processes or -j 1")
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
    explain_types(p)  # (a bad value says why, not "invalid parse_pause value")
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
    given = pinned_hash_seed(os.environ)
    if given is not None and given != HASH_SEED:  # (the command line pins the default itself)
        cmd = f"PYTHONHASHSEED={given} {cmd}"
    return cmd




def _run_once(ns: argparse.Namespace, main: Callable[..., Awaitable[Any]], seed: int, *, keep: bool,
              logs: bool = True, output: Any = None) -> Result:
    """One run with the CLI's options; the program's output prefixed per rank (dropped with -q).

    ``logs``: print the aiodist log records the run produced (single runs; a
    sweep does not: a program that handled an error would flood it).
    ``output``: where the program's output goes instead (a sweep keeps the
    last lines of each seed's). Captured for this thread only
    (:mod:`sim.sweep_streams`: the runs of a threaded executor each keep theirs).
    """
    env = {"AIODIST_FLIGHT_RECORDER_SIZE": "100000"} if keep and ns.trace else None
    out = RankPrefixedOutput(io.StringIO() if ns.quiet else output or current("stdout"))
    err = RankPrefixedOutput(io.StringIO() if ns.quiet else output or current("stderr"))  # (warnings too)
    collector = RankLogCollector()
    try:
        with routed(stdout=out, stderr=err, argv=[ns.program, *ns.args]), capture_logs(collector):
            return run(main, world_size=ns.world_size, seed=seed, network=_network(ns),
                       faults=_faults(ns) + replay.extra_faults(ns), time_limit=ns.time_limit,
                       schedule=ns.schedule, pct_depth=ns.pct_depth, trace=keep, master_port=ns.master_port,
                       env=env, stop_on_error=not ns.keep_going, compute=ns.compute, **replay.run_kwargs(ns))
    finally:
        out.flush()
        err.flush()
        if logs and not ns.quiet:
            collector.report(sys.stderr)


def _replay_in_subprocess(ns: argparse.Namespace, result: Result, seed: int, hash_seed: str) -> dict[str, Any] | None:
    """The replay command run in a fresh process under ``PYTHONHASHSEED=hash_seed``: its digest and events (None: it could not run)."""
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "events.json")
        words = shlex.split(replay_command(ns, seed, result))
        argv = [sys.executable, "-m", "sim", *words[words.index("sim") + 1:]]
        at = argv.index("--") if "--" in argv else len(argv)
        argv[at:at] = ["--dump-events", dump, "--quiet"]
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if not os.path.exists(dump):
            print(f"sim: determinism check could not run the replay:\n{proc.stdout}{proc.stderr}")
            return None
        with open(dump) as f:
            other: dict[str, Any] = json.load(f)
            return other


def _check_determinism(ns: argparse.Namespace, result: Result, seed: int) -> bool:
    """Replay ``seed`` in a fresh process under another ``PYTHONHASHSEED``; on a difference, say what it depends on.

    A difference is then classified by one more replay, under this process's
    hash seed: the same digest there means the run depends on the order of
    hashed strings (a set of ``str``), anything else on something outside the seed.
    """
    current = os.environ.get("PYTHONHASHSEED", "")
    hash_seed = "4242" if current != "4242" else "2424"
    other = _replay_in_subprocess(ns, result, seed, hash_seed)
    if other is None:
        return False
    if other["digest"] == result.digest:
        print(f"determinism check: ok (digest {result.digest} in both runs, "
              f"PYTHONHASHSEED {current or 'unset'} vs {hash_seed})")
        return True
    theirs = events_from_json(other["events"])
    i = first_divergence(result.trace, theirs)
    print(f"determinism check: FAILED: digests differ ({result.digest} vs {other['digest']}; "
          f"PYTHONHASHSEED {current or 'unset'} vs {hash_seed})")
    if i is not None:
        mine = result.trace[i].line() if i < len(result.trace) else "<end of trace>"
        them = theirs[i].line() if i < len(theirs) else "<end of trace>"
        print(f"  first divergence at event {i}:\n    this run:  {mine}\n    the other: {them}")
    same = _replay_in_subprocess(ns, result, seed, current) if current else None
    if same is not None and same["digest"] == result.digest:
        print(f"  under PYTHONHASHSEED {current} a fresh process replays it exactly (digest {result.digest}): the run "
              f"depends on the order of hashed str or bytes (iterating a set of them, or a dict built from one). "
              f"Real ranks are processes with hash seeds of their own and may iterate such a set in different orders; "
              f"sort it. (Replays are exact: the command line runs every program under one PYTHONHASHSEED.)")
    elif same is not None:
        print(f"  a fresh process under the same PYTHONHASHSEED {current} differs too (digest {same['digest']}): the run "
              f"depends on something outside the seed (files an earlier run left, id() or object addresses, a thread)")
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
    if ns.seeds is None and ns.out is not None:
        raise UsageError("--out writes a sweep's records: use it with --seeds (one seed: --seeds N,), or drop it")
    if ns.seeds is None and ns.seed_timeout is not None:
        raise UsageError("--seed-timeout limits each seed of a sweep (--seeds); a single run stops with Ctrl-C")
    if ns.trace:
        writable_dir_of(ns.trace, "--trace")
    try:
        _network(ns)  # (a setting no network has: said now, not as a traceback of the first run)
    except ValueError as e:
        raise UsageError(str(e)) from None
    main = load_main(ns.program, isolate=_loaded_key(ns)[1])
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
    _loaded[_loaded_key(ns)] = main
    return _sweep(ns)


_loaded: dict[tuple[str, bool], Callable[..., Awaitable[Any]]] = {}


def _loaded_key(ns: argparse.Namespace) -> tuple[str, bool]:
    return ns.program, not getattr(ns, "no_isolate", False)


class CliSeed:
    """One seed of a CLI sweep, as a picklable task for any executor: the options and the program's path."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns

    def __call__(self, seed: int) -> dict[str, Any]:
        ns = self.ns
        key = _loaded_key(ns)
        main = _loaded.get(key)
        if main is None:
            main = _loaded[key] = load_main(ns.program, isolate=key[1])
        printed = LastLines(OUTPUT_LINES) if not ns.quiet else None
        with wall_clock_limit(ns.seed_timeout) as fired:
            result = _run_once(ns, main, seed, keep=False, logs=False, output=printed)
        if fired:
            return limit_record(seed, ns.world_size, fired[0], replay=replay_command(ns, seed),
                                **({"output": printed.text()} if printed is not None and printed.text() else {}))
        extra: dict[str, Any] = {}
        if not result.ok:
            extra["replay"] = replay_command(ns, seed, result)  # (its plan spelled out: sim/replay.py)
            if printed is not None and printed.text():
                extra["output"] = printed.text()  # (shown, not written to --out: sim.sweep.TRANSIENT)
        if not result.ok and ns.trace:
            again = _run_once(ns, main, seed, keep=True, logs=False)
            stem, ext = os.path.splitext(ns.trace)
            extra["trace"] = trace_file(f"{stem}-seed{seed}{ext or '.json'}", again, result.digest)
        return record_of(result, **extra)


OUTPUT_LINES = 20
"""A sweep shows the last this many lines a failing seed printed (the first seed of each kind of failure)."""

_executor = executor_of  # (the name tests use)


def sweep_key(ns: argparse.Namespace) -> str:
    """What a CLI sweep runs: the program's source and name, its arguments, -n and every option that changes a
    run (those of the replay command, which spells them all), whatever the program's path is spelled as."""
    name = ns.program.rpartition(":")[2] if not Path(ns.program).is_file() and ":" in ns.program else "main"
    try:
        source = program_file(ns.program).read_bytes()
    except OSError:
        source = b""
    spelled = argparse.Namespace(**{**vars(ns), "program": f"PROGRAM:{name}"})
    return key_of("sim run", hashlib.sha256(source).hexdigest(), name, replay_command(spelled, 0))


def _sweep(ns: argparse.Namespace) -> int:
    seeds = ns.seeds
    if ns.trace:
        writable_dir_of(f"{os.path.splitext(ns.trace)[0]}-seed0.json", "--trace")
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
            if rec.get("output"):
                print("  what it printed last:\n" + "\n".join(f"    {line}" for line in rec["output"].splitlines()),
                      flush=True)

    executor, owned = _executor(ns)
    if ns.seed_timeout is not None:
        try:
            check_seed_timeout(ns.seed_timeout, executor)
        except ValueError as e:
            if owned is not None:
                stop_executor(owned)
            raise UsageError(f"--seed-timeout: {e}") from None
    interrupted = False
    try:
        report = drive(CliSeed(ns), seeds, executor=executor, out=ns.out, fail_fast=ns.fail_fast,
                       on_record=on_record, key=sweep_key(ns))
    except SweepInterrupted as e:
        interrupted = True
        if bar is not None:
            bar.close()
        _report_interrupt(ns, e)
        return 130
    finally:
        if bar is not None:
            bar.close()
        if owned is not None:
            stop_executor(owned, now=interrupted)
    return _report_sweep(ns, report)


def _report_interrupt(ns: argparse.Namespace, e: SweepInterrupted) -> None:
    """Ctrl-C: what was saved, what was still running (each seed's own command shows where it is stuck)."""
    lines = [f"sim: interrupted: {e.saved} new seed{'s' if e.saved != 1 else ''} finished"
             + (f" and saved in {ns.out}; rerun the same command to resume after them" if ns.out else
                " (not saved: with --out RESULTS.jsonl a rerun resumes)")]
    if e.running:
        lines.append(f"seeds not finished (running or queued): {' '.join(map(str, e.running[:20]))}"
                     + (" ..." if len(e.running) > 20 else "") + "; run one alone to see where it is "
                     "(Ctrl-C there shows the line it runs):")
        lines += [f"  {replay_command(ns, seed)}" for seed in e.running[:3]]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _report_sweep(ns: argparse.Namespace, report: SweepReport) -> int:
    if report.skipped:
        print(f"{report.skipped} seed{' was' if report.skipped == 1 else 's were'} already in {ns.out} "
              "(the same program and options): not run again")
    failing = report.failing
    left = report.total - len(report.records)
    stopped = f" (--fail-fast: stopped there; {left} of the {report.total} seeds not run)" if report.stopped else ""
    if not failing:
        print(report.summary())
        return 0
    shown = " ".join(str(s) for s in failing[:50]) + (" ..." if len(failing) > 50 else "")
    print(f"{len(failing)} of {len(report.records)} seeds failed{stopped}: {shown}")
    replays = {rec["seed"]: rec["replay"] for rec in report.records if rec.get("replay")}
    print("\n".join(report.group_lines(replay=lambda seed: replays.get(seed) or replay_command(ns, seed))))
    for rec in report.records:
        if rec.get("trace"):
            print(f"trace of seed {rec['seed']}: {rec['trace']}")
    print(f"Replay the first with:\n  {replays.get(failing[0]) or replay_command(ns, failing[0])}")
    return 1


def _pin_hash_seed() -> None:
    """Run this command again under ``PYTHONHASHSEED=0`` unless a number is given: replays must be exact.

    A program that iterates a set (or a dict built from one) of ``str`` or
    ``bytes`` does so in an order that Python draws per process; a seed that
    failed in one process could then pass in the next, and the replay command
    would not replay it. Every run of the command line (and its sweep workers,
    which inherit the environment) hashes strings alike instead; a number the
    user gave is kept, and the replay command carries it.
    """
    if pinned_hash_seed(os.environ) is not None:
        return
    argv = sys.orig_argv[1:]
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
    if sys.flags.ignore_environment:  # python -I / -E would ignore that PYTHONHASHSEED too: do their part here
        replaced = _without_environment_flags(argv)
        if replaced is None:
            print("sim: python -I/-E ignores PYTHONHASHSEED, so this run hashes strings its own way: a program "
                  "that iterates a set of str may not replay; run without -I/-E", file=sys.stderr)
            return
        argv = replaced
        env = {k: v for k, v in env.items() if not k.startswith("PYTHON") or k == "PYTHONHASHSEED"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv], env)


def _without_environment_flags(argv: list[str]) -> list[str] | None:
    """The interpreter options of ``argv`` with ``-I`` as ``-s -P`` and ``-E`` dropped (the environment's
    PYTHON* variables are then left out by the caller); None if they are not found as options of their own."""
    out: list[str] = []
    for i, word in enumerate(argv):
        if word in ("-m", "-c") or not word.startswith("-"):  # (the options end here)
            found = "-I" in argv[:i] or "-E" in argv[:i]
            return out + argv[i:] if found else None
        if word == "-I":
            out += ["-s", "-P"]
        elif word != "-E":
            out.append(word)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``argv``: ``sys.argv[1:]`` and, then only, the hash seed pinned; see :func:`_pin_hash_seed`)."""
    if argv is None:
        _pin_hash_seed()
    try:
        return _main(argv)
    except BrokenPipeError:  # (``| head``: the reader left; say nothing more)
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, prog_args = argv[:i], argv[i + 1:]
    ns = build_parser().parse_args(swarm_before_program(argv))
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
        except UsageError as e:
            print(f"sim: {e.message}", file=sys.stderr)
            return 2
        except (FaultError, SweepFileError) as e:  # the command line's mistake, found before anything ran
            print(f"sim: {e}", file=sys.stderr)
            return 2
        except SweepWorkerError as e:  # (the runs it finished are reported as they came, or in --out)
            print(f"sim: {e}", file=sys.stderr)
            for seed in e.seeds[:5]:
                print(f"  {replay_command(ns, seed)}", file=sys.stderr)
            return 1
    return 2  # pragma: no cover - argparse enforces the command
