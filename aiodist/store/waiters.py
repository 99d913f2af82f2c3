"""The store's blocked requests: how a waiter is parked on a key or queue, woken, and dropped.

A request that cannot complete yet (``get``, ``wait``, ``multi_get``,
``queue_pop``) becomes a :class:`_Waiter`. :class:`Waiters` is the half of
:class:`~aiodist.store.state.StoreState` that keeps them: each waiter sits in
exactly one wait list, that of the first key it still misses (or of its
queue), and is re-examined when that key is written. A waiter on several
keys keeps its place in its key list: it resumes from the key it waited for,
and checks the keys it had passed once more only when it reached the end
(one may have been deleted since), so a wait on K keys written one by one
costs O(K) in all, not O(K) per write; ``cancel`` (timeout,
cancellation) and ``drop_client`` (disconnect) remove waiters without a
reply. Wait lists are insertion-ordered dicts, woken oldest first.

What one client keeps parked is bounded by ``max_waiter_bytes`` (``None``:
no bound): each waiter is charged :func:`waiter_cost` bytes (its keys plus a
per-key and a per-request overhead, about the memory it holds) from the
moment it parks until it completes, is cancelled or times out, or its client
goes. A blocking request that would take its client over the bound is
refused at once (``code="waiter_quota_exceeded"``); nothing is parked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Final

from .quota import Ledger
from .replies import DUPLICATE_REQUEST, REQUEST_TOO_LARGE, WAITER_QUOTA_EXCEEDED, Failure, Reply

_GET: Final = 0
_WAIT: Final = 1
_MULTI_GET: Final = 2
_POP: Final = 3

_OPS: Final = ("get", "wait", "multi_get", "queue_pop")  # by kind

WAITER_OVERHEAD: Final = 512
"""Bytes charged per blocked request beside its keys (the waiter, its entries in the wait lists, its timer)."""
KEY_OVERHEAD: Final = 64
"""Bytes charged per key of a blocked request beside the key's characters (the string object, its slots)."""


def waiter_cost(keys: Sequence[str]) -> int:
    """What a blocked request on ``keys`` is charged against ``max_waiter_bytes``."""
    return WAITER_OVERHEAD + KEY_OVERHEAD * len(keys) + sum(map(len, keys))


class _Waiter:
    """One blocked request. It sits in exactly one wait list: ``self.on``, which is ``self.keys[self.at]``
    (every key before ``at`` existed when it was passed).

    ``cost``: what it is charged against its client's ``max_waiter_bytes`` (0 without that bound).
    """

    __slots__ = ("client", "request", "kind", "keys", "on", "at", "cost")

    def __init__(self, client: Hashable, request: int, kind: int, keys: Sequence[str], cost: int = 0) -> None:
        self.client = client
        self.request = request
        self.kind = kind
        self.keys = keys
        self.on = keys[0] if keys else ""
        self.at = 0
        self.cost = cost


