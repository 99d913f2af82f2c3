"""``aiodist.spawn``: run a function as ``world_size`` ranks in fresh processes.

The ``multiprocessing`` *spawn* start method is used (no fork of the caller's
threads or event loop), so ``fn`` must be importable by the child: a function
defined at the top level of a module (for a script, under an
``if __name__ == "__main__":`` guard, as with any spawn-based multiprocessing).
``fn`` is called as ``fn(*args)`` in each rank — the rank learns who it is from
its environment (RANK, WORLD_SIZE, ... exactly as ``aiodist run`` sets them,
present before the child imports anything), typically through
``await aiodist.init_process_group()``. Like ``aiodist run``, every call gives
its ranks a fresh secret (``AIODIST_SECRET``), unless the caller's
environment or ``env`` already names one (or ``AIODIST_INSECURE=1``). An ``async def fn`` runs on its own
event loop (uvloop's when installed).

Return values come back to the caller as a list indexed by rank, so they must
be picklable (an unpicklable return value fails that rank). Unlike
``aiodist run``, the ranks' output is not prefixed: they share the caller's
stdout and stderr.

This is blocking process management (no event loop): call it from
synchronous code, or from a thread when an event loop runs. It is not protocol
code and never runs inside the simulator, so its timeouts use the wall clock
(``time.monotonic``).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import LaunchTimeoutError, RankFailedError
from .env import merged_env, rank_env
from ..launch_marks import STATUS_DIR_ENV, load_marks
from .outcome import Blame, describe_exception, never_joined, root_cause, stranded
from .runner import call_entry
from .security import fresh_secret
from .status import failure_message
from .supervisor import BLAME_WAIT, free_port

__all__ = ["spawn"]

_KILL_WAIT = 5.0


def _rank_main(fn: Callable[..., Any], args: tuple[Any, ...], env: dict[str, str], conn: Any) -> None:
    """Entry point of a spawned rank: run ``fn`` and report its result or error on ``conn``."""
    os.environ.update(env)
    try:
        result = call_entry(fn, *args)
    except (SystemExit, KeyboardInterrupt):
        conn.close()
        raise
    except BaseException as exc:
        record = {**describe_exception(exc), "time": time.time()}  # (whose fault: its own, or a consequence)
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(), record))
        conn.close()
        raise
    try:
        conn.send(("ok", result))
    except Exception as exc:  # unpicklable result
        with contextlib.suppress(Exception):
            conn.send(("error", f"cannot send the return value back: {type(exc).__name__}: {exc}", traceback.format_exc()))
        conn.close()
        raise SystemExit(1) from None
    conn.close()


@contextlib.contextmanager
def _environ(overlay: Mapping[str, str]) -> Iterator[None]:
    """Temporarily set ``overlay`` in ``os.environ`` (the spawned child inherits it at exec)."""
    saved = {k: os.environ.get(k) for k in overlay}
    os.environ.update(overlay)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _stop(procs: Sequence[Any], grace_period: float) -> None:
    """SIGTERM every live process, SIGKILL those alive after ``grace_period``, reap all (bounded)."""
    for p in procs:
        if p.exitcode is None:
            with contextlib.suppress(Exception):
                p.terminate()
    deadline = time.monotonic() + grace_period
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            with contextlib.suppress(Exception):
                p.kill()
    deadline = time.monotonic() + _KILL_WAIT
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))


def _failure(rank: int, proc: Any, remote: tuple[str, str] | None, *, cause: str | None = None) -> RankFailedError:
    """The error naming ``rank``; ``cause``: the root cause, when another rank (that did not fail) started it."""
    code = proc.exitcode
    message = failure_message(rank=rank, pid=proc.pid, returncode=code)
    if remote is not None:
        message = f"{message}: {remote[0]}"
    if cause is not None:
        message = f"{message}\nroot cause: {cause}"
    if remote is not None:
        message = f"{message}\n\n--- traceback of rank {rank} ---\n{remote[1]}"
    return RankFailedError(
        message,
        rank=rank,
        pid=proc.pid,
        exitcode=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        remote_traceback=None if remote is None else remote[1],
    )


def _stranded_error(blame: Blame, proc: Any) -> RankFailedError:
    """The error naming a rank that returned without joining its rendezvous while others wait in theirs."""
    message = (f"rank {blame.rank} (pid {proc.pid}) returned without joining its rendezvous, which the others "
               f"wait for until their timeout: {blame.message}; they were stopped")
    return RankFailedError(message, rank=blame.rank, pid=proc.pid, exitcode=0, signal=None, remote_traceback=None)


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    *,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    run_id: str = "none",
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    grace_period: float = 5.0,
) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` new processes with the ``aiodist run`` environment.

    Returns the ranks' return values, indexed by rank. ``master_port=None``
    picks a free port; ``env`` adds variables to every rank's environment.

    A rank that fails (an exception, a non-zero exit, a signal) makes
    ``spawn`` stop the others (SIGTERM, then SIGKILL after ``grace_period``)
    and raise :class:`~aiodist.errors.RankFailedError` naming the root cause,
    with its traceback: as ``aiodist run`` does, when the first rank to fail
    only lost another one (:class:`~aiodist.errors.PeerFailureError`, a lost
    store), ``spawn`` waits up to :data:`~aiodist.launch.supervisor.BLAME_WAIT`
    seconds for the rank that failed on its own (see
    :func:`aiodist.launch.outcome.root_cause`). ``timeout`` (seconds) bounds the whole run:
    :class:`~aiodist.errors.LaunchTimeoutError`. If the caller is interrupted
    (KeyboardInterrupt), the ranks are stopped before it propagates; no rank
    outlives the call.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be > 0")
    qualname = getattr(fn, "__qualname__", "")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"aiodist.spawn needs a function defined at the top level of a module (the new processes "
            f"import it by name); {qualname!r} is not"
        )
    ctx = multiprocessing.get_context("spawn")
    port = master_port if master_port is not None else free_port(master_addr)
    secret = fresh_secret({**os.environ, **(env or {})})  # one per job: its ranks accept only each other
    procs: list[Any] = []
    conns: list[Any] = []
    # (where the ranks mark how far their rendezvous got: aiodist.launch_marks; one of a launcher around the
    # caller would get this job's marks otherwise)
    status_dir = tempfile.mkdtemp(prefix="aiodist-spawn-")
    try:
        for rank in range(world_size):
            variables = rank_env(
                local_rank=rank, nproc_per_node=world_size, master_addr=master_addr, master_port=port, run_id=run_id
            )
            variables[STATUS_DIR_ENV] = status_dir
            overlay = merged_env({**(env or {}), **secret}, variables, nproc_per_node=world_size)
            if "OMP_NUM_THREADS" in os.environ and "OMP_NUM_THREADS" not in (env or {}):
                overlay.pop("OMP_NUM_THREADS", None)  # the caller's own setting wins, as with the launcher
            recv_end, send_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_rank_main, args=(fn, tuple(args), overlay, send_end), name=f"aiodist-rank{rank}", daemon=False
            )
            with _environ(overlay):
                proc.start()
            send_end.close()
            procs.append(proc)
            conns.append(recv_end)
        return _supervise(procs, conns, timeout=timeout, grace_period=grace_period, status_dir=status_dir)
    except BaseException:
        _stop(procs, grace_period)
        raise
    finally:
        for conn in conns:
            conn.close()
        for proc in procs:
            if proc.exitcode is not None:
                proc.close()
        shutil.rmtree(status_dir, ignore_errors=True)


_STRANDED_POLL = 0.25
"""After a rank returned without joining its rendezvous: how often (s) the others' marks are read."""


