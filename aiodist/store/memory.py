"""An in-process store: the same state machine as the server, waits on loop futures.

Useful for tests and single-process programs. Every task of the event loop
that holds a reference sees the same store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import (
    ConnectionClosedLocally,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    StoreRequestError,
    StoreTimeoutError,
)
from ..inflight import waiting_in
from .base import Store, Timeout, Value, as_amount, as_key, as_keys, as_timeout, as_value, pop_now
from .state import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES, Reply, StoreState

_ME = 0  # the state machine's client id for this store's callers


class MemoryStore(Store):
    """A store living in this process (no server, no network).

    ``timeout`` is the default for blocking calls. Same semantics, limits and
    errors as :class:`~aiodist.store.client.TCPStore`.
    """

    def __init__(
        self,
        *,
        timeout: float = 300.0,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.timeout = as_timeout(timeout, 300.0)
        self.state = StoreState(max_key_bytes=max_key_bytes, max_value_bytes=max_value_bytes)
        # request id -> (future, op, key) of each waiting call
        self._waiting: dict[int, tuple[asyncio.Future[Reply], str, str]] = {}
        self._next_id = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<MemoryStore keys={len(self.state)} waiting={len(self._waiting)}{' closed' if self._closed else ''}>"

    async def __aenter__(self) -> MemoryStore:
        return self

    # ------------------------------------------------------------ core

    def _deliver(self, replies: list[Reply], rid: int) -> Reply | None:
        """Resolve other callers' waiters; return the reply to request ``rid`` if present."""
        mine = None
        for r in replies:
            if r.request == rid:
                mine = r
                continue
            entry = self._waiting.pop(r.request, None)
            if entry is None:
                continue
            fut, op, key = entry
            if not fut.done():
                fut.set_result(r)
            elif op == "queue_pop" and r.failure is None:
                # Its task was cancelled (or timed out) just now and will not take the value.
                self._deliver(self.state.queue_unpop(key, r.value, _ME), -1)
        return mine

    def _now(self, op: str, fn: Callable[..., list[Reply]], *args: Any) -> Any:
        """Run a non-blocking operation."""
        if self._closed:
            raise ConnectionClosedLocally("the memory store was closed")
        rid = self._next_id
        self._next_id = rid + 1
        mine = self._deliver(fn(_ME, rid, *args), rid)
        assert mine is not None
        return _unwrap(mine, op)

    async def _blocking(self, op: str, keys: list[str], timeout: Timeout, fn: Callable[..., list[Reply]], *args: Any) -> Any:
        """Run a blocking operation; wait for it at most ``timeout`` seconds.

        Cancellation: the waiter is withdrawn; a value popped for a cancelled
        ``queue_pop`` goes back to the head of its queue.
        """
        if self._closed:
            raise ConnectionClosedLocally("the memory store was closed")
        t = as_timeout(timeout, self.timeout)
        rid = self._next_id
        self._next_id = rid + 1
        mine = self._deliver(fn(_ME, rid, *args), rid)
        if mine is not None:
            return _unwrap(mine, op)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (fut, op, keys[0] if keys else "")
        details: dict[str, Any] = {"key": keys[0]} if len(keys) == 1 else {"keys": keys}
        try:
            with waiting_in(f"store.{op}", **details):
                async with asyncio.timeout(t):
                    reply = await fut
        except TimeoutError:
            self._waiting.pop(rid, None)
            if fut.done() and not fut.cancelled():  # the value arrived as the clock ran out: keep it
                return _unwrap(fut.result(), op)
            self.state.cancel(_ME, rid)
            raise StoreTimeoutError(keys, t, op, missing=self.state.missing_of(op, keys)) from None
        except asyncio.CancelledError:
            self._waiting.pop(rid, None)
            if not self.state.cancel(_ME, rid) and op == "queue_pop" and fut.done() and not fut.cancelled():
                r = fut.result()
                if r.failure is None:
                    self._deliver(self.state.queue_unpop(keys[0], r.value, _ME), -1)
            raise
        return _unwrap(reply, op)

    async def close(self) -> None:
        """Close the store: waiting calls and later calls raise ConnectionClosedLocally."""
        if self._closed:
            return
        self._closed = True
        waiting = [entry[0] for entry in self._waiting.values()]
        self._waiting.clear()
        self.state.drop_client(_ME)
        for fut in waiting:
            if not fut.done():
                fut.set_exception(ConnectionClosedLocally("the memory store was closed"))

    # ------------------------------------------------------------ the API

    async def set(self, key: str, value: Value) -> None:
        self._now("set", self.state.set, as_key(key), as_value(value))

    async def get(self, key: str, *, timeout: Timeout = None) -> bytes:
        key = as_key(key)
        return await self._blocking("get", [key], timeout, self.state.get, key)  # type: ignore[no-any-return]

    async def add(self, key: str, amount: int) -> int:
        return self._now("add", self.state.add, as_key(key), as_amount(amount))  # type: ignore[no-any-return]

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self._now("compare_set", self.state.compare_set, as_key(key), as_value(expected), as_value(desired))  # type: ignore[no-any-return]

    async def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        ks = as_keys(keys)
        await self._blocking("wait", ks, timeout, self.state.wait, ks)

    async def check(self, keys: Sequence[str]) -> bool:
        return self._now("check", self.state.check, as_keys(keys))  # type: ignore[no-any-return]

    async def delete_key(self, key: str) -> bool:
        return self._now("delete_key", self.state.delete_key, as_key(key))  # type: ignore[no-any-return]

    async def num_keys(self) -> int:
        return self._now("num_keys", self.state.num_keys)  # type: ignore[no-any-return]

    async def append(self, key: str, value: Value) -> None:
        self._now("append", self.state.append, as_key(key), as_value(value))

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        ks = as_keys(keys)
        return await self._blocking("multi_get", ks, timeout, self.state.multi_get, ks)  # type: ignore[no-any-return]

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        ks = as_keys(keys)
        if isinstance(values, (str, bytes, bytearray, memoryview)):
            raise InvalidArgumentTypeError("multi_set expects a sequence of values")
        vs = [as_value(v) for v in values]
        if len(vs) != len(ks):
            raise InvalidArgumentError(f"multi_set got {len(ks)} keys but {len(vs)} values")
        self._now("multi_set", self.state.multi_set, ks, vs)

    async def queue_push(self, key: str, value: Value) -> None:
        self._now("queue_push", self.state.queue_push, as_key(key), as_value(value))

    async def queue_pop(self, key: str, block: bool = True, *, timeout: Timeout = None) -> bytes:
        if block is not True:
            return await pop_now(self, key, block)
        key = as_key(key)
        return await self._blocking("queue_pop", [key], timeout, self.state.queue_pop, key)  # type: ignore[no-any-return]

    async def queue_len(self, key: str) -> int:
        return self._now("queue_len", self.state.queue_len, as_key(key))  # type: ignore[no-any-return]


def _unwrap(r: Reply, op: str) -> Any:
    if r.failure is not None:
        f = r.failure
        raise StoreRequestError(
            f"store refused {op}: {f.message}", code=f.code, op=op, key=f.key, limit=f.limit, limit_value=f.maximum
        )
    return r.value