class Waiters:
    """Parking, waking and dropping waiters; :class:`~aiodist.store.state.StoreState` holds the state named here."""

    __slots__ = ()

    _values: dict[str, bytes | bytearray]
    _queues: dict[str, deque[bytes]]
    _key_waiters: dict[str, dict[tuple[Hashable, int], _Waiter]]
    _queue_waiters: dict[str, dict[tuple[Hashable, int], _Waiter]]
    _by_client: dict[Hashable, dict[int, _Waiter]]
    _ledger: Ledger | None
    max_value_bytes: int
    max_waiter_bytes: int | None
    _waiter_bytes: dict[Hashable, int]

    @property
    def max_reply_bytes(self) -> int:
        """Most value bytes one reply carries: two values of the maximum size, like one request
        (``multi_get`` asking for more is refused with ``code="request_too_large"``)."""
        return 2 * self.max_value_bytes

    # ------------------------------------------------------------ waking

    def _exists(self, key: str) -> bool:
        if key in self._values:
            return True
        q = self._queues.get(key)
        return bool(q)

    def missing_of(self, op: str, keys: Sequence[str]) -> list[str] | None:
        """What blocking call ``op`` on several ``keys`` that timed out was still waiting for: the first 8 of
        them that do not exist (as ``op`` sees them: for ``multi_get`` a queue is no value); None for one key."""
        if len(keys) <= 1:
            return None
        if op == "multi_get":
            return [k for k in keys if k not in self._values][:8]
        return [k for k in keys if not self._exists(k)][:8]

    def _missing_from(self, kind: int, keys: Sequence[str], start: int, stop: int) -> int:
        """The index of the first of ``keys[start:stop]`` that does not exist (as ``kind`` sees it), or ``stop``."""
        if kind == _WAIT:
            exists = self._exists
            for i in range(start, stop):
                if not exists(keys[i]):
                    return i
        else:
            values = self._values
            for i in range(start, stop):
                if keys[i] not in values:
                    return i
        return stop

    def _still_missing(self, w: _Waiter) -> int:
        """Where ``w`` (just woken) waits next: the index of a key it misses, or ``len(w.keys)`` if it can complete.

        It resumes from ``w.at``; past its last key it checks the keys before
        ``w.at`` again (they existed when passed, but may have been deleted),
        in the same call, so that all of them exist at the same time.
        """
        keys = w.keys
        n = len(keys)
        at = self._missing_from(w.kind, keys, w.at, n)
        if at < n:
            return at
        before = w.at
        if before:
            at = self._missing_from(w.kind, keys, 0, before)
            if at < before:
                return at
        return n

    def _reply(self, w: _Waiter) -> Reply:
        """The reply of ``w``, which can complete now."""
        if w.kind == _GET:
            key = w.keys[0]
            return Reply(w.client, w.request, self._frozen(key, self._values[key]))
        if w.kind == _MULTI_GET:
            values = self._values
            return self._multi_get_reply(w.client, w.request, w.keys, [values[k] for k in w.keys])
        return Reply(w.client, w.request, None)

    def _frozen(self, key: str, value: bytes | bytearray) -> bytes:
        """``value``, the value of ``key``, as bytes for a reply.

        A value that ``append`` grew in place (a bytearray) is copied to bytes
        once and stored so: replies never share a buffer that a later append
        changes, and reading it again costs nothing.
        """
        if isinstance(value, bytearray):
            frozen = bytes(value)
            self._values[key] = frozen
            return frozen
        return value

    def _multi_get_reply(self, client: Hashable, request: int, keys: Sequence[str],
                         values: list[bytes | bytearray]) -> Reply:
        """``values`` (of ``keys``) for a multi_get, or a refusal if together they exceed what one reply may carry."""
        limit = self.max_reply_bytes
        total = sum(len(v) for v in values)  # (before any copy: a key asked for again and again costs nothing)
        if total <= limit:
            for i, v in enumerate(values):
                if type(v) is bytearray:  # (frozen once per key: a repeat reads the bytes stored back)
                    values[i] = self._frozen(keys[i], self._values[keys[i]])
            return Reply(client, request, values)
        return Reply(client, request, None, Failure(
            REQUEST_TOO_LARGE,
            f"the values of its {len(values)} keys hold {total} bytes, over the limit of {limit} bytes "
            f"per reply (2 x max_value_bytes; a key asked for several times counts each time); ask for fewer "
            f"keys per call",
            None,
            "max_value_bytes",
            self.max_value_bytes,
        ))

    def _park(self, w: _Waiter, at: int, table: dict[str, dict[tuple[Hashable, int], _Waiter]]) -> None:
        key = w.keys[at]
        w.on = key
        w.at = at
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
            at = self._still_missing(w)
            if at == len(w.keys):
                self._forget(w)
                out.append(self._reply(w))
            else:
                self._park(w, at, self._key_waiters)
        return out

    def _forget(self, w: _Waiter) -> None:
        mine = self._by_client.get(w.client)
        if mine is not None:
            mine.pop(w.request, None)
            if not mine:
                del self._by_client[w.client]
        if w.cost:
            self._release(w)

    def _release(self, w: _Waiter) -> None:
        """Give back what ``w`` was charged against its client's ``max_waiter_bytes``."""
        held = self._waiter_bytes.get(w.client)
        if held is not None:
            held -= w.cost
            if held > 0:
                self._waiter_bytes[w.client] = held
            else:
                del self._waiter_bytes[w.client]
        w.cost = 0

    def _register(self, client: Hashable, request: int, kind: int, keys: Sequence[str]) -> _Waiter | Failure:
        mine = self._by_client.get(client)
        if mine is not None and request in mine:
            return Failure(DUPLICATE_REQUEST, f"request id {request} is already waiting")
        limit = self.max_waiter_bytes
        cost = 0
        if limit is not None:
            cost = waiter_cost(keys)
            held = self._waiter_bytes.get(client, 0)
            if held + cost > limit:
                return self._over_budget(client, kind, keys, cost, held, limit)
            self._waiter_bytes[client] = held + cost
        if mine is None:
            mine = self._by_client[client] = {}
        w = _Waiter(client, request, kind, keys, cost)
        mine[request] = w
        return w

    def _over_budget(self, client: Hashable, kind: int, keys: Sequence[str], cost: int, held: int, limit: int) -> Failure:
        waiting = len(self._by_client.get(client, ()))
        what = f"key {keys[0][:64]!r}" if len(keys) == 1 else f"{len(keys)} keys"
        return Failure(
            WAITER_QUOTA_EXCEEDED,
            f"{_OPS[kind]} on {what} would block, and this connection's blocked requests would then hold "
            f"{held + cost} bytes ({waiting} already waiting hold {held}, this one needs {cost}), over its limit of "
            f"{limit} bytes (max_waiter_bytes); wait for fewer keys or requests at once, or raise the store "
            f"server's max_waiter_bytes (StoreServer.start(max_waiter_bytes=...), aiodist store serve "
            f"--max-waiter-bytes SIZE, aiodist run --store-limits max_waiter_bytes=SIZE)",
            keys[0][:64] if len(keys) == 1 else None,
            "max_waiter_bytes",
            limit,
        )

    def _block(self, client: Hashable, request: int, kind: int, keys: Sequence[str], at: int = 0) -> list[Reply]:
        """Park a request on ``keys[at]``, the first key it misses."""
        w = self._register(client, request, kind, keys)
        if isinstance(w, Failure):
            return [Reply(client, request, None, w)]
        self._park(w, at, self._queue_waiters if kind == _POP else self._key_waiters)
        return []

    def waiting(self, client: Hashable, request: int) -> bool:
        """Whether request ``request`` of ``client`` is blocked now."""
        mine = self._by_client.get(client)
        return mine is not None and request in mine

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
        if w.cost:
            self._release(w)
        self._unpark(w)
        return True

    def drop_client(self, client: Hashable) -> int:
        """Drop every waiter of ``client`` (it disconnected); returns how many.

        What it stored stays, counted in the total quota only.
        """
        if self._ledger is not None:
            self._ledger.forget_client(client)
        self._waiter_bytes.pop(client, None)
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
