"""The store client: :class:`TCPStore`, many concurrent requests over one connection.

Each call gets a request id and replies are matched to calls by id, so
``asyncio.gather`` over thousands of calls pipelines them on one connection.
Replies are dispatched straight from the connection's frame callback to their
calls' futures; a watcher task notices the end of the connection. A
housekeeping task (also owned by the client) pings an idle connection so the
server's idle limit never drops a long-lived client, sends cancellations
(never waiting on a full socket buffer), and fails any call the server does
not answer within its timeout plus a grace period (a hung or partitioned
server). A call whose request waits for room in a full socket buffer is bound
by the same deadline.

The operations themselves (argument checks, encoding, errors) are
:class:`~aiodist.store.client_ops.ClientOps`.

Connecting runs the store's authenticated handshake (see
:mod:`.admission`): the client proves the job's secret and refuses a server
that cannot prove it.

If the server closes the connection or dies, every pending call and every
later call raises :class:`~aiodist.errors.StoreConnectionLost` naming the
server's address; nothing hangs.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from typing import Any

from .. import auth, inflight, tls
from ..arguments import port_number
from ..context import current_network
from ..errors import (
    ConnectionClosedError,
    ConnectionClosedLocally,
    ConnectionLost,
    InvalidArgumentError,
    ProtocolError,
    StoreConnectionLost,
    StoreConnectTimeoutError,
    StoreTimeoutError,
)
from ..net.base import Connection, Frame
from ..wire import DEFAULT_MAX_FRAME_SIZE
from . import protocol as P
from .admission import BusyError, client_handshake
from .base import as_timeout
from .client_ops import REQUEST_TOO_LARGE as REQUEST_TOO_LARGE
from .client_ops import REGISTERED_CALLS, ClientOps, _keylist
from .limits import PRE_AUTH_MAX_FRAME
from .state import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES
from .torch_form import open_torch_form

log = logging.getLogger("aiodist.store")

_GRACE = 1.0
"""At most this many extra seconds a call waits for the server's own timeout reply before giving up locally
(a twentieth of the call's timeout when that is less, but at least :data:`_MIN_GRACE`): both say the same, so
the grace covers the reply's way back only; a stopped or hung server fails a call of timeout ``t`` by
``t + min(1, max(0.05, t/20))`` s."""

_MIN_GRACE = 0.05
"""The least grace: the server's answer to a call with a timeout of 0 (or a few ms) must have time to come back.
With none, such a call always expired here first, though the server had answered (with the value, even: a
``queue_pop(timeout=0)`` on a queue holding items failed, and the item it had popped went back to the queue's
head later, after another consumer had taken the next one)."""


def _grace(timeout: float) -> float:
    return min(_GRACE, max(_MIN_GRACE, timeout / 20))

_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 1.0
_HANDSHAKE_ATTEMPT = 15.0
"""Seconds one connection attempt may spend in the handshake (a little more than a server's own handshake
timeout, 10 s by default): a connection whose replies vanish is given up and a new one tried, within
``timeout``, instead of waiting the whole ``timeout`` in one attempt."""
_HANDSHAKE_CLOSED = {
    False: "a server that requires TLS closes a connection without it: give the client ssl=",
    True: "a server without TLS, or one that refused this side's certificate, closes it: see the server's log",
}
"""What a server that closes a connection in its handshake may mean (by: this side uses TLS)."""

# pending call: (future, deadline, op, key or keys, timeout)
_Call = tuple["asyncio.Future[tuple[dict[str, Any], memoryview | None]]", float, str, "str | list[str]", float]


MIN_PING_INTERVAL = 0.01
"""Seconds between a client's pings at the least, whatever idle limit the welcome states (the welcome is
not authenticated: a forged tiny limit must not make the client spin, pinging the server)."""


def ping_interval(idle: Any) -> float | None:
    """How often to ping a server that drops connections silent for ``idle`` seconds (None: never)."""
    if type(idle) not in (int, float) or not idle > 0 or math.isinf(idle):
        return None
    return max(float(idle) / 4, MIN_PING_INTERVAL)


class TCPStore(ClientOps):
    """A client of a :class:`~aiodist.store.server.StoreServer`.

    Create with :meth:`connect`. ``timeout`` is the default for blocking calls
    and the bound on every call's wait for the server. torch's constructor,
    ``await TCPStore(host, port, world_size, is_master, timeout)``, starts the
    server in the master and connects (:mod:`aiodist.store.torch_form`).
    """

    __slots__ = ("host", "port", "timeout", "_conn", "_loop", "_ping_interval", "max_key_bytes", "max_value_bytes",
                 "_short_key", "_pending", "_next_id", "_sent", "_control", "_abandoned", "_wake", "_wake_at",
                 "_error", "_silent", "_closed_locally", "_server_said", "_farewell", "_housekeeper", "_watcher",
                 "_owned_server", "__weakref__")  # (aiodist.inflight lists its calls while it lives)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """torch's form (a host name first): a coroutine that opens the store, to await; else the client itself."""
        if args and isinstance(args[0], str) or "host_name" in kwargs:
            return open_torch_form(cls, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self, conn: Connection | None = None, *torch_form: Any, host: str = "", port: int = 0, timeout: float = 300.0,
        hello: dict[str, Any] | None = None, **torch_options: Any,
    ) -> None:
        if torch_form or torch_options or conn is None or isinstance(conn, str) or hello is None:
            raise TypeError(
                "TCPStore takes torch's form, awaited: `store = await aiodist.TCPStore(host, port, world_size, "
                "is_master, timeout)` (host a str); or one process serves the store, `server = await "
                "aiodist.StoreServer.start(host, port)`, and every process connects, `store = await "
                "aiodist.TCPStore.connect(host, port, timeout=...)`; or let init_process_group make the job's store"
            )
        self.host = host
        self.port = port
        self.timeout = timeout
        self._owned_server: Any = None  # (torch's form, in the master: the server this store stops when it closes)
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._ping_interval: float | None = ping_interval(hello.get("idle"))
        mk = hello.get("max_key")
        mv = hello.get("max_value")
        self.max_key_bytes: int = mk if type(mk) is int and mk > 0 else DEFAULT_MAX_KEY_BYTES
        self.max_value_bytes: int = mv if type(mv) is int and mv > 0 else DEFAULT_MAX_VALUE_BYTES
        self._short_key = self.max_key_bytes // 4  # keys this short never exceed the limit
        self._pending: dict[int, _Call] = {}
        self._next_id = 0
        self._sent = 0
        self._control: deque[tuple[dict[str, Any], bytes | None]] = deque()
        self._abandoned: dict[int, str | None] = {}  # cancelled blocking calls awaiting the server's ack
        self._wake = asyncio.Event()
        self._wake_at = math.inf
        self._error: str | None = None  # why the connection is unusable
        self._silent = False  # a call expired unanswered and nothing came since (the server stopped or hung)
        self._closed_locally = False
        self._server_said: str | None = None
        self._farewell: dict[str, Any] = {}  # (a closing notice's host_rank, culprit, cause)
        self._housekeeper = self._loop.create_task(self._housekeeping(), name=f"aiodist.store.housekeeping[{host}:{port}]")
        # Replies are dispatched from the connection's frame callback (no
        # reader task, no future per frame); the watcher only notices the end.
        conn.set_frame_handler(self._dispatch)
        self._watcher = self._loop.create_task(self._watch(), name=f"aiodist.store.watch[{host}:{port}]")
        inflight.add_source(self._quick_calls)

    def _quick_calls(self) -> list[dict[str, Any]]:
        """The calls waiting for their reply that are not registered in :mod:`aiodist.inflight` on their own
        (``set``, ``add``, ``compare_set``...: all but the blocking ones), as in-flight entries."""
        return [{"op": f"store.{op}", ("key" if isinstance(keys, str) else "keys"): keys,
                 "start": deadline - timeout - _grace(timeout), "state": "running"}
                for _, deadline, op, keys, timeout in self._pending.values() if op not in REGISTERED_CALLS]

    # ------------------------------------------------------------ connecting

    @classmethod
    async def connect(
        cls, host: str, port: int, *, timeout: float = 300.0, secret: Any = auth.FROM_ENVIRONMENT, ssl: Any = None
    ) -> TCPStore:
        """Connect to the server at ``host:port``, retrying with backoff while it is not up.

        ``timeout`` bounds the whole connection attempt and is the default
        timeout of later blocking calls. ``secret`` (default: from the
        environment, see :func:`aiodist.auth.resolve_secret`; ``None``: no
        authentication, with a warning) is proved to the server, which must
        prove it back; ``ssl`` (an :class:`ssl.SSLContext` for the client
        side, or an :class:`aiodist.tls.TLS`) adds TLS. Raises :class:`StoreConnectTimeoutError` (a
        TimeoutError) when the server stays unreachable,
        :class:`~aiodist.auth.AuthenticationError` when the server cannot prove
        the secret or refuses ours, :class:`~aiodist.errors.StoreError` when
        what answers is not a compatible store server.
        Cancellation leaves nothing behind (a half-open connection is closed).
        """
        port = port_number(port, "TCPStore.connect", any_free=False)
        timeout = as_timeout(timeout, 300.0)
        if not timeout > 0:
            raise InvalidArgumentError(f"timeout must be > 0, got {timeout!r}")
        key = auth.resolve_secret(secret)
        context = tls.client_side(ssl)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        net = current_network()
        backoff = _BACKOFF_FIRST
        last: Exception | None = None
        attempts = 0
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise StoreConnectTimeoutError(
                    f"could not connect to the store server at {host}:{port} within {timeout:g}s "
                    f"({attempts} attempts; last error: {str(last) or type(last).__name__})",
                    host=host,
                    port=port,
                    timeout=timeout,
                )
            attempts += 1
            conn: Connection | None = None
            try:
                # Small frames until the server proved the secret; then replies of any size.
                conn = await net.connect((host, port), timeout=remaining, max_frame_size=PRE_AUTH_MAX_FRAME, ssl=context)
                async with asyncio.timeout(min(deadline - loop.time(), _HANDSHAKE_ATTEMPT)):
                    reply = await client_handshake(conn, key, f"{host}:{port}")
                conn.set_max_frame_size(DEFAULT_MAX_FRAME_SIZE)
                return cls(conn, host=host, port=port, timeout=timeout, hello=reply)
            except (ConnectionLost, TimeoutError, BusyError) as e:
                if conn is not None:
                    conn.abort()
                if isinstance(e, TimeoutError) and conn is not None:
                    last = TimeoutError("it accepted the connection but did not answer the handshake "
                                        "(stopped, hung, overloaded or not a store server?)")
                elif isinstance(e, ConnectionLost) and conn is not None:  # accepted, then closed in the handshake
                    last = ConnectionLost(f"{e} during the handshake ({_HANDSHAKE_CLOSED[context is not None]})")
                else:
                    last = e
            except BaseException:
                if conn is not None:
                    conn.abort()
                raise
            delay = min(backoff, deadline - loop.time())
            if delay > 0:
                await asyncio.sleep(delay)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    def __repr__(self) -> str:
        state = "closed" if self._error is not None else "open"
        return f"<TCPStore {self.host}:{self.port} {state} pending={len(self._pending)}>"

    async def __aenter__(self) -> TCPStore:
        return self

    # ------------------------------------------------------------ the call path

    def _dead(self) -> ConnectionClosedError:
        assert self._error is not None
        if self._closed_locally:
            return ConnectionClosedLocally(self._error)
        return StoreConnectionLost(self._error, host=self.host, port=self.port, **self._farewell)

    async def _call(
        self, header: dict[str, Any], payload: bytes | None, op: str, keys: str | list[str], timeout: float
    ) -> tuple[dict[str, Any], memoryview | None]:
        """Send one request and wait for its reply frame.

        Cancellation: a blocking request is withdrawn (cancelled on the server;
        a value already popped for a ``queue_pop`` is put back at the head of
        its queue, charged to this client: if that is over its quota or the
        server's total, the value is dropped and only the server's log says
        so); a write that was sent (``set``, ``add``, ``compare_set``...)
        is applied all the same.
        """
        if self._error is not None:
            raise self._dead()
        rid = self._next_id
        self._next_id = rid + 1
        header["id"] = rid
        loop = self._loop
        fut: asyncio.Future[tuple[dict[str, Any], memoryview | None]] = loop.create_future()
        deadline = loop.time() + timeout + _grace(timeout)
        self._pending[rid] = (fut, deadline, op, keys, timeout)
        if deadline < self._wake_at:
            self._wake.set()
        try:
            if not self._conn.send_nowait(header, payload):
                await self._drained(rid, deadline)
            self._sent += 1
            return await fut
        except asyncio.CancelledError:
            self._withdraw(rid, fut, op, keys)
            _retrieved(fut)
            raise
        except ConnectionClosedError as e:  # (while waiting for room in the socket buffer)
            self._pending.pop(rid, None)
            _retrieved(fut)  # (a close may have failed it meanwhile: the error raised here says the same)
            if self._error is None:
                self._fail(f"the store server at {self.host}:{self.port} closed the connection: {e}")
            raise self._dead() from None
        except Exception:  # (the request could not be sent: nothing waits for its reply)
            self._pending.pop(rid, None)
            _retrieved(fut)
            raise

    async def _drained(self, rid: int, deadline: float) -> None:
        """Wait for room in the socket buffer, no later than call ``rid``'s deadline (then it expires)."""
        try:
            async with asyncio.timeout_at(deadline):
                await self._conn.drained()
        except TimeoutError:
            self._expire(rid)  # the caller then finds the StoreTimeoutError in its future

    def _withdraw(self, rid: int, fut: asyncio.Future[Any], op: str, keys: str | list[str]) -> None:
        """The caller of request ``rid`` went away: tell the server, save a popped value."""
        if self._pending.pop(rid, None) is not None:
            if op in P.BLOCKING_OPS and self._error is None:
                self._abandoned[rid] = _keylist(keys)[0] if op == "queue_pop" else None
                self._control.append(({"op": "cancel", "c": rid}, None))
                self._wake.set()
            return
        if op == "queue_pop" and fut.done() and not fut.cancelled() and fut.exception() is None:
            h, payload = fut.result()
            if "err" not in h and self._error is None:
                self._unpop(_keylist(keys)[0], h, payload)

    def _unpop(self, key: str, h: dict[str, Any], payload: memoryview | None) -> None:
        value = P.unpack_values(h, payload)[0]
        msg: dict[str, Any] = {"op": "unpop", "k": key}
        body = P.pack_values(msg, (value,))
        self._control.append((msg, body))
        self._wake.set()


    # ------------------------------------------------------------ background tasks

    def _dispatch(self, frame: Frame) -> None:
        """Hand a reply to the call waiting for it (also the connection's frame handler)."""
        h = frame.header
        self._silent = False
        rid = h.get("id")
        call = self._pending.pop(rid, None) if type(rid) is int else None
        if call is not None and not call[0].done():
            call[0].set_result((h, frame.payload))
            return
        self._settle(call, h, frame.payload)

    def _settle(self, call: _Call | None, h: dict[str, Any], payload: memoryview | None) -> None:
        """A frame that is not the awaited reply of a pending call."""
        if call is None:
            self._unsolicited(h, payload)
        elif call[2] == "queue_pop" and "err" not in h and self._error is None:
            # Its task was cancelled just now and will not take the value: put it back.
            self._unpop(_keylist(call[3])[0], h, payload)

    async def _watch(self) -> None:
        """With the frame handler installed, recv() only raises, once the connection ends."""
        try:
            await self._conn.recv()
        except ConnectionClosedError as e:
            self._lost(e)
            return
        raise AssertionError("a store reply bypassed the frame handler")

    def _lost(self, e: ConnectionClosedError) -> None:
        if self._closed_locally or self._error is not None:
            return
        said = f" ({self._server_said})" if self._server_said else ""
        why = str(e)
        why = "" if why.endswith(" closed the connection") else f": {why}"  # (not the same words twice)
        self._fail(f"the store server at {self.host}:{self.port} closed the connection{said}{why}")

    def _unsolicited(self, h: dict[str, Any], payload: memoryview | None) -> None:
        op = h.get("op")
        if op == "pong":
            return
        if op == "cancelled":
            c = h.get("c")
            if type(c) is int:
                self._abandoned.pop(c, None)
            return
        if op == "error":
            self._server_said = f"server said: {h.get('msg', h.get('err'))}"
            self._farewell = _farewell(h)
            return
        rid = h.get("id")
        if type(rid) is int and rid in self._abandoned:
            # The reply crossed our cancel: a popped value must go back to its queue.
            key = self._abandoned.pop(rid)
            if key is not None and "err" not in h and self._error is None:
                self._unpop(key, h, payload)
            return
        # A late reply to a call that timed out locally or was cancelled: drop it.

    def _broken_reply(self, op: str, why: str) -> ProtocolError:
        """A reply to ``op`` of the wrong shape: this connection cannot be trusted any more; it is reset."""
        message = f"the store server at {self.host}:{self.port} sent a malformed reply to {op} ({why})"
        if self._error is None:
            self._fail(f"{message}: the connection was reset")
        self._conn.abort()
        return ProtocolError(message)

    def _fail(self, message: str) -> None:
        """Make the client unusable: fail every pending call with ``message``."""
        if self._error is None:
            self._error = message
        calls = list(self._pending.values())
        self._pending.clear()
        for call in calls:
            fut = call[0]
            if not fut.done():
                fut.set_exception(self._dead())
        self._wake.set()

    async def _housekeeping(self) -> None:
        """Ping when idle, send control messages, expire calls the server never answered."""
        loop = self._loop
        conn = self._conn
        sent_at_tick = -1
        next_ping = loop.time() + self._ping_interval if self._ping_interval is not None else math.inf
        try:
            while self._error is None:
                # Never waits for the socket buffer (a server that stopped
                # reading must not stop the expiry below): control frames are
                # few (one per withdrawn call, one ping per interval) and the
                # connection queues them.
                while self._control:
                    msg, body = self._control.popleft()
                    conn.send_nowait(msg, body)
                    self._sent += 1
                now = loop.time()
                if now >= next_ping:
                    assert self._ping_interval is not None
                    if self._sent == sent_at_tick:
                        conn.send_nowait({"op": "ping"})
                        self._sent += 1
                    sent_at_tick = self._sent
                    next_ping = now + self._ping_interval
                wake_at = self._expire_overdue(now)
                self._wake_at = min(wake_at, next_ping)
                if self._control or self._error is not None:
                    continue
                self._wake.clear()
                try:
                    async with asyncio.timeout_at(None if math.isinf(self._wake_at) else self._wake_at):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        except ConnectionClosedError:
            return

    def _expire_overdue(self, now: float) -> float:
        """Fail calls past their deadline; return the earliest remaining deadline."""
        earliest = math.inf
        overdue: list[int] = []
        for rid, call in self._pending.items():
            deadline = call[1]
            if deadline <= now:
                overdue.append(rid)
            elif deadline < earliest:
                earliest = deadline
        for rid in overdue:
            self._expire(rid)
        return earliest

    def _expire(self, rid: int) -> None:
        """Call ``rid`` got no answer in time: fail it, withdraw it from the server."""
        call = self._pending.pop(rid, None)
        if call is None:
            return
        fut, _, op, keys, timeout = call
        self._silent = True
        if not fut.done():
            fut.set_exception(StoreTimeoutError(_keylist(keys), timeout, op, waiting=op in P.BLOCKING_OPS))
        if op in P.BLOCKING_OPS and self._error is None:
            self._abandoned[rid] = _keylist(keys)[0] if op == "queue_pop" else None
            self._control.append(({"op": "cancel", "c": rid}, None))
            self._wake.set()

    # ------------------------------------------------------------ closing

    async def close(self) -> None:
        """Close the connection; pending calls raise ConnectionClosedLocally. Idempotent.

        An orderly close lingers up to 1 s for the server's end of stream; a server
        that has not answered since a call expired (stopped, hung) is not waited
        for: the connection is reset.
        """
        if self._error is None:
            self._closed_locally = True
            self._fail(f"the store client for {self.host}:{self.port} was closed")
        if self._silent:
            self._conn.abort()
        else:
            self._conn.close()
        tasks = [self._watcher, self._housekeeper]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(1.0):
                await self._conn.wait_closed()
        except TimeoutError:
            pass
        server, self._owned_server = self._owned_server, None
        if server is not None:
            await server.close()


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark an error ``fut`` may hold as retrieved (its caller gets another one): no "never retrieved" log."""
    if fut.done() and not fut.cancelled():
        fut.exception()


_MAX_CAUSE = 2000
"""Characters kept of a closing notice's ``cause``."""


def _farewell(h: dict[str, Any]) -> dict[str, Any]:
    """A closing notice's account of its host's departure (unchecked input: kept only if well-formed)."""
    host, culprit, cause = h.get("h"), h.get("r"), h.get("w")
    if type(host) is not int or host < 0:
        return {}
    return {"host_rank": host, "culprit": culprit if type(culprit) is int and culprit >= 0 else None,
            "cause": cause[:_MAX_CAUSE] if type(cause) is str else None}
