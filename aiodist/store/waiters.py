"""The store's blocked requests: how a waiter is parked on a key or queue, woken, and dropped.

A request that cannot complete yet (``get``, ``wait``, ``multi_get``,
``queue_pop``) becomes a :class:`_Waiter`. :class:`Waiters` is the half of
:class:`~aiodist.store.state.StoreState` that keeps them: each waiter sits in
exactly one wait list, that of the first key it still misses (or of its
queue), and is re-examined when that key is written; ``cancel`` (timeout,
cancellation) and ``drop_client`` (disconnect) remove waiters without a
reply. Wait lists are insertion-ordered dicts, woken oldest first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any, Final

from .quota import Ledger
from .replies import DUPLICATE_REQUEST, Failure, Reply

_GET: Final = 0
_WAIT: Final = 1
_MULTI_GET: Final = 2
_POP: Final = 3


class _Waiter:
    """One blocked request. It sits in exactly one wait list: ``self.on``."""

    __slots__ = ("client", "request", "kind", "keys", "on")

    def __init__(self, client: Hashable, request: int, kind: int, keys: Sequence[str]) -> None:
        self.client = client
        self.request = request
        self.kind = kind
        self.keys = keys
        self.on = keys[0] if keys else ""


class Waiters:
    """Parking, waking and dropping waiters; :class:`~aiodist.store.state.StoreState` holds the state named here."""

    __slots__ = ()

    _values: dict[str, bytes]
    _queues: dict[str, deque[bytes]]
    _key_waiters: dict[str, dict[tuple[Hashable, int], _Waiter]]
    _queue_waiters: dict[str, dict[tuple[Hashable, int], _Waiter]]
    _by_client: dict[Hashable, dict[int, _Waiter]]
    _ledger: Ledger | None

    # ------------------------------------------------------------ waking

    def _exists(self, key: str) -> bool:
        if key in self._values:
            return True
        q = self._queues.get(key)
        return bool(q)

    def _first_missing(self, w: _Waiter) -> str | None:
        values = self._values
        if w.kind == _WAIT:
            for key in w.keys:
                if not self._exists(key):
                    return key
        else:
            for key in w.keys:
                if key not in values:
                    return key
        return None

    def _result(self, w: _Waiter) -> Any:
        if w.kind == _GET:
            return self._values[w.keys[0]]
        if w.kind == _MULTI_GET:
            values = self._values
            return [values[k] for k in w.keys]
        return None

    def _park(self, w: _Waiter, key: str, table: dict[str, dict[tuple[Hashable, int], _Waiter]]) -> None:
        w.on = key
        lst = table.get(key)
        if lst is None:
            lst = table[key] = {}
        lst[(w.client, w.request)] = w

    def _wake(self, key: str, out: list[Reply] | None) -> list[Reply]:
        """Re-examine the key waiters parked on ``key`` (it was just written)."""
        lst = self._key_waiters.pop(key, None)
        if lst is None:
            return out if out is not None else []
        if out is None:
            out = []
        for w in list(lst.values()):
            missing = self._first_missing(w)
            if missing is None:
                self._forget(w)
                out.append(Reply(w.client, w.request, self._result(w)))
            else:
                self._park(w, missing, self._key_waiters)
        return out

    def _forget(self, w: _Waiter) -> None:
        mine = self._by_client.get(w.client)
        if mine is not None:
            mine.pop(w.request, None)
            if not mine:
                del self._by_client[w.client]

    def _register(self, client: Hashable, request: int, kind: int, keys: Sequence[str]) -> _Waiter | Failure:
        mine = self._by_client.get(client)
        if mine is None:
            mine = self._by_client[client] = {}
        elif request in mine:
            return Failure(DUPLICATE_REQUEST, f"request id {request} is already waiting")
        w = _Waiter(client, request, kind, keys)
        mine[request] = w
        return w

    def _block(self, client: Hashable, request: int, kind: int, keys: Sequence[str], missing: str) -> list[Reply]:
        w = self._register(client, request, kind, keys)
        if isinstance(w, Failure):
            return [Reply(client, request, None, w)]
        self._park(w, missing, self._queue_waiters if kind == _POP else self._key_waiters)
        return []

    # ------------------------------------------------------------ cancellation

    def cancel(self, client: Hashable, request: int) -> bool:
        """Drop the waiter of ``(client, request)``; False if it is not waiting (any more)."""
        mine = self._by_client.get(client)
        if mine is None:
            return False
        w = mine.pop(request, None)
        if w is None:
            return False
        if not mine:
            del self._by_client[client]
        self._unpark(w)
        return True

    def drop_client(self, client: Hashable) -> int:
        """Drop every waiter of ``client`` (it disconnected); returns how many.

        What it stored stays, counted in the total quota only.
        """
        if self._ledger is not None:
            self._ledger.forget_client(client)
        mine = self._by_client.pop(client, None)
        if not mine:
            return 0
        for w in mine.values():
            self._unpark(w)
        return len(mine)

    def _unpark(self, w: _Waiter) -> None:
        table = self._queue_waiters if w.kind == _POP else self._key_waiters
        lst = table.get(w.on)
        if lst is not None:
            lst.pop((w.client, w.request), None)
            if not lst:
                del table[w.on]
