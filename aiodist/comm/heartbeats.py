"""The heartbeat driver: one timer per rank runs the :class:`.detector.FailureDetector` check.

Every interval it sends a heartbeat frame on each watched link (only if the
connection takes it at once: a full window is made of frames that are signs
of life too) and reports the peers the detector declares failed. No task, and
no timer at all while no link is watched.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from ..errors import ConnectionClosedError
from . import frames as F
from .detector import FailureDetector, Watch
from .settings import heartbeat_from_env, heartbeat_with

_HEARTBEAT = F.heartbeat()


class Heartbeats:
    """``conn_of(rank)``: the link's connection; ``on_silent(rank, how)``: the detector declared it failed."""

    __slots__ = ("_loop", "_conn_of", "_on_silent", "config", "_detector", "_timer", "_calm_from", "_calm_until", "_stopped")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn_of: Callable[[int], Any],
        on_silent: Callable[[int, str], None],
    ) -> None:
        self._loop = loop
        self._conn_of = conn_of
        self._on_silent = on_silent
        self.config = heartbeat_from_env()  # (interval, misses) or None: off
        self._detector: FailureDetector | None = None
        self._timer: asyncio.TimerHandle | None = None
        # This rank's loop runs on time from _calm_from (an interval after a check that ran late) to
        # _calm_until (an interval after the next check is due; no check pending: for ever): see stalled().
        self._calm_from = -math.inf
        self._calm_until = math.inf
        self._stopped = False

    def __repr__(self) -> str:
        return f"<Heartbeats {self.config} {self._detector!r}>"

    def configure(self, interval: float | None, misses: int | None) -> None:
        """Set the interval (s; 0: off) and misses; None keeps a value (see :func:`.settings.heartbeat_with`)."""
        self.config = heartbeat_with(self.config, interval, misses)
        if self._detector is not None:
            if self.config is None:
                self._cancel()
                self._detector = None
            else:
                self._detector.interval, self._detector.misses = self.config

    def watch(self, w: Watch) -> None:
        if self.config is None or self._stopped:
            return
        if self._detector is None:
            self._detector = FailureDetector(*self.config)
        self._detector.watch(w)
        if self._timer is None:
            due = self._loop.time() + self._detector.interval
            self._timer = self._loop.call_at(due, self._check, due)
            self._calm_until = due + self._detector.interval

    def stalled(self) -> bool:
        """Whether this rank's loop runs late: its check (and the heartbeats it sends) was due more than an
        interval ago, or ran that late less than an interval ago. The process was stopped, or its loop
        blocked (a long computation or GC pause): its peers may have declared it failed meanwhile, and
        their news may still be unread."""
        return not self._calm_from <= self._loop.time() <= self._calm_until

    def unwatch(self, rank: int) -> None:
        if self._detector is not None:
            self._detector.unwatch(rank)

    def stop(self) -> None:
        """No more checks (the transport closes)."""
        self._stopped = True
        self._cancel()

    def _cancel(self) -> None:
        self._calm_until = math.inf
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _progress(self, rank: int) -> int | None:
        conn = self._conn_of(rank)  # (None: the link lost its connection and its watch is on its way out)
        return None if conn is None else conn.progress

    def _check(self, due: float) -> None:
        self._timer = None
        self._calm_until = math.inf
        det = self._detector
        if det is None:
            return
        now = self._loop.time()
        if now > due + det.interval:
            self._calm_from = now + det.interval
        beats, silent = det.check(now, due, self._progress)
        for rank in beats:
            conn = self._conn_of(rank)
            if conn is None:
                continue
            try:
                conn.try_send(_HEARTBEAT)
            except ConnectionClosedError:
                pass
        for rank, how in silent:
            self._on_silent(rank, how)
        if det.watching() and not self._stopped:
            due = now + det.interval
            self._timer = self._loop.call_at(due, self._check, due)
            self._calm_until = due + det.interval
