"""Seed sweeps: many seeds on any ``concurrent.futures.Executor``, results streamed to a JSON-lines file.

::

    report = sim.sweep(main, seeds=range(1000), world_size=8, out="results.jsonl")
    report.failing, report.groups, print(report.summary())

Each seed runs as one task on the executor (local worker processes by
default; any :class:`concurrent.futures.Executor` works, e.g. a Dask
cluster's ``distributed.Client(...).get_executor()``); a task returns one
plain record (:func:`record_of`), the driver appends it to ``out`` as one
JSON line as soon as it arrives. A later sweep with the same ``out`` skips
the seeds already in the file (resuming an interrupted sweep, or extending
it), when they are records of the same sweep: every record carries the
sweep's key, and a file of another sweep is refused (:mod:`sim.sweep_file`). Failures are grouped by *signature*: the failure's kind and exception
type plus the program's own line where it surfaced (:func:`signature`), so
a thousand failing seeds read as the few bugs they are.

The wall clock is read only for the progress line (:class:`Progress`); it
never reaches a run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import io
import json
import logging
import multiprocessing
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .errors import SweepWorkerError
from .program import refuse_while_loading
from .result import Failure, Result
from .runner import run
from .sweep_limit import limit_record, wall_clock_limit
from .sweep_streams import capture_logs, routed
from .sweep_file import SweepFileError, json_lines, key_of, open_for_append, source_digest
from .trace import write_chrome

__all__ = ["sweep", "SweepReport", "Group", "RunSeed", "record_of", "signature", "Progress", "read_records",
           "drive", "process_executor", "SweepInterrupted", "SweepFileError", "unique_seeds", "stop_executor"]


# --------------------------------------------------------------------------- records


_NUMBERS = re.compile(r"#\d+")


def short_location(where: str) -> str:
    """``/long/path/prog.py:12 in main`` as ``prog.py:12 in main`` (what a signature shows)."""
    path, sep, rest = where.partition(":")
    return os.path.basename(path) + sep + rest if sep else where


def signature(failure: Failure) -> str:
    """What makes two failures the same bug: kind, exception type, and the program's own line.

    Exceptions: ``ValueError at prog.py:12 in main``; deadlocks and time
    limits: where the blocked ranks wait (distinct places, at most three);
    operations never awaited: the kind and the call sites.
    """
    if failure.kind == "exception":
        etype = failure.message.split(":", 1)[0].split(" ", 1)[0]
        where = short_location(failure.location) if failure.location else "?"
        return f"{etype} at {where}"
    if failure.kind == "unawaited":
        ops = failure.message.partition(": ")[2] or failure.message
        return f"unawaited: {_NUMBERS.sub('#', ops)}"
    places = sorted({short_location(w) for w in failure.where.values()})
    more = f" (+{len(places) - 3} more)" if len(places) > 3 else ""
    return f"{failure.kind} in {'; '.join(places[:3]) or '?'}{more}"


def record_of(result: Result, **extra: Any) -> dict[str, Any]:
    """One seed's outcome as a plain, JSON-ready dict (what a sweep streams to its file)."""
    failures = [{
        "kind": f.kind, "rank": f.rank, "time": f.time,
        "message": f.message.splitlines()[0] if f.message else "",
        "location": short_location(f.location) if f.location else "",
        "signature": signature(f),
    } for f in result.failures]
    rec: dict[str, Any] = {
        "seed": result.seed, "ok": result.ok, "digest": result.digest, "world_size": result.world_size,
        "virtual_time": result.virtual_time, "messages": result.messages, "steps": result.steps,
        "signature": failures[0]["signature"] if failures else None, "failures": failures,
        "faults": [f.to_cli() for f in result.faults],
    }
    rec.update(extra)
    return rec


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a JSON-lines results file (a torn last line, from an interrupted sweep, is skipped)."""
    records = []
    try:
        with open(path) as f:
            for _, rec in json_lines(f):
                if isinstance(rec, dict) and "seed" in rec:
                    records.append(rec)
    except FileNotFoundError:
        pass
    return records


# --------------------------------------------------------------------------- one seed (runs in a worker)


@dataclass
class RunSeed:
    """The task a worker runs for one seed: ``sim.run(main, seed=..., **kwargs)`` -> record.

    Picklable when ``main`` is (a module-level function) and the keyword
    arguments are (networks and faults are). ``quiet``: what the program
    prints is dropped. ``trace_dir``: a failing seed is run once more,
    keeping its events, and its Chrome/Perfetto trace written there as
    ``seed-N.json`` (the same run: the record's digest is checked).
    ``seed_timeout``: wall-clock seconds a seed may take (:mod:`sim.sweep_limit`).
    Every run calls ``main`` from fresh copies of its module, one per rank, as
    new processes would (``sim.run``'s ``isolate``, on unless ``kwargs`` turn it
    off): what one seed left in the module's globals does not reach the next
    seed this worker runs.
    """

    main: Callable[..., Awaitable[Any]]
    world_size: int = 8
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    quiet: bool = False
    trace_dir: str | None = None
    seed_timeout: float | None = None

    def __call__(self, seed: int) -> dict[str, Any]:
        # (aiodist's log records are dropped, as a CLI sweep drops them: a program that handles an error would
        # flood the sweep with its flight-recorder lines, and the records say what happened)
        with _silenced(self.quiet), capture_logs(logging.NullHandler()):
            with wall_clock_limit(self.seed_timeout) as fired:
                result = run(self.main, world_size=self.world_size, seed=seed, trace=False, **self.kwargs)
            if fired:
                return limit_record(seed, self.world_size, fired[0])
            extra = {}
            if not result.ok and self.trace_dir is not None:
                extra["trace"] = self.write_trace(seed, result.digest)
        return record_of(result, **extra)

    def write_trace(self, seed: int, digest: str) -> str:
        kwargs = dict(self.kwargs)
        env = dict(kwargs.pop("env", None) or {})
        env.setdefault("AIODIST_FLIGHT_RECORDER_SIZE", "100000")
        again = run(self.main, world_size=self.world_size, seed=seed, trace=True, env=env, **kwargs)
        return trace_file(os.path.join(self.trace_dir or ".", f"seed-{seed}.json"), again, digest)


def trace_file(path: str, result: Result, digest: str) -> str:
    """Write ``result``'s Chrome/Perfetto trace to ``path`` (``digest``: the run it must replay); return the path."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_chrome(result.trace, path, ops=result.ops)
    if result.digest != digest:  # pragma: no cover - a determinism bug: say so next to the trace
        Path(path + ".nondeterministic").write_text(f"the traced run's digest {result.digest} differs from {digest}\n")
    return path


@contextlib.contextmanager
def _silenced(quiet: bool) -> Iterator[None]:
    """Drop what the program prints (in this thread only: other runs of a threaded executor keep theirs)."""
    if not quiet:
        yield
        return
    with routed(stdout=io.StringIO()):
        yield


# --------------------------------------------------------------------------- the driver


@dataclass
class Group:
    """Failing seeds that share a :func:`signature`."""

    signature: str
    count: int
    first_seed: int
    example: dict[str, Any]
    seeds: list[int] = field(default_factory=list)


@dataclass
class SweepReport:
    """What a sweep found: every record (by seed), the failing seeds, their groups (largest first)."""

    records: list[dict[str, Any]]
    total: int
    skipped: int = 0
    """Seeds not run because ``out`` already had them (their records are included)."""
    stopped: bool = False
    """A ``fail_fast`` sweep stopped early."""

    @property
    def failing(self) -> list[int]:
        return [r["seed"] for r in self.records if not r["ok"]]

    @property
    def ok(self) -> bool:
        return not self.failing

    @property
    def groups(self) -> list[Group]:
        return group_records(self.records)

    def summary(self, *, replay: Callable[[int], str] | None = None) -> str:
        """The text a sweep ends with: one line, or the groups with count, first seed and (if given) replay."""
        done = len(self.records)
        if not self.failing:
            passed = "the one seed passed" if done == 1 else f"all {done} seeds passed"
            return passed + ("" if done == self.total else f" (of {self.total})")
        return "\n".join([f"{len(self.failing)} of {done} seeds failed.", *self.group_lines(replay=replay)])

    def group_lines(self, *, replay: Callable[[int], str] | None = None) -> list[str]:
        """The failing seeds by signature: count, signature, first seed, its first failure and replay."""
        groups = self.groups
        lines = [f"{len(groups)} distinct failure{'s' if len(groups) != 1 else ''} (seeds x where):"]
        for g in groups:
            lines.append(f"  {g.count:>5} x {g.signature}")
            lines.append(f"          first seed {g.first_seed}: {g.example['failures'][0]['message'][:160]}")
            if replay is not None:
                lines.append(f"          replay: {replay(g.first_seed)}")
        return lines


def group_records(records: Iterable[Mapping[str, Any]]) -> list[Group]:
    groups: dict[str, Group] = {}
    for rec in sorted(records, key=lambda r: r["seed"]):
        if rec["ok"]:
            continue
        sig = rec.get("signature") or "?"
        g = groups.get(sig)
        if g is None:
            g = groups[sig] = Group(sig, 0, rec["seed"], dict(rec))
        g.count += 1
        g.seeds.append(rec["seed"])
    return sorted(groups.values(), key=lambda g: (-g.count, g.first_seed))


class Progress:
    """The live line of a sweep on a terminal: seeds done/total, failures, seeds per second, ETA."""

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        self.done = 0
        self.failed = 0
        self.shown = 0.0

    def update(self, record: Mapping[str, Any]) -> None:
        self.done += 1
        self.failed += 0 if record["ok"] else 1
        now = time.monotonic()
        if now - self.shown >= 0.2 or self.done == self.total:
            self.shown = now
            self.stream.write("\r" + self.line(now - self.start) + "\x1b[K")
            self.stream.flush()

    def line(self, elapsed: float) -> str:
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        eta = _duration(left / rate) if rate > 0 else "?"
        return (f"{self.done}/{self.total} seeds, {self.failed} failed, {rate:.1f} seeds/s, "
                f"ETA {eta if left else '0s'}")

    def close(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


def _duration(s: float) -> str:
    s = int(s + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def process_executor(jobs: int | None = None) -> concurrent.futures.ProcessPoolExecutor:
    """Local worker processes (forked where the platform allows: workers start with the program loaded).

    The workers ignore Ctrl-C (SIGINT goes to a terminal's whole process
    group): the sweep's driver handles it and ends them.
    """
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork") if "fork" in methods else None
    return concurrent.futures.ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1, mp_context=ctx,
                                                  initializer=_ignore_sigint)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a sweep: ``.saved`` new records were written to ``.out`` (None: no file), ``.running`` the
    seeds that had not finished (running or queued). A sweep with the same ``out`` resumes after the saved ones."""

    def __init__(self, saved: int, running: list[int], out: str | os.PathLike[str] | None) -> None:
        super().__init__(f"sweep interrupted: {saved} new seed(s) saved"
                         + (f" in {out}" if out is not None else "")
                         + (f"; not finished: {', '.join(map(str, running))}" if running else ""))
        self.saved, self.running, self.out = saved, running, out


def unique_seeds(seeds: Iterable[int]) -> list[int]:
    """``seeds`` as a list, each once, in their order; an empty one is refused (a sweep of nothing passes nothing)."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be an iterable of ints (e.g. range(100)), not {type(seeds).__name__}")
    out = list(dict.fromkeys(seeds))
    bad = [s for s in out if not isinstance(s, int) or isinstance(s, bool)]
    if bad:
        raise TypeError(f"seeds must be ints, not {bad[0]!r}")
    if not out:
        raise ValueError("no seeds to sweep (an empty seed range): a sweep of nothing would pass")
    return out


TRANSIENT = ("output",)
"""Record keys a task may return for ``on_record`` (e.g. what a failing seed printed) that are not written to
``out`` nor kept in the report."""


def drive(
    task: Callable[[int], dict[str, Any]],
    seeds: Sequence[int],
    *,
    executor: concurrent.futures.Executor | None,
    out: str | os.PathLike[str] | None = None,
    fail_fast: bool = False,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    window: int | None = None,
    key: str | None = None,
) -> SweepReport:
    """Run ``task(seed)`` for every seed not already in ``out``; stream records to ``out``; report.

    ``executor=None`` runs the seeds here, one after the other. Otherwise at
    most ``window`` seeds are in flight at once (default: twice the
    executor's workers, at least 4), so a long sweep does not queue
    millions of tasks. ``on_record`` sees each new record as it arrives (in
    completion order; the report is in seed order). ``key``: what is swept
    (:func:`sim.sweep_file.key_of`): every record gets it, and ``out`` may
    only hold records with the same key (else :class:`SweepFileError`, before
    anything runs). Duplicate seeds run once; no seeds: ValueError.
    Ctrl-C: :class:`SweepInterrupted`.
    """
    seeds = unique_seeds(seeds)
    sink, previous = open_for_append(out, key) if out is not None else (None, {})
    todo = [s for s in seeds if s not in previous]
    records = [previous[s] for s in seeds if s in previous]
    stopped = False
    new = 0
    in_flight: dict[Any, int] = {}
    try:
        def take(rec: dict[str, Any]) -> bool:
            nonlocal new
            transient = {k: rec.pop(k) for k in TRANSIENT if k in rec}
            if key is not None:
                rec["key"] = key
            records.append(rec)
            if sink is not None and not rec.get("wall_clock_limit"):  # (not deterministic: a resume retries it)
                sink.write(json.dumps(rec, default=repr) + "\n")
                sink.flush()
            new += 1
            if on_record is not None:
                on_record({**rec, **transient})
            return fail_fast and not rec["ok"]

        if executor is None:
            for seed in todo:
                in_flight[None] = seed
                rec = task(seed)
                del in_flight[None]
                if take(rec):
                    stopped = True
                    break
        else:
            stopped = _pump(executor, task, todo, take, window or max(4, 2 * _workers(executor)), in_flight)
    except KeyboardInterrupt as e:
        if isinstance(e, SweepInterrupted):
            raise
        raise SweepInterrupted(new, sorted(in_flight.values()), out) from None
    finally:
        if sink is not None:
            sink.close()
    records.sort(key=lambda r: r["seed"])
    return SweepReport(records, total=len(seeds), skipped=len(seeds) - len(todo), stopped=stopped)


def _workers(executor: concurrent.futures.Executor) -> int:
    n = getattr(executor, "_max_workers", None)  # (ProcessPool/ThreadPool; other executors: a default)
    return int(n) if isinstance(n, int) and n > 0 else (os.cpu_count() or 1)


def _lost_worker(error: BaseException) -> bool:
    """Whether a task's exception means its worker is gone (not an exception the task raised)."""
    return isinstance(error, (concurrent.futures.BrokenExecutor, concurrent.futures.CancelledError)) or \
        type(error).__name__ in ("KilledWorker", "CommClosedError")  # (Dask's)


def _pump(executor: concurrent.futures.Executor, task: Callable[[int], dict[str, Any]], todo: Sequence[int],
          take: Callable[[dict[str, Any]], bool], window: int, seeds: dict[Any, int]) -> bool:
    """``seeds``: the futures in flight and their seeds (the caller's: it names them when interrupted)."""

    def lost(error: BaseException) -> SweepWorkerError:
        failed = sorted(s for f, s in seeds.items() if f.done() and not f.cancelled() and f.exception() is not None)
        return SweepWorkerError(failed or sorted(seeds.values()), error)  # (not known yet which: all in flight)

    it = iter(todo)
    try:
        while True:
            while len(seeds) < window:
                seed = next(it, None)
                if seed is None:
                    break
                try:
                    seeds[executor.submit(task, seed)] = seed
                except Exception as e:  # (the executor broke: a worker died meanwhile)
                    raise lost(e) from e
            if not seeds:
                return False
            done, _ = concurrent.futures.wait(list(seeds), return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: seeds[f]):
                error = fut.exception()
                if error is not None and _lost_worker(error):  # (a run's own failures are records)
                    raise lost(error) from error
                if error is not None:  # the task itself raised: say so, as what it is
                    error.add_note(f"(raised by the sweep's task for seed {seeds[fut]}, not by the program: a "
                                   "simulator or sweep error)")
                    raise error
                del seeds[fut]
                if take(fut.result()):  # (--fail-fast) the seeds that finished meanwhile are kept too
                    for other in sorted((f for f in seeds if f.done() and not f.cancelled()
                                         and f.exception() is None), key=lambda f: seeds[f]):
                        del seeds[other]
                        take(other.result())
                    return True
    finally:
        for fut in seeds:
            fut.cancel()


def check_seed_timeout(seconds: float, executor: Any) -> None:
    """A wall-clock limit needs each seed in the main thread of a process: local worker processes or here."""
    if not seconds > 0:
        raise ValueError(f"seed_timeout must be above 0 seconds, not {seconds}")
    if executor is not None and not isinstance(executor, concurrent.futures.ProcessPoolExecutor):
        raise ValueError(f"a per-seed wall-clock limit needs local worker processes (or a sweep run here): "
                         f"{type(executor).__name__} runs seeds in threads, which a timer signal cannot interrupt")


def stop_executor(executor: Any, *, now: bool = False) -> None:
    """Shut an executor down (``now``: at once, cancelling what is queued and ending local worker processes)."""
    if not now:
        executor.shutdown() if hasattr(executor, "shutdown") else executor.close()
        return
    processes = list((getattr(executor, "_processes", None) or {}).values())  # (a ProcessPoolExecutor's)
    if hasattr(executor, "shutdown"):
        executor.shutdown(wait=False, cancel_futures=True)
    else:
        executor.close()
    for p in processes:
        with contextlib.suppress(Exception):
            p.terminate()
    left = _ended_within(processes, 2)
    for p in left:  # (a worker whose SIGTERM is handled or ignored: a program's own handler, say)
        with contextlib.suppress(Exception):
            p.kill()
    _ended_within(left, 5)


def _ended_within(processes: list[Any], seconds: float) -> list[Any]:
    """Wait up to ``seconds`` for ``processes`` to end; those still running. Their sentinels tell, not
    ``is_alive()``: the executor's own thread reaps them too, and a reap it is in the middle of makes
    ``is_alive()`` say True for a process that has ended."""
    from multiprocessing.connection import wait

    pending = {}
    for p in processes:
        with contextlib.suppress(ValueError):  # (closed, or never started: nothing to wait for)
            pending[p.sentinel] = p
    deadline = time.monotonic() + seconds
    while pending and (left := deadline - time.monotonic()) > 0:  # (bounded by the deadline)
        for s in wait(list(pending), timeout=left):
            pending.pop(s)
    return list(pending.values())


def sweep(
    main: Callable[..., Awaitable[Any]],
    *,
    seeds: Iterable[int],
    world_size: int = 8,
    executor: concurrent.futures.Executor | None = None,
    jobs: int | None = None,
    out: str | os.PathLike[str] | None = None,
    fail_fast: bool = False,
    quiet: bool = True,
    trace_dir: str | None = None,
    progress: bool | None = None,
    seed_timeout: float | None = None,
    **run_kwargs: Any,
) -> SweepReport:
    """Run ``main`` for every seed (see the module doc); return a :class:`SweepReport`.

    ``executor``: any :class:`concurrent.futures.Executor`; None: local
    worker processes (``jobs`` of them, default one per CPU; ``jobs=1`` runs
    here, without workers). ``main`` and ``run_kwargs`` (any :func:`sim.run`
    keyword) must be picklable for an executor of processes or machines.
    ``out``: a JSON-lines file of records; seeds already in it are not run
    again (only records of the same sweep: the same program source, world
    size and keywords; a file of another sweep's records is refused with
    :class:`sim.SweepFileError` before anything runs). ``seeds``: duplicates
    run once, none is a ValueError. ``quiet``: drop what the program prints. ``trace_dir``: write a
    Chrome/Perfetto trace of every failing seed there. ``progress``: a live
    line on stderr (default: when stderr is a terminal). ``seed_timeout``:
    wall-clock seconds a seed may run (a seed stuck in pure-Python code
    never ends otherwise); a seed past it is reported as failure kind
    ``wall_clock_limit`` (not deterministic, not saved to ``out``). It needs
    seeds run in processes' main threads: local workers or ``jobs=1``.
    Ctrl-C: :class:`SweepInterrupted` (local workers are ended).
    """
    refuse_while_loading("sim.sweep")
    seeds = unique_seeds(seeds)
    try:
        inspect.signature(run).bind(main, world_size=world_size, seed=0, trace=False, **run_kwargs)
    except TypeError as e:
        raise TypeError(f"sim.sweep: {e} (the keywords besides sweep's own go to sim.run)") from None
    if seed_timeout is not None:
        check_seed_timeout(seed_timeout, executor)
    if trace_dir is not None:
        try:
            os.makedirs(trace_dir, exist_ok=True)
        except OSError as e:
            raise ValueError(f"sim.sweep: cannot make trace_dir {trace_dir}: {e.strerror or e}") from None
        if not os.access(trace_dir, os.W_OK):
            raise ValueError(f"sim.sweep: trace_dir {trace_dir} is not writable")
    task = RunSeed(main, world_size, dict(run_kwargs), quiet, trace_dir, seed_timeout)
    key = key_of("sim.sweep", source_digest(main), main, getattr(main, "__module__", ""),
                 getattr(main, "__qualname__", ""), world_size, run_kwargs)
    show = sys.stderr.isatty() if progress is None else progress
    bar = Progress(len(seeds)) if show else None
    owned = None
    if executor is None and jobs != 1:
        executor = owned = process_executor(jobs)
    interrupted = False
    try:
        return drive(task, seeds, executor=executor, out=out, fail_fast=fail_fast,
                     on_record=bar.update if bar is not None else None, key=key)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if bar is not None:
            bar.close()
        if owned is not None:
            stop_executor(owned, now=interrupted)
