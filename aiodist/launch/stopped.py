"""What a launched rank says when it is stopped by a signal: the aiodist operations it was waiting in.

A hung job that is killed (``timeout``, a scheduler's limit, Ctrl-C of the
launcher, or the launcher stopping the others after a failure) would end
without a word about where each rank was stuck. The bootstrap of a launched
rank (:mod:`aiodist.launch_bootstrap`) installs :func:`install`: on SIGTERM
the rank writes one line, e.g. ``rank 1: stopped by SIGTERM while waiting
in recv group=world src=0 tag=0 (for 118.2s)``, and then dies of the signal
as it would have (its exit status is unchanged). A program that installs its
own SIGTERM handler keeps it; a rank waiting in no aiodist operation says
nothing.

When the launcher stops the rank because another rank failed, it says which
first (:func:`aiodist.launch.outcome.stop_reason`). Before dying, the rank
then tells its connected peers, in its ``bye``, that it leaves because of that
failure, stopped by its launcher (at most :data:`LEAVE_GRACE` seconds, on its
event loop; a timer ends the wait if the loop is busy): otherwise ranks of
other nodes, whose own launchers know nothing of that failure, would only see
its connections break and blame it. A rank without a process group, or one
that already left, or a program with its own SIGALRM handler, dies at once as
before.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .. import inflight
from ..flight import describe_entry
from .outcome import stop_reason

__all__ = ["LEAVE_GRACE", "describe", "install"]

MAX_SHOWN = 4
"""Operations named at most (the oldest first: what the rank waits in longest)."""

LEAVE_GRACE = 1.0
"""Seconds a rank stopped because of another rank's failure spends telling its peers so before it dies."""

_LEAVING: list[asyncio.Task[None]] = []  # (a reference to the task that says bye, while it runs)


def describe(rank: str, signame: str, entries: Sequence[dict[str, Any]], now: float | None) -> str | None:
    """The line for ``rank`` stopped by ``signame`` while waiting in ``entries`` (None: in nothing). Pure."""
    if not entries:
        return None
    shown = []
    for e in entries[:MAX_SHOWN]:
        start = e.get("start")
        since = f" (for {now - start:.1f}s)" if now is not None and isinstance(start, float) and now >= start else ""
        shown.append(describe_entry(e) + since)
    more = f"; and {len(entries) - MAX_SHOWN} more" if len(entries) > MAX_SHOWN else ""
    return f"rank {rank}: stopped by {signame} while waiting in {'; '.join(shown)}{more}"


def install() -> None:
    """On SIGTERM, say what this rank waits in, then die of the signal (main thread, default handler only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _stopped)


def _stopped(signum: int, frame: FrameType | None) -> None:
    try:
        loop_time = inflight._now()
        line = describe(os.environ.get("RANK", "?"), signal.Signals(signum).name, inflight.snapshot(),
                        loop_time if loop_time > 0 else None)
        if line is not None:
            os.write(2, (line + "\n").encode(errors="replace"))  # (unbuffered: safe amid a write to stderr)
    except Exception:  # noqa: BLE001, S110 - saying where it was is a courtesy: the signal's effect must follow
        pass
    try:
        if _leave_first(signum):
            return
    except Exception:  # noqa: BLE001, S110 - as above
        pass
    _die(signum)


def _die(signum: int) -> None:
    """Die of ``signum``, as without a handler."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _leave_first(signum: int) -> bool:
    """If the launcher said which failure it stops this rank for: say it to the peers, then die (True: under way)."""
    reason = stop_reason()
    if reason is None:
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    from ..context import get_default_group

    world = get_default_group()
    transport = getattr(world, "transport", None)
    if transport is None or transport.closed or reason[0] == transport.rank:
        return False
    if (str(transport.rank), str(transport.world_size)) != (os.environ.get("RANK"), os.environ.get("WORLD_SIZE")):
        return False  # (a world of its own making, e.g. shrunk in place: the launcher's rank numbers are not its)
    if signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL:  # (the program's own alarm: not ours to take)
        return False
    signal.signal(signum, lambda s, f: _die(signum))  # a second signal: at once
    signal.signal(signal.SIGALRM, lambda s, f: _die(signum))  # a loop too busy to say bye: no longer than that
    signal.setitimer(signal.ITIMER_REAL, LEAVE_GRACE + 0.5)
    loop.call_soon_threadsafe(_start_leaving, loop, transport, reason, signum)
    return True


def _start_leaving(loop: asyncio.AbstractEventLoop, transport: Any, reason: tuple[int, str], signum: int) -> None:
    _LEAVING.append(loop.create_task(_leave(transport, reason, signum)))


async def _leave(transport: Any, reason: tuple[int, str], signum: int) -> None:
    try:
        await transport.leave_stopped(reason[0], reason[1], grace=LEAVE_GRACE)
    except BaseException:  # noqa: BLE001, S110 - a courtesy: the signal's effect must follow
        pass
    finally:
        _die(signum)
