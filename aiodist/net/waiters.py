"""Tasks of a connection waiting until something happens: one future each, woken together.

What a connection's ``drained()`` waits in (:class:`Waiters`), and the one
way a waiting future is woken (:func:`wake`: nothing happens to one that is
gone or done already, e.g. cancelled).
"""

from __future__ import annotations

import asyncio

__all__ = ["Waiters", "wake"]


def wake(fut: asyncio.Future[None] | None) -> None:
    """Resolve ``fut``, unless there is none or it is done already (its waiter was cancelled)."""
    if fut is not None and not fut.done():
        fut.set_result(None)


class Waiters:
    """Tasks waiting for the same thing: :meth:`wait` until :meth:`wake_all` (which wakes every one waiting)."""

    __slots__ = ("_loop", "_futs")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._futs: dict[asyncio.Future[None], None] = {}  # (in arrival order; removal in O(1): thousands may wait)

    def __repr__(self) -> str:
        return f"<Waiters waiting={len(self._futs)}>"

    def __len__(self) -> int:
        return len(self._futs)

    async def wait(self) -> None:
        """Wait until the next :meth:`wake_all`. Cancellation leaves nothing behind (this waiter leaves the list)."""
        fut = self._loop.create_future()
        self._futs[fut] = None
        try:
            await fut
        finally:
            self._futs.pop(fut, None)

    def wake_all(self) -> None:
        """Wake every task waiting now (a task that waits again from there waits for the next call)."""
        futs, self._futs = self._futs, {}
        for fut in futs:
            wake(fut)
