"""Deadlines that let a step already due go first.

A process that was not running for a while (blocked in ``time.sleep``, a long
GC pause, SIGSTOP) finds, when it runs again, everything that came due
meanwhile: the event an operation waited for *and* its deadline. asyncio runs
the I/O callbacks first (what waited is now done, its task's wakeup queued),
then the timer, which cancels the task before it can take that step: the
operation reports a timeout although it completed in time. :func:`about_to_resume`
tells that case apart; :class:`Deadline` is ``asyncio.timeout`` with that
courtesy: when its time comes while the task's awaited future is done, the
task's step goes first and the deadline is looked at again after it.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

__all__ = ["Deadline", "about_to_resume"]


def about_to_resume(task: asyncio.Task[Any] | None) -> bool:
    """Is ``task`` (not running now) due to resume: the future it waits on is done (its wakeup is queued)?"""
    if task is None or task.done():
        return False
    waiter = getattr(task, "_fut_waiter", None)  # (asyncio's Task: the future its step waits on)
    return waiter is not None and bool(waiter.done())


class Deadline:
    """``async with Deadline(seconds):`` -- :func:`asyncio.timeout`, but patient with a step already due.

    When the deadline comes and the task is about to resume (see
    :func:`about_to_resume`), the check runs again right after that step: if
    the block finished in it, nothing expires. Otherwise the task is cancelled
    and the block raises :class:`TimeoutError`, as with ``asyncio.timeout``.
    ``None``: no deadline. Cancellation from elsewhere passes through unchanged.
    """

    __slots__ = ("_delay", "_task", "_loop", "_handle", "_expired", "_cancelling", "_grace")

    PATIENCE = 8
    """Steps let go first in a row at most (one is the usual case: the step that finishes the block)."""

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.Handle | None = None
        self._expired = False
        self._cancelling = 0
        self._grace = 0

    def __repr__(self) -> str:
        state = "expired" if self._expired else "armed" if self._handle is not None else "idle"
        return f"<Deadline {state} delay={self._delay}>"

    def expired(self) -> bool:
        """Did the deadline cancel the block?"""
        return self._expired

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline must be used inside a task")
        self._task, self._loop = task, asyncio.get_running_loop()
        self._cancelling = task.cancelling()
        if self._delay is not None:
            self._handle = self._loop.call_at(self._loop.time() + self._delay, self._due)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task = self._task
        assert task is not None
        # (as asyncio.timeout: our cancellation is taken back whatever the block did with it)
        if self._expired and task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def _due(self) -> None:
        assert self._loop is not None
        if about_to_resume(self._task) and self._grace < self.PATIENCE:  # it came with the deadline: its step first
            self._grace += 1
            self._handle = self._loop.call_soon(self._due)
            return
        self._handle = None
        self._expired = True
        assert self._task is not None
        self._task.cancel()
