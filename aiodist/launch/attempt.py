"""One attempt of a launch: every local rank started as a child process, its output copied, its exit watched.

An :class:`Attempt` starts each local rank (in a process group of its own,
killed with the launcher on Linux) with its environment, copies its stdout
and stderr line by line with a ``[rankN]: `` prefix (to the launcher's
writers, :mod:`aiodist.launch.output`, which pause its pipes while the
launcher's reader lags behind), reports each exit on the job's event queue,
settles the root cause of a failure from the ranks' end records
(:mod:`aiodist.launch.outcome`), and stops the ranks still running (a
signal, then SIGKILL after the grace period; a rank being stopped is never
paused, so that a stalled reader cannot keep it from exiting).

Process management, not protocol code: asyncio subprocesses and the
wall-clock event loop directly.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass

from . import outcome as outcomes
from .env import merged_env, rank_env
from ..launch_marks import load_marks
from .job import LaunchConfig, RankExit
from .outcome import Blame
from .output import StreamWriter
from .prefix import LinePrefixer, rank_prefix

_DRAIN_TIMEOUT = 2.0  # output still buffered in a dead rank's pipes (while the launcher's output moves: longer)
_DRAIN_LIMIT = 60.0  # ... but no longer than this
_KILL_WAIT = 5.0  # after SIGKILL
_POLL = 0.05  # how often the ranks' end records are read while waiting for them
MISMATCH_RECORDS_WAIT = 1.0
"""Seconds a mismatch's root cause waits for the other members' records (what each called there), at most."""
_STRANDED_POLL = 0.25  # after a clean exit: how often the rendezvous marks are read (see Attempt.wait)

# Each rank leads a process group of its own: a Ctrl-C at the terminal reaches
# the launcher only (which forwards it once), and stopping a rank also stops
# the processes it started.
_OWN_GROUPS = hasattr(os, "killpg") and sys.platform != "win32"
_PROCESS_GROUP: int | None = 0 if _OWN_GROUPS else None


@dataclass(frozen=True)
class Exited:
    attempt: int
    exit: RankExit


@dataclass(frozen=True)
class Signalled:
    signum: int


@dataclass(frozen=True)
class TimedOut:
    pass


Event = Exited | Signalled | TimedOut


def _parent_death_hook() -> Callable[[], None] | None:
    """A preexec hook that makes a rank die (SIGKILL) if the launcher dies without stopping it (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None  # PR_SET_PDEATHSIG follows the forking *thread*, which may end early

    launcher = os.getpid()

    def hook() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != launcher:  # the launcher died before the line above took effect
            os._exit(1)

    return hook


class _RankProtocol(asyncio.SubprocessProtocol):
    """Receives one rank's output (prefixed line by line into the writers) and its exit.

    ``exited`` resolves with the exit status as soon as the rank is reaped;
    ``closed`` once its pipes are closed too (a process the rank left behind
    may hold them open indefinitely, so nothing waits on it unbounded).
    Its pipes are attached to the writers (backpressure pauses them) until
    :meth:`release`.
    """

    def __init__(self, rank: int, out: StreamWriter, err: StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        self._writers = {1: out, 2: err}
        self._prefixers = {1: LinePrefixer(rank_prefix(rank)), 2: LinePrefixer(rank_prefix(rank))}
        self._pipes: dict[int, asyncio.ReadTransport] = {}
        self._released = False
        self._transport: asyncio.SubprocessTransport | None = None
        self.exited: asyncio.Future[int] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport
        for fd, writer in self._writers.items():
            pipe = transport.get_pipe_transport(fd)
            if isinstance(pipe, asyncio.ReadTransport) and not self._released:
                self._pipes[fd] = pipe
                writer.attach(pipe)

    def release(self) -> None:
        """No more backpressure: the rank is being stopped, its pipes are read to their end.

        What it prints while the launcher's reader lags more than
        :data:`~aiodist.launch.output.DROP_ABOVE` bytes behind is dropped.
        """
        self._released = True
        for fd, pipe in self._pipes.items():
            self._writers[fd].detach(pipe)
        self._pipes.clear()

    def output_mark(self) -> tuple[int, int]:
        """Bytes written out so far to the two streams (changes while the launcher's readers read)."""
        return self._writers[1].written, self._writers[2].written

    def throttled(self) -> bool:
        """Is a pipe of this rank paused by backpressure?"""
        return any(self._writers[fd].paused for fd in self._pipes)

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if fd in self._writers:
            chunk = self._prefixers[fd].feed(bytes(data) if isinstance(data, bytes) else data.encode())
            self._writers[fd].write(chunk, may_drop=self._released)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        pipe = self._pipes.pop(fd, None)
        if pipe is not None:
            self._writers[fd].detach(pipe)
        self.flush(fd)

    def flush(self, fd: int) -> None:
        """Write out the unfinished last line of ``fd``, if any."""
        if fd in self._writers:
            self._writers[fd].write(self._prefixers[fd].flush(), may_drop=self._released)

    def process_exited(self) -> None:
        assert self._transport is not None
        returncode = self._transport.get_returncode()
        if not self.exited.done() and returncode is not None:
            self.exited.set_result(returncode)

    def connection_lost(self, exc: Exception | None) -> None:
        self.release()
        if not self.closed.done():
            self.closed.set_result(None)


class _Rank:
    """A started rank: its transport (pid, signals, status) and protocol (output, exit)."""

    def __init__(self, local_rank: int, transport: asyncio.SubprocessTransport, protocol: _RankProtocol) -> None:
        self.local_rank = local_rank
        self.transport = transport
        self.protocol = protocol
        self.pid = transport.get_pid()

    @property
    def returncode(self) -> int | None:
        return self.transport.get_returncode()


class Attempt:
    """One start of all local ranks. Owns the processes and their watcher tasks."""

    def __init__(
        self,
        config: LaunchConfig,
        *,
        index: int,
        master_port: int,
        events: asyncio.Queue[Event],
        out: StreamWriter,
        err: StreamWriter,
        status_dir: str,
    ) -> None:
        self._config = config
        self.index = index
        self.status_dir = status_dir
        self._master_port = master_port
        self._events = events
        self._out = out
        self._err = err
        self._ranks: list[_Rank] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._exits: list[tuple[RankExit, bool]] = []  # (exit, observed before stop began)
        self._exit_times: dict[int, float] = {}  # rank -> when its exit was seen (time.time())
        self.stopping = False
        self.running_count = 0
        self.stranded: Blame | None = None
        """Set when :meth:`wait` ended because a rank exited cleanly before the rendezvous the others wait in."""

    def _rank(self, local_rank: int) -> int:
        return self._config.node_rank * self._config.nproc_per_node + local_rank

    async def start(self) -> None:
        """Start every local rank. On error the ranks already started are left for :meth:`stop`."""
        cfg = self._config
        loop = asyncio.get_running_loop()
        base = os.environ if cfg.env is None else cfg.env
        pipe = subprocess.PIPE if cfg.prefix_output else None
        hook = _parent_death_hook()
        max_restarts = cfg.max_restarts if cfg.reported_max_restarts is None else cfg.reported_max_restarts
        for local_rank in range(cfg.nproc_per_node):
            env = merged_env(
                base,
                rank_env(
                    local_rank=local_rank,
                    nproc_per_node=cfg.nproc_per_node,
                    nnodes=cfg.nnodes,
                    node_rank=cfg.node_rank,
                    master_addr=cfg.master_addr,
                    master_port=self._master_port,
                    restart_count=self.index + cfg.restart_base,
                    max_restarts=max_restarts,
                    run_id=cfg.run_id,
                    role=cfg.role,
                ),
                nproc_per_node=cfg.nproc_per_node,
            )
            env[outcomes.STATUS_DIR_ENV] = self.status_dir
            rank = self._rank(local_rank)
            transport, protocol = await loop.subprocess_exec(
                lambda: _RankProtocol(rank, self._out, self._err),
                *cfg.command,
                stdin=subprocess.DEVNULL,
                stdout=pipe,
                stderr=pipe,
                env=env,
                cwd=cfg.cwd,
                preexec_fn=hook,
                process_group=_PROCESS_GROUP,
            )
            started = _Rank(local_rank, transport, protocol)
            self._ranks.append(started)
            self.running_count += 1
            self._watchers.append(asyncio.create_task(self._watch(started)))

    async def _watch(self, started: _Rank) -> None:
        protocol = started.protocol
        try:
            returncode = await protocol.exited
            # Wall-clock, as the ranks' end records are: a rank that died without one (SIGKILL) is placed
            # among them by when its exit was seen, not after all of them.
            self._exit_times[self._rank(started.local_rank)] = time.time()
            await self._drain(protocol)
        finally:
            protocol.flush(1)
            protocol.flush(2)
            started.transport.close()  # releases the pipes (the rank itself has exited by now)
        ended = RankExit(rank=self._rank(started.local_rank), local_rank=started.local_rank, pid=started.pid,
                         returncode=returncode)
        self._exits.append((ended, not self.stopping))
        self._events.put_nowait(Exited(self.index, ended))

    @staticmethod
    async def _drain(protocol: _RankProtocol) -> None:
        """Wait (bounded) for the end of a rank's pipes after its exit.

        Up to :data:`_DRAIN_TIMEOUT` s; longer (up to :data:`_DRAIN_LIMIT` s)
        while its pipes are paused by backpressure and the launcher's output
        still moves (a slow reader). A reader that stalls ends the wait.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            mark = protocol.output_mark()
            try:
                async with asyncio.timeout(_DRAIN_TIMEOUT):
                    await asyncio.shield(protocol.closed)
                return
            except TimeoutError:
                if (not protocol.throttled() or protocol.output_mark() == mark
                        or loop.time() - start >= _DRAIN_LIMIT):
                    return

    async def wait(self, *, all_ranks: bool = False) -> Event | None:
        """Wait until every rank succeeded (``None``), one failed (its ``Exited``), or a signal/timeout event.

        ``all_ranks``: a failure does not end the wait; it returns once every rank
        has exited (the first failure's ``Exited``, or None) or at a signal/timeout,
        or once every rank still running is one the others declared failed (a hung
        rank: it may never exit; the caller stops it).
        """
        first: Exited | None = None
        watch = not all_ranks and self._config.on_failure != "continue"
        clean: list[Exited] = []  # (clean exits: of a rank that never joined, they may strand the others)
        event: Event | None
        while self.running_count:
            if clean:
                try:
                    event = await asyncio.wait_for(self._events.get(), _STRANDED_POLL)
                except TimeoutError:
                    event = None
            else:
                event = await self._events.get()
            if isinstance(event, Exited) and event.attempt == self.index:
                self.running_count -= 1
                if event.exit.returncode != 0:
                    if not all_ranks:
                        return event
                    first = first or event
                elif watch:
                    clean.append(event)
            elif event is not None and not isinstance(event, Exited):
                return event
            if first is not None and self.running_count and self.only_failed_left():
                return first
            if clean and self.running_count:
                marks = load_marks(self.status_dir)
                left = set(outcomes.never_joined([e.exit.rank for e in clean], marks))
                clean = [e for e in clean if e.exit.rank in left]
                running = {self._rank(r.local_rank) for r in self._ranks if r.returncode is None}
                stranded = outcomes.stranded([e.exit.rank for e in clean], running, marks)
                if stranded is not None:
                    self.stranded = stranded
                    return next(e for e in clean if e.exit.rank == stranded.rank)
        return first

    def only_failed_left(self) -> bool:
        """Are the ranks still running all ranks that the others' records blame (declared failed: hung)?"""
        running = {self._rank(r.local_rank) for r in self._ranks if r.returncode is None}
        return bool(running) and running <= outcomes.blamed(outcomes.load(self.status_dir))

    async def settle_blame(self, limit: float) -> Blame | None:
        """After a failure: wait (up to ``limit`` s) until the root cause is known, then return it.

        Known when a rank failed on its own (its record says so, or it died
        without a record), or every rank has exited. A signal or timeout event
        that arrives meanwhile is put back for the caller.
        """
        if self.stranded is not None:
            return self.stranded  # (the others wait for it: none of them has failed yet)
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + limit
        while True:
            records = outcomes.load(self.status_dir)
            blame = self.blame(records)
            if not self.running_count:
                return blame
            if blame is not None and blame.kind in ("raised", "signal", "exit") and self.exit_of(blame.rank) \
                    and not self._mismatch_unsettled(blame, records, loop.time() - start):
                return blame  # (a rank that recorded its error is on its way out: its exit status is its own)
            left = deadline - loop.time()
            if left <= 0:
                return blame
            try:
                event = await asyncio.wait_for(self._events.get(), min(_POLL, left))
            except TimeoutError:
                continue
            if not isinstance(event, Exited):
                self._events.put_nowait(event)
                return self.blame()
            if event.attempt == self.index:
                self.running_count -= 1

    def blame(self, records: Mapping[int, Mapping[str, Any]] | None = None) -> Blame | None:
        """The root cause as far as the exits and ``records`` (None: read now) seen so far tell."""
        exits = [(e.rank, e.returncode) for e, _ in self._exits]
        stopped = [e.rank for e, before_stop in self._exits if not before_stop]
        local = {self._rank(r.local_rank) for r in self._ranks}
        return outcomes.root_cause(exits, outcomes.load(self.status_dir) if records is None else records,
                                   stopped=stopped, local=local, exit_times=self._exit_times)

    def _mismatch_unsettled(self, blame: Blame, records: Mapping[int, Mapping[str, Any]], waited: float) -> bool:
        """A mismatch is blamed on its finder while some members have not written what they called there:
        wait for them a little (:data:`MISMATCH_RECORDS_WAIT`), as together they may name the odd one out."""
        if waited >= MISMATCH_RECORDS_WAIT:
            return False
        m = (records.get(blame.rank) or {}).get("mismatch")
        if not isinstance(m, dict):
            return False
        told = sum(1 for rec in records.values() if isinstance(rec.get("mismatch"), dict)
                   and rec["mismatch"].get("group") == m.get("group") and rec["mismatch"].get("seq") == m.get("seq"))
        return told < len(self._ranks)

    def exit_of(self, rank: int) -> RankExit | None:
        for e, _ in self._exits:
            if e.rank == rank:
                return e
        return None

    def stopped(self, rank: int) -> bool:
        """Whether ``rank`` exited after this launcher began stopping the ranks (its signal is not its failure)."""
        return any(e.rank == rank and not before_stop for e, before_stop in self._exits)

    def failures(self) -> tuple[RankExit, ...]:
        """Ranks that failed on their own (not because they were stopped), in the order seen."""
        return tuple(e for e, before_stop in self._exits if before_stop and e.returncode != 0)

    def running(self) -> int:
        """How many ranks have not exited yet."""
        return sum(1 for r in self._ranks if r.returncode is None)

    def signal_all(self, signum: int) -> None:
        """Send ``signum`` to every rank still running, with the processes it started (its process group)."""
        for r in self._ranks:
            if r.returncode is None:  # not reaped yet, so its pid (= its group id) is still ours
                try:
                    if _OWN_GROUPS:
                        os.killpg(r.pid, signum)
                    else:
                        r.transport.send_signal(signum)
                except ProcessLookupError:
                    pass

    async def _watchers_done(self, timeout: float) -> bool:
        if not self._watchers:
            return True
        _, pending = await asyncio.wait(self._watchers, timeout=timeout)
        return not pending

    async def stop(self, signum: int = signal.SIGTERM, *, reason: Blame | None = None) -> None:
        """Stop every rank still running: ``signum``, then SIGKILL after the grace period.

        ``reason``: the root cause of the failure they are stopped for; with
        several nodes, a rank stopped so tells its peers about it as it leaves
        (see :func:`aiodist.launch.outcome.write_stop_reason`; on one node
        every peer is stopped with it, by a launcher that knows). Returns once every
        rank has been reaped (or, for a rank that cannot be reaped, after a
        bounded wait); the watcher tasks are done afterwards.
        """
        self.stopping = True
        for r in self._ranks:
            r.protocol.release()  # (a rank blocked writing to a stalled reader must be able to exit)
        if any(r.returncode is None for r in self._ranks):
            if self._config.nnodes > 1:
                outcomes.write_stop_reason(self.status_dir, reason)
            self.signal_all(signum)
            if signum != signal.SIGKILL and hasattr(signal, "SIGCONT"):
                # A stopped rank (SIGSTOP: hung, or stopped by a debugger) takes the signal only once it
                # runs: without this it held the job, and an elastic node's rejoin, the whole grace period.
                self.signal_all(signal.SIGCONT)
        if not await self._watchers_done(self._config.grace_period):
            self.signal_all(signal.SIGKILL)
            await self._watchers_done(_KILL_WAIT)
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    @property
    def size(self) -> int:
        return len(self._ranks)
