"""What each rank is waiting in right now, and the last operations it ran.

Blocking operations (store calls, collectives, point-to-point) wrap their wait
in :func:`waiting_in`. That gives two things, both kept in the rank scope so
every virtual rank of the simulator has its own:

* the in-flight table (:func:`snapshot`): the simulator reports it per rank on
  deadlock, timeouts use it to say who waited for what;
* the flight recorder (:func:`recent`): the last N operations with their start
  and end times (loop clock) and how they ended, written out on a failure by
  :mod:`aiodist.flight` and merged across ranks by ``aiodist trace DIR``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import weakref
from collections.abc import Callable
from typing import Any

from .context import getenv, rank_scope

DEFAULT_RECORDER_SIZE = 256
PRUNE_SOURCES = 16
"""Sources (:func:`add_source`) kept before those whose object is gone are dropped (a process making store
clients one after another kept a dead reference for each: 640 kB per 1,000 clients)."""


class _Recorder:
    __slots__ = ("inflight", "ids", "history", "sources", "prune_at")

    def __init__(self, size: int) -> None:
        self.inflight: dict[int, dict[str, Any]] = {}
        self.ids = itertools.count()
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self.sources: list[weakref.WeakMethod[Callable[[], list[dict[str, Any]]]]] = []
        self.prune_at = PRUNE_SOURCES  # sources' length at which those whose object is gone are dropped

    def __repr__(self) -> str:
        return f"<flight recorder inflight={len(self.inflight)} history={len(self.history)}>"


def _recorder() -> _Recorder:
    scope = rank_scope()
    rec = scope.get("flight_recorder")
    if rec is None:
        size = int(getenv("AIODIST_FLIGHT_RECORDER_SIZE", str(DEFAULT_RECORDER_SIZE)) or DEFAULT_RECORDER_SIZE)
        rec = scope["flight_recorder"] = _Recorder(max(1, size))
    return rec


def _now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return 0.0


class waiting_in:  # noqa: N801 - used like a function: ``with waiting_in("op", seq=3):``
    """Register ``op`` (with details such as ``seq``, ``peer``, ``key``) while the block runs.

    ``with`` yields the entry dict, which may be updated in place (e.g. the
    peer currently awaited). On exit the entry stays in the flight recorder
    with its end time and state (``done``, ``failed: <error>`` or
    ``cancelled``). A plain class rather than a generator context manager: it
    wraps every store call and point-to-point operation, so it is on the hot
    path (collectives use :func:`begin_entry`/:func:`end_entry` directly).
    """

    __slots__ = ("_token", "entry")

    def __init__(self, op: str, **details: Any) -> None:
        self.entry = {"op": op, **details}

    def __enter__(self) -> dict[str, Any]:
        self._token = begin_entry(self.entry, _now())
        return self.entry

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        end_entry(self._token, self.entry, exc)


def begin_entry(entry: dict[str, Any], now: float) -> tuple[_Recorder, int]:
    """:class:`waiting_in` as two calls, for the hot path: register ``entry`` (started at ``now``)."""
    rec = _recorder()
    token = next(rec.ids)
    entry["start"] = now
    entry["state"] = "running"
    rec.inflight[token] = entry
    rec.history.append(entry)
    return rec, token


def end_entry(
    token: tuple[_Recorder, int], entry: dict[str, Any], error: BaseException | None, now: float | None = None
) -> None:
    """The end (at ``now``, default: the loop's time) of what :func:`begin_entry` registered (``error``: how it failed)."""
    if error is None:
        entry["state"] = "done"
    elif isinstance(error, asyncio.CancelledError):
        entry["state"] = "cancelled"
    else:
        entry["state"] = f"failed: {type(error).__name__}: {error}"
    entry["end"] = _now() if now is None else now
    token[0].inflight.pop(token[1], None)


def _copy(entry: dict[str, Any]) -> dict[str, Any]:
    e = dict(entry)
    peers = e.get("peers")
    if isinstance(peers, dict):  # a live table (peer -> count) kept by the operation
        if peers:
            e["peers"] = list(peers)
        else:
            del e["peers"]
    return e


def add_source(method: Callable[[], list[dict[str, Any]]]) -> None:
    """Also list what bound ``method`` returns in :func:`snapshot` (the calling rank's), while its object lives.

    For waits too short and too frequent to register one by one (a store client's quick calls: ``set``,
    ``add``...): asked only when a snapshot is taken, e.g. when a rank is found blocked.
    """
    rec = _recorder()
    if len(rec.sources) >= rec.prune_at:  # (amortized: each client made and dropped costs O(1))
        rec.sources = [ref for ref in rec.sources if ref() is not None]
        rec.prune_at = max(PRUNE_SOURCES, 2 * len(rec.sources))
    rec.sources.append(weakref.WeakMethod(method))


def snapshot() -> list[dict[str, Any]]:
    """The calling rank's in-flight operations, oldest first."""
    rec = _recorder()
    entries = [_copy(e) for _, e in sorted(rec.inflight.items())]
    if rec.sources:
        live = [m for m in (ref() for ref in rec.sources) if m is not None]
        if len(live) < len(rec.sources):
            rec.sources = [weakref.WeakMethod(m) for m in live]
        more = [e for m in live for e in m()]
        entries += sorted(more, key=lambda e: e.get("start", 0.0))
    return entries


def recent() -> list[dict[str, Any]]:
    """The calling rank's last operations (flight recorder), oldest first."""
    return [_copy(e) for e in _recorder().history]
