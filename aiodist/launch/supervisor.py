"""Running N local ranks as child processes and supervising them (``aiodist run``).

One *attempt* starts every local rank with its environment
(:func:`aiodist.launch.env.rank_env`), copies each rank's stdout and stderr to
the launcher's own, line by line with a ``[rankN]: `` prefix, and waits. The
first rank that exits non-zero or is killed by a signal fails the attempt.
The launcher then names the *root cause*, not merely the first rank to exit:
each rank records how it ended (:mod:`aiodist.launch.outcome`: its own
exception, or the consequence of another rank's failure), and the launcher
waits up to :data:`BLAME_WAIT` seconds for the record that settles it. What
happens next is ``on_failure``: ``"stop"`` sends SIGTERM to the others, and
SIGKILL to whatever is still alive ``grace_period`` seconds later;
``"restart"`` does the same and starts the whole job again, up to
``max_restarts`` times (a fresh MASTER_PORT when the launcher picks it, the
restart count incremented in TORCHELASTIC_RESTART_COUNT /
AIODIST_RESTART_COUNT); ``"continue"`` lets the survivors run to their end and
reports every failure then.

SIGINT and SIGTERM sent to the launcher are forwarded to the ranks, which are
then stopped the same way; a second signal during that kills them at once.
Each rank runs in a process group of its own, so a Ctrl-C at the terminal
reaches the launcher only and each rank gets the forwarded signal exactly
once, and signals reach the processes a rank started too. On Linux a rank also
dies (SIGKILL) if the launcher itself is killed. The ranks' stdin is
``/dev/null``.

This is process management, not protocol code: it uses asyncio subprocesses
and the wall-clock event loop directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from ..errors import LaunchError
from . import outcome as outcomes
from .env import merged_env, rank_env
from .outcome import Blame
from .prefix import LinePrefixer, rank_prefix
from .status import failure_message, launcher_exit_code

__all__ = ["LaunchConfig", "LaunchResult", "RankExit", "launch", "free_port"]

_DRAIN_TIMEOUT = 2.0  # output still buffered in a dead rank's pipes
_KILL_WAIT = 5.0  # after SIGKILL
TIMEOUT_EXIT_CODE = 124  # as timeout(1)
BLAME_WAIT = 3.0
"""Seconds the launcher waits, after the first failure, for the record of the rank that started it."""
_POLL = 0.05  # how often the ranks' end records are read while waiting for them
ON_FAILURE = ("stop", "restart", "continue")

# Each rank leads a process group of its own: a Ctrl-C at the terminal reaches
# the launcher only (which forwards it once), and stopping a rank also stops
# the processes it started.
_OWN_GROUPS = hasattr(os, "killpg") and sys.platform != "win32"
_PROCESS_GROUP: int | None = 0 if _OWN_GROUPS else None


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """What to run and how. ``command`` is the complete argv of one rank (interpreter included)."""

    command: Sequence[str]
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    """``None``: the launcher picks a free port, a new one for every attempt (single node only)."""
    max_restarts: int = 0
    on_failure: str = "stop"
    """What a rank's failure does: ``"stop"`` the others (with ``max_restarts`` > 0: restart), ``"restart"`` the
    whole job (up to ``max_restarts`` times), or ``"continue"``: the survivors run to their end."""
    run_id: str = "none"
    grace_period: float = 5.0
    """Seconds between SIGTERM and SIGKILL when stopping ranks."""
    timeout: float | None = None
    """Limit on the whole job (all attempts), in seconds; ``None``: none."""
    prefix_output: bool = True
    """``False``: ranks inherit the launcher's stdout/stderr, unprefixed."""
    env: Mapping[str, str] | None = None
    """Base environment of the ranks; ``None``: the launcher's own."""
    cwd: str | None = None
    restart_base: int = 0
    """Restarts that happened before this launch (the elastic agent's earlier rounds): added to the
    restart count the ranks see."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("command must not be empty")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError("nproc_per_node and nnodes must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {', '.join(ON_FAILURE)}, not {self.on_failure!r}")
        if self.on_failure == "continue" and self.max_restarts:
            raise ValueError("on_failure='continue' never restarts: max_restarts must be 0")
        if self.grace_period < 0:
            raise ValueError("grace_period must be >= 0")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("timeout must be > 0")
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError("with nnodes > 1 every node must be given the same master_port")


@dataclass(frozen=True)
class RankExit:
    """How one rank of one attempt ended."""

    rank: int
    local_rank: int
    pid: int
    returncode: int

    @property
    def message(self) -> str:
        return failure_message(rank=self.rank, pid=self.pid, returncode=self.returncode)


@dataclass(frozen=True)
class LaunchResult:
    """The outcome of :func:`launch`. ``exit_code`` is what the launcher process should exit with."""

    exit_code: int
    attempts: int
    failures: tuple[RankExit, ...] = ()
    """Ranks of the last attempt that failed (stopped ones excepted); the root cause's first when it exited non-zero."""
    root_cause: Blame | None = None
    """The rank that started the failure of the last attempt, and how (see :mod:`aiodist.launch.outcome`)."""
    signal: int | None = None
    """The signal that interrupted the launcher, if one did."""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bound to port 0, then released)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        family, addr = socket.AF_INET, ("", 0)
        sock = socket.socket(family, socket.SOCK_STREAM)
    with sock:
        try:
            sock.bind((addr[0], 0))
        except OSError:
            sock.bind(("", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------ internals


@dataclass(frozen=True)
class _Exited:
    attempt: int
    exit: RankExit


@dataclass(frozen=True)
class _Signalled:
    signum: int


@dataclass(frozen=True)
class _TimedOut:
    pass


_Event = _Exited | _Signalled | _TimedOut


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


class _Sink:
    """A binary output stream that keeps accepting (and dropping) data once it broke."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._broken = False

    def write(self, data: bytes) -> None:
        if self._broken or not data:
            return
        try:
            self._stream.write(data)
            self._stream.flush()
        except (OSError, ValueError):
            self._broken = True


class _RankProtocol(asyncio.SubprocessProtocol):
    """Receives one rank's output (prefixed line by line into the sinks) and its exit.

    ``exited`` resolves with the exit status as soon as the rank is reaped;
    ``closed`` once its pipes are closed too (a process the rank left behind
    may hold them open indefinitely, so nothing waits on it unbounded).
    """

    def __init__(self, rank: int, out: _Sink, err: _Sink) -> None:
        loop = asyncio.get_running_loop()
        self._sinks = {1: out, 2: err}
        self._prefixers = {1: LinePrefixer(rank_prefix(rank)), 2: LinePrefixer(rank_prefix(rank))}
        self._transport: asyncio.SubprocessTransport | None = None
        self.exited: asyncio.Future[int] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if fd in self._sinks:
            self._sinks[fd].write(self._prefixers[fd].feed(bytes(data) if isinstance(data, bytes) else data.encode()))

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.flush(fd)

    def flush(self, fd: int) -> None:
        """Write out the unfinished last line of ``fd``, if any."""
        if fd in self._sinks:
            self._sinks[fd].write(self._prefixers[fd].flush())

    def process_exited(self) -> None:
        assert self._transport is not None
        returncode = self._transport.get_returncode()
        if not self.exited.done() and returncode is not None:
            self.exited.set_result(returncode)

    def connection_lost(self, exc: Exception | None) -> None:
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


class _Attempt:
    """One start of all local ranks. Owns the processes and their watcher tasks."""

    def __init__(
        self,
        config: LaunchConfig,
        *,
        index: int,
        master_port: int,
        events: asyncio.Queue[_Event],
        out: _Sink,
        err: _Sink,
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
        self.stopping = False
        self.running_count = 0

    def _rank(self, local_rank: int) -> int:
        return self._config.node_rank * self._config.nproc_per_node + local_rank

    async def start(self) -> None:
        """Start every local rank. On error the ranks already started are left for :meth:`stop`."""
        cfg = self._config
        loop = asyncio.get_running_loop()
        base = os.environ if cfg.env is None else cfg.env
        pipe = subprocess.PIPE if cfg.prefix_output else None
        hook = _parent_death_hook()
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
                    max_restarts=cfg.max_restarts + cfg.restart_base,
                    run_id=cfg.run_id,
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
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_TIMEOUT):
                    await asyncio.shield(protocol.closed)
        finally:
            protocol.flush(1)
            protocol.flush(2)
            started.transport.close()  # releases the pipes (the rank itself has exited by now)
        ended = RankExit(rank=self._rank(started.local_rank), local_rank=started.local_rank, pid=started.pid,
                         returncode=returncode)
        self._exits.append((ended, not self.stopping))
        self._events.put_nowait(_Exited(self.index, ended))

    async def wait(self, *, all_ranks: bool = False) -> _Event | None:
        """Wait until every rank succeeded (``None``), one failed (its ``_Exited``), or a signal/timeout event.

        ``all_ranks``: a failure does not end the wait; it returns once every rank
        has exited (the first failure's ``_Exited``, or None) or at a signal/timeout.
        """
        first: _Exited | None = None
        while self.running_count:
            event = await self._events.get()
            if not isinstance(event, _Exited):
                return event
            if event.attempt != self.index:
                continue
            self.running_count -= 1
            if event.exit.returncode != 0:
                if not all_ranks:
                    return event
                first = first or event
        return first

    async def settle_blame(self, limit: float) -> Blame | None:
        """After a failure: wait (up to ``limit`` s) until the root cause is known, then return it.

        Known when a rank failed on its own (its record says so, or it died
        without a record), or every rank has exited. A signal or timeout event
        that arrives meanwhile is put back for the caller.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            blame = self.blame()
            if not self.running_count:
                return blame
            if blame is not None and blame.kind in ("raised", "signal", "exit") and self.exit_of(blame.rank):
                return blame  # (a rank that recorded its error is on its way out: its exit status is its own)
            left = deadline - loop.time()
            if left <= 0:
                return blame
            try:
                event = await asyncio.wait_for(self._events.get(), min(_POLL, left))
            except TimeoutError:
                continue
            if not isinstance(event, _Exited):
                self._events.put_nowait(event)
                return self.blame()
            if event.attempt == self.index:
                self.running_count -= 1

    def blame(self) -> Blame | None:
        """The root cause as far as the exits and records seen so far tell."""
        exits = [(e.rank, e.returncode) for e, _ in self._exits]
        stopped = [e.rank for e, before_stop in self._exits if not before_stop]
        return outcomes.root_cause(exits, outcomes.load(self.status_dir), stopped=stopped)

    def exit_of(self, rank: int) -> RankExit | None:
        for e, _ in self._exits:
            if e.rank == rank:
                return e
        return None

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

    async def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop every rank still running: ``signum``, then SIGKILL after the grace period.

        Returns once every rank has been reaped (or, for a rank that cannot be
        reaped, after a bounded wait); the watcher tasks are done afterwards.
        """
        self.stopping = True
        if any(r.returncode is None for r in self._ranks):
            self.signal_all(signum)
        if not await self._watchers_done(self._config.grace_period):
            self.signal_all(signal.SIGKILL)
            await self._watchers_done(_KILL_WAIT)
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    @property
    def size(self) -> int:
        return len(self._ranks)


@dataclass
class _JobState:
    attempt: _Attempt | None = None
    signal: int | None = None
    handlers: list[int] = field(default_factory=list)


def _default_log(message: str) -> None:
    print(f"aiodist run: {message}", file=sys.stderr, flush=True)


async def launch(
    config: LaunchConfig,
    *,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    log: Callable[[str], None] | None = None,
    handle_signals: bool = True,
) -> LaunchResult:
    """Run the job described by ``config`` until it succeeds, fails for good, or is interrupted.

    ``stdout``/``stderr`` receive the prefixed output of the ranks (default:
    the launcher's own), ``log`` the launcher's messages (default: stderr,
    prefixed ``aiodist run:``). With ``handle_signals`` (main thread only)
    SIGINT and SIGTERM are forwarded to the ranks for the duration of the call.

    Cancellation: the ranks still running are stopped (SIGTERM, then SIGKILL)
    before the cancellation propagates; no child process outlives the call.
    """
    out = _Sink(stdout if stdout is not None else sys.stdout.buffer)
    err = _Sink(stderr if stderr is not None else sys.stderr.buffer)
    say = log if log is not None else _default_log
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[_Event] = asyncio.Queue()
    state = _JobState()

    def on_signal(signum: int) -> None:
        if state.signal is not None:
            if state.attempt is not None:
                state.attempt.signal_all(signal.SIGKILL)  # second signal: no more grace
            return
        state.signal = signum
        events.put_nowait(_Signalled(signum))

    if handle_signals and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
            state.handlers.append(signum)
    timer = loop.call_later(config.timeout, events.put_nowait, _TimedOut()) if config.timeout else None
    status = tempfile.TemporaryDirectory(prefix="aiodist-run-")
    try:
        return await _run_attempts(config, events=events, state=state, out=out, err=err, say=say,
                                   status_root=status.name)
    finally:
        status.cleanup()
        if timer is not None:
            timer.cancel()
        for handled in state.handlers:
            loop.remove_signal_handler(handled)


async def _run_attempts(
    config: LaunchConfig,
    *,
    events: asyncio.Queue[_Event],
    state: _JobState,
    out: _Sink,
    err: _Sink,
    say: Callable[[str], None],
    status_root: str,
) -> LaunchResult:
    failures: tuple[RankExit, ...] = ()
    blame: Blame | None = None
    cont = config.on_failure == "continue"
    for index in range(config.max_restarts + 1):
        if state.signal is not None:
            return LaunchResult(exit_code=128 + state.signal, attempts=index, signal=state.signal)
        port = config.master_port if config.master_port is not None else free_port(config.master_addr)
        status_dir = os.path.join(status_root, f"attempt{index}")
        os.makedirs(status_dir, exist_ok=True)
        attempt = _Attempt(config, index=index, master_port=port, events=events, out=out, err=err,
                           status_dir=status_dir)
        state.attempt = attempt
        outcome: _Event | None = None
        try:
            try:
                await attempt.start()
            except OSError as exc:
                raise LaunchError(f"cannot start {list(config.command)!r}: {exc}") from exc
            outcome = await attempt.wait()
            if isinstance(outcome, _Exited):
                if cont:
                    say(f"{outcome.exit.message}; the others go on (--on-failure continue)")
                    outcome = await attempt.wait(all_ranks=True) or outcome
                    blame = attempt.blame() if isinstance(outcome, _Exited) else None
                else:
                    blame = await attempt.settle_blame(BLAME_WAIT)
                    if blame is not None:
                        say(f"root cause: {blame.message}")
                    say(outcome.exit.message)
                    others = attempt.running()
                    if others:
                        say(f"stopping the other {others} running rank(s)")
        finally:
            forwarded = outcome.signum if isinstance(outcome, _Signalled) else signal.SIGTERM
            await attempt.stop(forwarded)
            state.attempt = None
        if outcome is None:
            return LaunchResult(exit_code=0, attempts=index + 1)
        if isinstance(outcome, _Signalled):
            name = signal.Signals(outcome.signum).name
            say(f"received {name}; stopped {attempt.size} rank(s)")
            return LaunchResult(exit_code=128 + outcome.signum, attempts=index + 1, signal=outcome.signum)
        if isinstance(outcome, _TimedOut):
            say(f"the job exceeded its time limit of {config.timeout:g}s; stopped {attempt.size} rank(s)")
            return LaunchResult(exit_code=TIMEOUT_EXIT_CODE, attempts=index + 1, timed_out=True)
        failures = attempt.failures() or (outcome.exit,)
        culprit = attempt.exit_of(blame.rank) if blame is not None else None
        first = culprit if culprit is not None and culprit.returncode != 0 else outcome.exit
        failures = (first, *[f for f in failures if f != first])  # the culprit first
        if cont:
            if blame is not None:
                say(f"root cause: {blame.message}")
            for f in failures:
                say(f.message)
        else:
            for other in failures[1:]:
                say(f"also: {other.message}")
        if index < config.max_restarts and state.signal is None:
            say(f"restarting the job (restart {index + 1} of {config.max_restarts})")
    code = launcher_exit_code(failures[0].returncode)
    if blame is not None and blame.kind == "raised" and (failures[0].rank != blame.rank or failures[0].returncode < 0):
        code = 1  # it recorded its exception but was stopped before it exited
    return LaunchResult(
        exit_code=code,
        attempts=config.max_restarts + 1,
        failures=failures,
        root_cause=blame,
    )
