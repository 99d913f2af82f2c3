"""Polls of an unfinished operation by code that never lets the event loop run: a loop that cannot end.

torch code waits with ``while not work.is_completed(): time.sleep(0.01)``.
Here the operation progresses only while the rank's event loop runs, and
that loop is held by the polling code itself: it would spin forever (in the
simulator too: the blocking sleep only advances the rank's clock). So each
poll of an unfinished operation (:meth:`aiodist.Work.is_completed`,
:meth:`~aiodist.Work.done`, a future's ``done()``) is noted here, with a
callback scheduled on the loop that marks when the loop ran again; after
:data:`STUCK_POLLS` polls of one operation over :data:`STUCK_SECONDS` of the
loop's clock with no step of the loop between them, the poll raises
:class:`~aiodist.errors.BlockedLoopError`. A poll from a thread without a
running loop is not watched. Code that polls once, computes, then polls
again and awaits is never mistaken for it (it polls a few times, not a
hundred).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .errors import BlockedLoopError

STUCK_POLLS = 100
"""Polls of one unfinished operation, with no step of the event loop between them, before it is called stuck."""
STUCK_SECONDS = 1.0
"""Seconds of the loop's clock those polls must span as well (a burst of polls is not a stuck loop)."""


class _Watch:
    """The polls of unfinished operations on one loop since its last step, counted per operation."""

    __slots__ = ("loop", "polls", "since", "ran")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.polls: dict[int, int] = {}  # id(operation) -> polls since the loop's last step (identity only)
        self.since = 0.0
        self.ran = [True]

    def __repr__(self) -> str:
        return f"<polls of {len(self.polls)} operation(s) since {self.since:.3f}, loop ran: {self.ran[0]}>"


_WATCH = _Watch()


def _mark(ran: list[bool]) -> None:
    ran[0] = True


def polled(target: Any, op: str) -> None:
    """``target`` (operation ``op``, not finished) was polled: raise BlockedLoopError if the loop looks held.

    The counts start again whenever the loop has run a step since the last poll (a callback scheduled at
    the first poll marks it), so polls of several operations in turn (``all(w.is_completed() for w in
    works)`` in a blocking loop) are each counted, and a single pass over many operations is not a spin.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    w = _WATCH
    if w.loop is not loop or w.ran[0]:
        w.loop, w.polls, w.since = loop, {}, loop.time()
        w.ran = [False]
        loop.call_soon(_mark, w.ran)
    key = id(target)
    n = w.polls[key] = w.polls.get(key, 0) + 1
    if n >= STUCK_POLLS and loop.time() - w.since >= STUCK_SECONDS:
        seconds = loop.time() - w.since
        w.loop, w.polls = None, {}
        raise BlockedLoopError(op, polls=n, seconds=seconds)
