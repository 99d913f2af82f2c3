"""The store client's operations: each checks its arguments, encodes its request and decodes the reply.

:class:`ClientOps` is the half of :class:`~aiodist.store.client.TCPStore`
that knows the operations of :class:`~aiodist.store.base.Store`: keys and
values are checked against the limits the server announced (an oversized
one is refused here, with the same :class:`~aiodist.errors.StoreRequestError`
the server would send), small values travel in the header and larger ones
as the frame's payload, and an error reply becomes the matching exception.
Sending a request and waiting for its reply is the client's business
(:meth:`TCPStore._call`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ProtocolError,
    QueueEmptyError,
    StoreRequestError,
    StoreTimeoutError,
)
from ..inflight import waiting_in
from . import protocol as P
from .base import AMOUNT_LIMIT, Store, Timeout, Value, as_amount, as_block, as_key, as_keys, as_timeout, as_value
from .state import KEY_TOO_LARGE, VALUE_TOO_LARGE
from .state import REQUEST_TOO_LARGE as REQUEST_TOO_LARGE

_MAX_KEYS_BYTES = 512 * 1024
"""Bound on the keys of one request: they travel in the frame header, which the wire limits to 1 MiB."""


def _keylist(keys: str | list[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else keys


REGISTERED_CALLS = frozenset({"get", "wait", "multi_get", "queue_pop"})
"""The calls below that register themselves in :mod:`aiodist.inflight` while they wait (they may block for
long: ``with waiting_in(...)``); a client lists its other calls waiting for a reply on its own
(:meth:`aiodist.store.client.TCPStore._quick_calls`). Keep in step with those ``with`` blocks."""


class ClientOps(Store):
    """The operations of a store client; :class:`~aiodist.store.client.TCPStore` holds the state named here."""

    __slots__ = ()

    timeout: float
    max_key_bytes: int
    max_value_bytes: int
    _short_key: int

    if TYPE_CHECKING:
        async def _call(self, header: dict[str, Any], payload: bytes | None, op: str, keys: str | list[str],
                        timeout: float) -> tuple[dict[str, Any], memoryview | None]: ...

        def _broken_reply(self, op: str, why: str) -> ProtocolError: ...

    def _failed(self, h: dict[str, Any], op: str, keys: str | list[str], timeout: float) -> Exception:
        if h.get("err") == P.TIMEOUT:
            missing = h.get("missing")  # (what the server says: kept only if well-formed: at most 8 of the keys)
            asked = _keylist(keys)
            if type(missing) is not list or len(missing) > min(8, len(asked)) or not all(
                    type(k) is str for k in missing) or not set(missing) <= set(asked):
                missing = None
            return StoreTimeoutError(asked, timeout, op, missing=missing)
        return P.reply_error(h, op)

    # A reply of the wrong shape (a broken server, or traffic altered on the path): ProtocolError, and the
    # connection is closed (see TCPStore._broken_reply), never a bare TypeError or a value of the wrong type.

    def _values(self, r: dict[str, Any], payload: memoryview | None, op: str, count: int) -> list[bytes]:
        try:
            vs = P.unpack_values(r, payload)
        except P.BadMessage as e:
            raise self._broken_reply(op, str(e)) from None
        if len(vs) != count:
            raise self._broken_reply(op, f"it carries {len(vs)} values, not {count}")
        return vs

    def _value(self, r: dict[str, Any], payload: memoryview | None, op: str) -> bytes:
        v = r.get("v")
        if type(v) is list and len(v) == 1 and type(v[0]) is bytes:  # (the usual case: one small value)
            return v[0]
        return self._values(r, payload, op, 1)[0]

    def _int(self, r: dict[str, Any], op: str) -> int:
        n = r.get("r")
        if type(n) is not int:
            raise self._broken_reply(op, f"its result is {type(n).__name__}, not an integer")
        return n

    def _bool(self, r: dict[str, Any], op: str) -> bool:
        b = r.get("r")
        if type(b) not in (bool, int):
            raise self._broken_reply(op, f"its result is {type(b).__name__}, not a boolean")
        return bool(b)

    def _check_key(self, raw: Any, op: str) -> str:
        key = as_key(raw)
        if len(key) * 4 > self.max_key_bytes and len(key.encode("utf-8", "surrogatepass")) > self.max_key_bytes:
            raise StoreRequestError(
                f"store refused {op}: key of {len(key.encode('utf-8', 'surrogatepass'))} bytes exceeds the limit of {self.max_key_bytes} bytes",
                code=KEY_TOO_LARGE,
                op=op,
                key=key[:64],
            )
        return key

    def _check_keys(self, keys: Any, op: str) -> list[str]:
        """Keys for a multi-key call; refuses lists too large for one request header."""
        ks = [self._check_key(k, op) for k in as_keys(keys)]
        chars = sum(len(k) for k in ks) + 8 * len(ks)
        if chars * 4 > _MAX_KEYS_BYTES:
            size = sum(len(k.encode("utf-8", "surrogatepass")) + 8 for k in ks)
            if size > _MAX_KEYS_BYTES:
                raise StoreRequestError(
                    f"store refused {op}: {len(ks)} keys of {size} bytes in total exceed the limit of "
                    f"{_MAX_KEYS_BYTES} bytes per request; split the call",
                    code=REQUEST_TOO_LARGE,
                    op=op,
                )
        return ks

    def _check_value(self, key: str, value: bytes, op: str) -> None:
        if len(value) > self.max_value_bytes:
            raise StoreRequestError(
                f"store refused {op}: value of {len(value)} bytes for key {key[:64]!r} exceeds the limit of {self.max_value_bytes} bytes",
                code=VALUE_TOO_LARGE,
                op=op,
                key=key[:64],
            )

    async def set(self, key: str, value: Value) -> None:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "set")
        if type(value) is not bytes:
            value = as_value(value)
        if len(value) <= P.HEADER_VALUES_LIMIT:
            r, _ = await self._call({"op": "set", "k": key, "v": [value]}, None, "set", key, self.timeout)
        else:
            self._check_value(key, value, "set")
            h: dict[str, Any] = {"op": "set", "k": key}
            body = P.pack_values(h, (value,))
            r, _ = await self._call(h, body, "set", key, self.timeout)
        if "err" in r:
            raise self._failed(r, "set", key, self.timeout)

    async def get(self, key: str, *, timeout: Timeout = None) -> bytes:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "get")
        t = self.timeout if timeout is None else as_timeout(timeout, self.timeout)
        with waiting_in("store.get", key=key):
            r, payload = await self._call({"op": "get", "k": key, "t": t}, None, "get", key, t)
        if "err" in r:
            raise self._failed(r, "get", key, t)
        return self._value(r, payload, "get")

    async def add(self, key: str, amount: int) -> int:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "add")
        if type(amount) is not int or not -AMOUNT_LIMIT <= amount < AMOUNT_LIMIT:
            amount = as_amount(amount)
        r, _ = await self._call({"op": "add", "k": key, "n": amount}, None, "add", key, self.timeout)
        if "err" in r:
            raise self._failed(r, "add", key, self.timeout)
        return self._int(r, "add")

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "compare_set")
        exp = expected if type(expected) is bytes else as_value(expected)
        des = desired if type(desired) is bytes else as_value(desired)
        if len(exp) > self.max_value_bytes or len(des) > self.max_value_bytes:
            self._check_value(key, exp, "compare_set")
            self._check_value(key, des, "compare_set")
        h: dict[str, Any] = {"op": "compare_set", "k": key}
        body = P.pack_values(h, (exp, des))
        r, payload = await self._call(h, body, "compare_set", key, self.timeout)
        if "err" in r:
            raise self._failed(r, "compare_set", key, self.timeout)
        return self._value(r, payload, "compare_set")

    async def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        ks = self._check_keys(keys, "wait")
        t = as_timeout(timeout, self.timeout)
        with waiting_in("store.wait", keys=ks):
            r, _ = await self._call({"op": "wait", "ks": ks, "t": t}, None, "wait", ks, t)
        if "err" in r:
            raise self._failed(r, "wait", ks, t)

    async def check(self, keys: Sequence[str]) -> bool:
        ks = self._check_keys(keys, "check")
        r, _ = await self._call({"op": "check", "ks": ks}, None, "check", ks, self.timeout)
        if "err" in r:
            raise self._failed(r, "check", ks, self.timeout)
        return self._bool(r, "check")

    async def delete_key(self, key: str) -> bool:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "delete_key")
        r, _ = await self._call({"op": "delete_key", "k": key}, None, "delete_key", key, self.timeout)
        if "err" in r:
            raise self._failed(r, "delete_key", key, self.timeout)
        return self._bool(r, "delete_key")

    async def num_keys(self) -> int:
        r, _ = await self._call({"op": "num_keys"}, None, "num_keys", [], self.timeout)
        if "err" in r:
            raise self._failed(r, "num_keys", [], self.timeout)
        return self._int(r, "num_keys")

    async def append(self, key: str, value: Value) -> None:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "append")
        value = as_value(value)
        self._check_value(key, value, "append")
        h: dict[str, Any] = {"op": "append", "k": key}
        body = P.pack_values(h, (value,))
        r, _ = await self._call(h, body, "append", key, self.timeout)
        if "err" in r:
            raise self._failed(r, "append", key, self.timeout)

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        ks = self._check_keys(keys, "multi_get")
        t = as_timeout(timeout, self.timeout)
        with waiting_in("store.multi_get", keys=ks):
            r, payload = await self._call({"op": "multi_get", "ks": ks, "t": t}, None, "multi_get", ks, t)
        if "err" in r:
            raise self._failed(r, "multi_get", ks, t)
        return self._values(r, payload, "multi_get", len(ks))

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        ks = self._check_keys(keys, "multi_set")
        if isinstance(values, (str, bytes, bytearray, memoryview)):
            raise InvalidArgumentTypeError("multi_set expects a sequence of values")
        vs = [as_value(v) for v in values]
        if len(vs) != len(ks):
            raise InvalidArgumentError(f"multi_set got {len(ks)} keys but {len(vs)} values")
        total = 0
        for k, v in zip(ks, vs):
            self._check_value(k, v, "multi_set")
            total += len(v)
        if total > 2 * self.max_value_bytes:
            raise StoreRequestError(
                f"store refused multi_set: {total} bytes of values exceed the limit of "
                f"{2 * self.max_value_bytes} bytes per request (2 x max value); split the call",
                code=REQUEST_TOO_LARGE,
                op="multi_set",
            )
        h: dict[str, Any] = {"op": "multi_set", "ks": ks}
        body = P.pack_values(h, vs)
        r, _ = await self._call(h, body, "multi_set", ks, self.timeout)
        if "err" in r:
            raise self._failed(r, "multi_set", ks, self.timeout)

    async def queue_push(self, key: str, value: Value) -> None:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "queue_push")
        value = as_value(value)
        self._check_value(key, value, "queue_push")
        h: dict[str, Any] = {"op": "queue_push", "k": key}
        body = P.pack_values(h, (value,))
        r, _ = await self._call(h, body, "queue_push", key, self.timeout)
        if "err" in r:
            raise self._failed(r, "queue_push", key, self.timeout)

    async def queue_pop(self, key: str, block: bool = True, *, timeout: Timeout = None) -> bytes:
        if block is not True:
            as_block(block)
            return await self._pop_now(key)
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "queue_pop")
        t = as_timeout(timeout, self.timeout)
        with waiting_in("store.queue_pop", key=key):
            r, payload = await self._call({"op": "queue_pop", "k": key, "t": t}, None, "queue_pop", key, t)
        if "err" in r:
            raise self._failed(r, "queue_pop", key, t)
        return self._value(r, payload, "queue_pop")

    async def _pop_now(self, key: str) -> bytes:
        """``queue_pop(key, block=False)``: the server looks once (a timeout of 0) and its answer is waited for
        as any request's (the store's timeout): only the server's own "empty" is a QueueEmptyError, not a
        reply slower than a blocking call's grace."""
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "queue_pop")
        r, payload = await self._call({"op": "queue_pop", "k": key, "t": 0.0}, None, "queue_pop", key, self.timeout)
        if "err" in r:
            if r.get("err") == P.TIMEOUT:
                raise QueueEmptyError(key)
            raise self._failed(r, "queue_pop", key, 0.0)
        return self._value(r, payload, "queue_pop")

    async def queue_len(self, key: str) -> int:
        if type(key) is not str or len(key) > self._short_key or not key.isascii():
            key = self._check_key(key, "queue_len")
        r, _ = await self._call({"op": "queue_len", "k": key}, None, "queue_len", key, self.timeout)
        if "err" in r:
            raise self._failed(r, "queue_len", key, self.timeout)
        return self._int(r, "queue_len")
