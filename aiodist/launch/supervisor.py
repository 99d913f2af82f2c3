"""Running N local ranks as child processes and supervising them (``aiodist run``).

One *attempt* (:mod:`aiodist.launch.attempt`) starts every local rank with its environment
(:func:`aiodist.launch.env.rank_env`), copies each rank's stdout and stderr to
the launcher's own, line by line with a ``[rankN]: `` prefix (written by
threads of their own, :mod:`aiodist.launch.output`: a reader that stops
reading blocks the ranks' ``print``, never the launcher), and waits. The
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

SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher stop the ranks the same
way (SIGINT is forwarded as it is, the others as SIGTERM) and the launcher exits
with 128 + the signal; a second signal during that kills them at once.
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
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from ..errors import LaunchError
from .attempt import Attempt, Event, Exited, Signalled, TimedOut
from .job import LaunchConfig, LaunchResult, RankExit
from .rundirs import make_run_dir, sweep_stale
from .outcome import Blame
from .output import Outputs, StreamWriter
from .status import launcher_exit_code

__all__ = ["LaunchConfig", "LaunchResult", "RankExit", "STOP_SIGNALS", "forwarded_signal", "launch", "free_port"]

TIMEOUT_EXIT_CODE = 124  # as timeout(1)
BLAME_WAIT = 3.0
"""Seconds the launcher waits, after the first failure, for the record of the rank that started it."""
STOP_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name))
"""The signals that stop the job (torchrun's): the launcher stops the ranks and exits with 128 + the signal."""


def forwarded_signal(signum: int) -> int:
    """What the ranks get when the launcher received ``signum``: SIGINT as it is (KeyboardInterrupt in the ranks),
    SIGTERM for the others (a rank says what it waited in on SIGTERM; SIGQUIT would dump a core, SIGHUP say nothing)."""
    return signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM



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


@dataclass
class _JobState:
    attempt: Attempt | None = None
    signal: int | None = None
    handlers: list[int] = field(default_factory=list)


EXIT_FLUSH: dict[str, float] = {"idle": 5.0}
"""At the end of a launch, the output still waiting is written as long as its reader reads; once it has read
nothing for this long, the rest is dropped (see :meth:`~aiodist.launch.output.StreamWriter.close`)."""
ABORT_FLUSH: dict[str, float] = {"idle": 1.0, "limit": 2.0}
"""The same after a stop signal or a cancellation: a short wait."""


def _writer_log(writer: StreamWriter) -> Callable[[str], None]:
    """The launcher's messages (``aiodist run: ...``), on the same path as the ranks' stderr: never blocking."""
    return lambda message: writer.write(f"aiodist run: {message}\n".encode(errors="backslashreplace"))


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
    prefixed ``aiodist run:``). These streams are written by threads of their
    own (:mod:`aiodist.launch.output`): a reader that stops reading pauses the
    ranks' output (they block in ``print``) but not the launcher. On return,
    the output still waiting has been written, or dropped once its reader read
    nothing for :data:`EXIT_FLUSH` (:data:`ABORT_FLUSH` after a stop signal or
    a cancellation) seconds. With ``handle_signals`` (main thread only)
    :data:`STOP_SIGNALS` stop the ranks for the duration of the call (see :func:`forwarded_signal`).

    Cancellation: the ranks still running are stopped (SIGTERM, then SIGKILL)
    before the cancellation propagates; no child process outlives the call.
    """
    outputs = Outputs()
    out = outputs.writer(stdout if stdout is not None else sys.stdout.buffer, "stdout")
    err = outputs.writer(stderr if stderr is not None else sys.stderr.buffer, "stderr")
    say = log if log is not None else _writer_log(outputs.writer(sys.stderr.buffer, "stderr"))
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()
    state = _JobState()

    def on_signal(signum: int) -> None:
        if state.signal is not None:
            if state.attempt is not None:
                state.attempt.signal_all(signal.SIGKILL)  # second signal: no more grace
            return
        state.signal = signum
        events.put_nowait(Signalled(signum))

    timer: asyncio.TimerHandle | None = None
    aborted = False
    try:
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                loop.add_signal_handler(signum, on_signal, signum)
                state.handlers.append(signum)
        timer = loop.call_later(config.timeout, events.put_nowait, TimedOut()) if config.timeout else None
        sweep_stale()  # (the run directories of launchers killed before they could remove theirs)
        status = make_run_dir()
        try:
            result = await _run_attempts(config, events=events, state=state, out=out, err=err, say=say,
                                         status_root=status.name)
            aborted = result.signal is not None
            return result
        except asyncio.CancelledError:
            aborted = True
            raise
        finally:
            status.cleanup()
    finally:
        if timer is not None:
            timer.cancel()
        await outputs.close(**(ABORT_FLUSH if aborted else EXIT_FLUSH))
        for handled in state.handlers:
            loop.remove_signal_handler(handled)


async def _run_attempts(
    config: LaunchConfig,
    *,
    events: asyncio.Queue[Event],
    state: _JobState,
    out: StreamWriter,
    err: StreamWriter,
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
        attempt = Attempt(config, index=index, master_port=port, events=events, out=out, err=err,
                           status_dir=status_dir)
        state.attempt = attempt
        outcome: Event | None = None
        said: RankExit | None = None  # the failure reported as the attempt ended (the culprit's, if known then)
        reason: Blame | None = None  # the root cause the others are stopped for (they tell their peers)
        try:
            try:
                await attempt.start()
            except OSError as exc:
                raise LaunchError(f"cannot start {list(config.command)!r}: {exc}") from exc
            outcome = await attempt.wait()
            if isinstance(outcome, Exited):
                if cont:
                    say(f"{outcome.exit.message}; the others go on (--on-failure continue)")
                    outcome = await attempt.wait(all_ranks=True) or outcome
                    blame = attempt.blame() if isinstance(outcome, Exited) else None
                    hung = attempt.running() if isinstance(outcome, Exited) else 0
                    if hung:  # (the others ended, declaring these failed: they may never exit)
                        say(f"stopping the {hung} rank(s) still running: the others declared them failed")
                else:
                    blame = reason = await attempt.settle_blame(BLAME_WAIT)
                    if blame is not None:
                        say(f"root cause: {blame.message}")
                    # the culprit's exit first, even if another rank exited before it
                    said = _culprit_exit(attempt, blame) or outcome.exit
                    if attempt.stranded is None:  # (else it exited 0: the root cause said how)
                        say(said.message)
                    others = attempt.running()
                    if others:
                        say(f"stopping the other {others} running rank(s)")
        finally:
            forwarded = forwarded_signal(outcome.signum) if isinstance(outcome, Signalled) else signal.SIGTERM
            await attempt.stop(forwarded, reason=reason)
            state.attempt = None
        if outcome is None:
            return LaunchResult(exit_code=0, attempts=index + 1)
        if isinstance(outcome, Signalled):
            name = signal.Signals(outcome.signum).name
            say(f"received {name}; stopped {attempt.size} rank(s)")
            return LaunchResult(exit_code=128 + outcome.signum, attempts=index + 1, signal=outcome.signum)
        if isinstance(outcome, TimedOut):
            say(f"the job exceeded its time limit of {config.timeout:g}s; stopped {attempt.size} rank(s)")
            return LaunchResult(exit_code=TIMEOUT_EXIT_CODE, attempts=index + 1, timed_out=True)
        failures = attempt.failures() or (outcome.exit,)
        first = _culprit_exit(attempt, blame) or outcome.exit
        failures = (first, *[f for f in failures if f != first])  # the culprit first
        if attempt.stranded is not None:  # (it exited 0: not a failed exit; the others were stopped)
            failures = tuple(f for f in failures if f.returncode != 0)
        if cont:
            if blame is not None:
                say(f"root cause: {blame.message}")
            for f in failures:
                say(f.message)
        else:
            for other in failures:
                if other != said:  # (said above; the culprit may have exited only when the others were stopped)
                    say(f"also: {other.message}")
        if state.signal is not None:  # (it came while the ranks were being stopped after the failure)
            more = "; not restarting the job" if index < config.max_restarts else ""
            say(f"received {signal.Signals(state.signal).name} while stopping the ranks after the failure{more}")
            return LaunchResult(exit_code=128 + state.signal, attempts=index + 1, failures=failures,
                                root_cause=blame, signal=state.signal)
        if index < config.max_restarts:
            say(f"restarting the job (restart {index + 1} of {config.max_restarts})")
    code = launcher_exit_code(failures[0].returncode) if failures else 1
    if blame is not None and blame.kind == "raised" and (failures[0].rank != blame.rank or failures[0].returncode < 0):
        code = 1  # it recorded its exception but was stopped before it exited
    elif failures and failures[0].returncode < 0 and attempt.stopped(failures[0].rank):
        code = 1  # the culprit (late, or hung) ended by our own stop signal: not 128 + SIGTERM, as if we were signalled
    return LaunchResult(
        exit_code=code,
        attempts=config.max_restarts + 1,
        failures=failures,
        root_cause=blame,
    )


def _culprit_exit(attempt: Attempt, blame: Blame | None) -> RankExit | None:
    """The exit of the rank blamed, if it has exited, and failed."""
    culprit = attempt.exit_of(blame.rank) if blame is not None else None
    return culprit if culprit is not None and culprit.returncode != 0 else None
