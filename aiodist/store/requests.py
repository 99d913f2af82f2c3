"""The store server's request handlers: check a request's fields, run it through the state machine.

:class:`Requests` is the half of :class:`~aiodist.store.server.StoreServer`
that knows the operations: one handler per op (the common case of the hot
ops checked in one go, anything else field by field, a bad request raising
:class:`~aiodist.store.protocol.BadMessage`), the control messages (ping,
cancel, unpop), and the timeouts of blocking requests, armed on the loop clock
when a request starts waiting. Where replies go is the server's business
(:meth:`Requests._post`, :meth:`Requests._post_frame`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from ..net.base import Connection
from ..shown import brief, first_few
from . import protocol as P
from .state import KEY_TOO_LARGE, VALUE_TOO_LARGE, Failure, Reply, StoreState

log = logging.getLogger("aiodist.store")

_INF = float("inf")

_Handler = Callable[["Session", dict[str, Any], "memoryview | None"], list[Reply]]


class Session:
    """One client connection: its id, pending timers and the replies owed to it.

    Replies produced by *other* connections' requests (a ``set`` waking this
    client's ``get``) are posted here and written by this session's writer
    task, so one slow client never stalls another.
    """

    __slots__ = ("cid", "conn", "timers", "outbox", "outbox_bytes", "writer", "wake", "last", "idle_timer")

    def __init__(self, cid: int, conn: Connection) -> None:
        self.cid = cid
        self.conn = conn
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.outbox: deque[Reply | dict[str, Any]] = deque()
        self.outbox_bytes = 0  # what the outbox holds, as :func:`_size` estimates it
        self.writer: asyncio.Task[None] | None = None
        self.wake: asyncio.Event | None = None
        self.last = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<Session {self.cid} {self.conn.peer} outbox={len(self.outbox)}/{self.outbox_bytes}B waiting={len(self.timers)}>"


class Requests:
    """The operations of a store server over ``state`` (see the module doc)."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self._handlers: dict[str, _Handler] = {
            "set": self._set,
            "get": self._get,
            "add": self._add,
            "compare_set": self._compare_set,
            "append": self._append,
            "check": self._check,
            "wait": self._wait,
            "delete_key": self._delete_key,
            "num_keys": self._num_keys,
            "multi_get": self._multi_get,
            "multi_set": self._multi_set,
            "queue_push": self._queue_push,
            "queue_pop": self._queue_pop,
            "queue_len": self._queue_len,
        }

    def _post(self, r: Reply) -> None:
        """Deliver ``r`` to its client (the server's writer does it)."""
        raise NotImplementedError

    def _post_frame(self, session: Session, item: Reply | dict[str, Any]) -> None:
        """Queue a reply or a raw header for ``session``."""
        raise NotImplementedError

    def _dispatch(self, replies: list[Reply]) -> None:
        for r in replies:
            self._post(r)

    def _handle(self, session: Session, header: dict[str, Any], payload: Any) -> list[Any]:
        """Run one request through its handler; raises P.BadMessage for a bad one."""
        op = header.get("op")
        handler = self._handlers.get(op) if type(op) is str else None
        if handler is None:
            return self._special(session, header, payload)
        return handler(session, header, payload)

    def _special(self, session: Session, header: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        op = header.get("op")
        if op == "ping":
            self._post_frame(session, {"op": "pong"})
            return []
        if op == "cancel":
            rid = header.get("c")
            if type(rid) is not int:
                raise P.BadMessage("cancel needs an integer 'c'")
            if self.state.cancel(session.cid, rid):
                self._disarm(session, rid)
            # Acknowledge through the outbox: it follows any reply already owed for ``rid``.
            self._post_frame(session, {"op": "cancelled", "c": rid})
            return []
        if op == "unpop":
            key = P.field_key(header)
            values = P.unpack_values(header, payload)
            if len(values) != 1:
                raise P.BadMessage("unpop needs exactly one value")
            value = values[0]
            refused = self.state.unpop_refusal(session.cid, key, value)
            if refused is None:
                self._dispatch(self.state.queue_unpop(key, value, session.cid))
            elif refused.code in (KEY_TOO_LARGE, VALUE_TOO_LARGE):  # no such value can have been popped
                raise P.BadMessage(f"unpop: {refused.message}")
            else:  # (no reply to send it in: the value the client gives back is dropped, and said so)
                self._unpop_dropped(session, refused.message)
            return []
        raise P.BadMessage(f"unknown op {brief(op)}", code=P.UNKNOWN_OP, request=_rid(header))

    # ------------------------------------------------------------ blocking helpers

    def _arm(self, session: Session, rid: int, replies: list[Reply], timeout: float | None, keys: list[str], op: str) -> list[Reply]:
        """After a blocking op: if it now waits, arm its timeout on the loop clock."""
        if replies or timeout is None:
            return replies
        loop = asyncio.get_running_loop()
        old = session.timers.pop(rid, None)
        if old is not None:
            old.cancel()
        session.timers[rid] = loop.call_later(timeout, self._expire, session, rid, keys, timeout, op)
        return replies

    def _disarm(self, session: Session, rid: int) -> None:
        handle = session.timers.pop(rid, None)
        if handle is not None:
            handle.cancel()

    def _unpop_dropped(self, session: Session, why: str) -> None:
        """A value ``session``'s client gave back was dropped (over a quota); the server logs it, rate-limited."""
        log.info("store client %s gave back a popped value that was dropped: %s", session.conn.peer, why)

    def _expire(self, session: Session, rid: int, keys: list[str], timeout: float, op: str) -> None:
        session.timers.pop(rid, None)
        if self.state.cancel(session.cid, rid):
            # (at most 8 keys named: the reply stays small; what it holds counts against max_outbox_bytes)
            msg = f"{op} timed out after {timeout:g}s waiting for key(s) {first_few(keys)}"
            session_reply = Reply(session.cid, rid, None, _timeout_failure(msg, keys, self.state.missing_of(op, keys)))
            self._post(session_reply)

    # ------------------------------------------------------------ op handlers

    def _set(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        rid, key, vs = h.get("id"), h.get("k"), h.get("v")
        if type(rid) is int and type(key) is str and type(vs) is list and len(vs) == 1 and type(vs[0]) is bytes:
            return self.state.set(s.cid, rid, key, vs[0])  # the common case, checked in one go
        return self.state.set(s.cid, P.field_id(h), P.field_key(h), _one_value(h, payload, "set"))

    def _get(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        rid, key, t = h.get("id"), h.get("k"), h.get("t")
        if type(rid) is int and type(key) is str and (t is None or (type(t) is float and 0.0 <= t < _INF)):
            # The common case, checked in one go (a NaN fails the range test).
            replies = self.state.get(s.cid, rid, key)
            return replies if replies else self._arm(s, rid, replies, t, [key], "get")
        rid = P.field_id(h)
        key = P.field_key(h)
        timeout = P.field_timeout(h)
        replies = self.state.get(s.cid, rid, key)
        return replies if replies else self._arm(s, rid, replies, timeout, [key], "get")

    def _add(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        rid, key, n = h.get("id"), h.get("k"), h.get("n")
        if type(rid) is int and type(key) is str and type(n) is int:
            return self.state.add(s.cid, rid, key, n)
        return self.state.add(s.cid, P.field_id(h), P.field_key(h), P.field_int(h))

    def _compare_set(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        values = P.unpack_values(h, payload)
        if len(values) != 2:
            raise P.BadMessage("compare_set needs exactly two values (expected, desired)", request=_rid(h))
        return self.state.compare_set(s.cid, P.field_id(h), P.field_key(h), values[0], values[1])

    def _append(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        return self.state.append(s.cid, P.field_id(h), P.field_key(h), _one_value(h, payload, "append"))

    def _check(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        return self.state.check(s.cid, P.field_id(h), P.field_keys(h))

    def _wait(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        rid = P.field_id(h)
        keys = P.field_keys(h)
        timeout = P.field_timeout(h)
        return self._arm(s, rid, self.state.wait(s.cid, rid, keys), timeout, keys, "wait")

    def _delete_key(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        return self.state.delete_key(s.cid, P.field_id(h), P.field_key(h))

    def _num_keys(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        return self.state.num_keys(s.cid, P.field_id(h))

    def _multi_get(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        rid = P.field_id(h)
        keys = P.field_keys(h)
        timeout = P.field_timeout(h)
        return self._arm(s, rid, self.state.multi_get(s.cid, rid, keys), timeout, keys, "multi_get")

    def _multi_set(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        keys = P.field_keys(h)
        values = P.unpack_values(h, payload)
        if len(values) != len(keys):
            raise P.BadMessage(f"multi_set got {len(keys)} keys but {len(values)} values", request=_rid(h))
        return self.state.multi_set(s.cid, P.field_id(h), keys, values)

    def _queue_push(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        return self.state.queue_push(s.cid, P.field_id(h), P.field_key(h), _one_value(h, payload, "queue_push"))

    def _queue_pop(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        rid = P.field_id(h)
        key = P.field_key(h)
        timeout = P.field_timeout(h)
        return self._arm(s, rid, self.state.queue_pop(s.cid, rid, key), timeout, [key], "queue_pop")

    def _queue_len(self, s: Session, h: dict[str, Any], payload: memoryview | None) -> list[Reply]:
        return self.state.queue_len(s.cid, P.field_id(h), P.field_key(h))


def _one_value(h: dict[str, Any], payload: memoryview | None, op: str) -> bytes:
    """The single value a set/append/queue_push request carries (BadMessage otherwise)."""
    values = P.unpack_values(h, payload)
    if len(values) != 1:
        raise P.BadMessage(f"{op} needs exactly one value", request=_rid(h))
    return values[0]


def _rid(header: dict[str, Any]) -> int | None:
    rid = header.get("id")
    return rid if type(rid) is int else None


def _timeout_failure(message: str, keys: list[str], missing: list[str] | None = None) -> Failure:
    return Failure(P.TIMEOUT, message, keys[0] if len(keys) == 1 else None, missing=missing)
