"""A log line per interval instead of one per event: for events a peer can cause by the thousand.

A refused connection, a failed accept, a client cut off: each is worth
knowing, none is worth a line each when a scan or a flood makes thousands.
:class:`RateLog` logs the first at once, then counts, and logs the count with
the latest message at the end of each interval (loop clock), so nothing is
dropped silently.
"""

from __future__ import annotations

import asyncio
import logging


class RateLog:
    """Log an event at once, then at most once per ``interval`` seconds with the count since (loop clock).

    A burst's tail is logged by a timer at the end of the interval, so the
    count is never lost; :meth:`close` cancels it.
    """

    def __init__(self, logger: logging.Logger, level: int, interval: float) -> None:
        self._log = logger
        self._level = level
        self._interval = interval
        self._next = -float("inf")
        self._count = 0
        self._last = ""
        self._timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<RateLog pending={self._count} timer={'armed' if self._timer else 'idle'}>"

    def event(self, message: str) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._last = message
        if now >= self._next and self._timer is None:
            self._log.log(self._level, "%s", message)
            self._next = now + self._interval
            return
        self._count += 1
        if self._timer is None:
            self._timer = loop.call_at(self._next, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if self._count:
            n, self._count = self._count, 0
            self._log.log(self._level, "%s (%d such in the last %gs)", self._last, n, self._interval)
            self._next = asyncio.get_running_loop().time() + self._interval

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._count:
            n, self._count = self._count, 0
            self._log.log(self._level, "%s (%d such since the last report)", self._last, n)