def _supervise(procs: list[Any], conns: list[Any], *, timeout: float | None, grace_period: float,
               status_dir: str) -> list[Any]:
    world_size = len(procs)
    results: list[Any] = [None] * world_size
    remote: list[tuple[str, str] | None] = [None] * world_size
    records: dict[int, dict[str, Any]] = {}  # the end records of the ranks that raised (see outcome)
    reported = [False] * world_size  # the rank's pipe has given its message or EOF
    exits: list[tuple[int, int]] = []  # (rank, exit code), in the order seen
    failed: list[int] = []  # the ranks that failed, in that order
    deadline = None if timeout is None else time.monotonic() + timeout
    settle_by = math.inf  # after a failure: until when to wait for its root cause
    clean: list[int] = []  # ranks that returned, while others ran: if one never joined, it may strand them

    def read(rank: int) -> None:
        try:
            kind, *payload = conns[rank].recv()
        except (EOFError, OSError):
            kind, payload = "eof", []
        except Exception as exc:  # the result could not be unpickled here
            kind, payload = "error", [f"cannot unpickle the return value: {type(exc).__name__}: {exc}", ""]
        reported[rank] = True
        if kind == "ok":
            results[rank] = payload[0]
            records[rank] = {"kind": "returned", "rank": rank}
        elif kind == "error":
            remote[rank] = (payload[0], payload[1])
            if len(payload) > 2 and isinstance(payload[2], dict):
                records[rank] = {**payload[2], "rank": rank}

    while len(exits) < world_size:
        now = time.monotonic()
        if failed and (_settled(exits, records) or now >= settle_by):
            break
        if deadline is not None and now >= deadline:
            _stop(procs, grace_period)
            raise LaunchTimeoutError(f"aiodist.spawn: the job exceeded its time limit of {timeout:g}s", timeout=timeout or 0.0)
        seen = {r for r, _ in exits}
        waiting = [conns[r] for r in range(world_size) if not reported[r]]
        waiting += [procs[r].sentinel for r in range(world_size) if r not in seen]  # (ready at once if it exited)
        left = min(settle_by, math.inf if deadline is None else deadline) - now
        if clean:
            left = min(left, _STRANDED_POLL)
        multiprocessing.connection.wait(waiting, timeout=None if left == math.inf else max(0.0, left))
        for rank in range(world_size):  # by rank: a fixed order
            if not reported[rank] and conns[rank].poll(0):
                read(rank)
        for rank in range(world_size):
            if rank in seen or procs[rank].exitcode is None:
                continue
            exits.append((rank, procs[rank].exitcode))
            if not reported[rank]:
                read(rank)  # exited: its message is in the pipe, or the pipe is closed (this returns at once)
            if procs[rank].exitcode != 0 or remote[rank] is not None:
                failed.append(rank)
                settle_by = min(settle_by, time.monotonic() + BLAME_WAIT)
            else:
                clean.append(rank)
        if clean and not failed:
            marks = load_marks(status_dir)
            clean = never_joined(clean, marks)
            running = [r for r in range(world_size) if procs[r].exitcode is None]
            blame = stranded(clean, running, marks)
            if blame is not None:
                _stop(procs, grace_period)
                raise _stranded_error(blame, procs[blame.rank])
    if not failed:
        return results
    blame = root_cause(exits, records)
    culprit = blame.rank if blame is not None and blame.rank in failed else failed[0]
    cause = blame.message if blame is not None and blame.rank != culprit else None  # (e.g. it returned early)
    error = _failure(culprit, procs[culprit], remote[culprit], cause=cause)
    _stop(procs, grace_period)
    raise error


def _settled(exits: list[tuple[int, int]], records: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether the root cause of a failure is known: a rank that failed on its own has exited (see the launcher's)."""
    blame = root_cause(exits, records)
    return blame is not None and blame.kind in ("raised", "signal", "exit") and any(r == blame.rank for r, _ in exits)
