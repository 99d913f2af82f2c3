"""The store server: the state machine of :mod:`.state` behind the network seam.

It listens through ``aiodist.context.current_network()`` (never raw asyncio
sockets), so the simulator runs this very server on its virtual network.

Per connection: admission against the connection limit, the authenticated
handshake within ``handshake_timeout`` (see :mod:`.admission`), then requests
in any number, answered in completion order. A request that violates the
protocol (unknown op, wrong types, missing fields) is answered with an error
when its id can be read, then THAT connection is closed and one line is
logged on the ``aiodist.store`` logger; every other client keeps being
served. A connection with no waiting request that sends nothing for
``idle_timeout`` seconds is closed (clients learn the limit in the handshake
reply and ping). A client that leaves its replies unread past
``send_timeout``, or lets more than ``max_outbox_bytes`` of them pile up, is
cut off. Timeouts of blocking requests run here, on the loop clock, so a
value is either delivered or timed out, never both. Every limit is in
:class:`~aiodist.store.limits.StoreLimits`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any, Final

from .. import auth, tls
from ..arguments import port_number
from ..context import current_network
from ..errors import ConnectionClosedError, ConnectionLost
from ..net.base import Connection, Listener
from . import protocol as P
from .admission import Admission, send_quietly, server_handshake
from .limits import PRE_AUTH_MAX_FRAME, StoreLimits
from .requests import Requests, Session
from .state import Failure, Reply, StoreState

log = logging.getLogger("aiodist.store")

DEFAULT_HANDSHAKE_TIMEOUT = StoreLimits.handshake_timeout
DEFAULT_IDLE_TIMEOUT = StoreLimits.idle_timeout

class StoreServer(Requests):
    """A key-value store server. Create with :meth:`start`; stop with :meth:`close`."""

    def __init__(self, *, limits: StoreLimits, secret: bytes | None) -> None:
        super().__init__(
            StoreState(
                max_key_bytes=limits.max_key_bytes,
                max_value_bytes=limits.max_value_bytes,
                max_client_bytes=limits.max_client_bytes,
                max_total_bytes=limits.max_total_bytes,
                max_waiter_bytes=limits.max_waiter_bytes,
            )
        )
        self.limits = limits
        self.handshake_timeout = limits.handshake_timeout
        self.idle_timeout = limits.idle_timeout
        self.authenticated = secret is not None
        self._secret = secret
        self._admission = Admission(limits, "?")
        self._listener: Listener | None = None
        self._sessions: dict[int, Session] = {}
        self._next_cid = 0
        self._closed = False
        self.host = ""
        self.port = 0

    @classmethod
    async def start(
        cls,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret: Any = auth.FROM_ENVIRONMENT,
        ssl: Any = None,
        limits: StoreLimits | None = None,
        **options: Any,
    ) -> StoreServer:
        """Listen on ``host:port`` (port 0: a free port, see ``.port``) and serve.

        ``secret`` (default: from the environment, see
        :func:`aiodist.auth.resolve_secret`; ``None``: no authentication, with
        a warning) is what every client must prove it knows. ``ssl`` (an
        :class:`ssl.SSLContext` for the server side, or an
        :class:`aiodist.tls.TLS`) adds TLS. ``limits`` and keyword ``options``
        named like its fields (``max_connections=``, ``idle_timeout=``, ...;
        ``None`` switches one off where allowed) set the limits (see
        :class:`~aiodist.store.limits.StoreLimits`).
        """
        port = port_number(port, "StoreServer.start", any_free=True)
        limits = (limits or StoreLimits()).replace(**options)
        server = cls(limits=limits, secret=auth.resolve_secret(secret))
        server._listener = await current_network().listen(
            (host, port),
            server._serve,
            max_frame_size=PRE_AUTH_MAX_FRAME,  # raised for each connection once it authenticated
            handshake_timeout=limits.handshake_timeout,
            ssl=tls.server_side(ssl),
        )
        server.host, server.port = server._listener.address
        server._admission = Admission(limits, f"{server.host}:{server.port}")
        return server

    def __repr__(self) -> str:
        auth_mode = "authenticated" if self.authenticated else "INSECURE"
        return (
            f"<StoreServer {self.host}:{self.port} {auth_mode} clients={len(self._sessions)}"
            f" connections={self._admission.open} keys={len(self.state)}>"
        )

    @property
    def clients(self) -> int:
        """Client connections open now (authenticated sessions; the host's own client counts)."""
        return len(self._sessions)

    @property
    def joined(self) -> int:
        """Clients that have authenticated since the server started (open now or gone)."""
        return self._next_cid

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    async def close(self, *, reason: str | None = None, host: int | None = None, culprit: int | None = None,
                    cause: str | None = None) -> None:
        """Stop listening and close every client connection (their pending calls fail).

        ``reason``: why the store goes away, told to every client first (an
        ``error`` notice "closing": its errors then say it, e.g. that the
        store's host left the job after a failure: ``host`` is its rank, ``culprit``
        the rank whose failure that was and ``cause`` how, if known; see
        :class:`~aiodist.errors.StoreConnectionLost`).
        Idempotent. Cancellation while closing may leave handler tasks
        finishing in the background; the listener still owns them.
        """
        if self._closed:
            return
        self._closed = True
        if reason is not None:
            notice = P.error_frame("closing", reason, host=host, culprit=culprit, cause=cause)
            for session in list(self._sessions.values()):
                try:
                    session.conn.send_nowait(notice)
                except ConnectionClosedError:
                    pass
        try:
            if self._listener is not None:
                await self._listener.aclose()
        finally:
            self._admission.close()

    async def __aenter__(self) -> StoreServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ connections

    async def _serve(self, conn: Connection) -> None:
        admission = self._admission
        ticket = admission.enter(conn.peer, conn.abort)
        if ticket is None:
            await send_quietly(conn, P.busy())
            return
        try:
            try:
                async with asyncio.timeout(self.handshake_timeout):
                    if not await server_handshake(conn, self._secret, admission):
                        return
            except TimeoutError:
                admission.unauthenticated(conn.peer, f"no complete handshake within {self.handshake_timeout:g}s")
                return
            except ConnectionClosedError:
                admission.unauthenticated(conn.peer, "it left during the handshake (or a newer one took its place)")
                return
            admission.authenticated(ticket)
            await self._serve_authenticated(conn)
        finally:
            admission.leave(ticket)

    async def _serve_authenticated(self, conn: Connection) -> None:
        conn.set_max_frame_size(self.limits.frame_bytes)
        await conn.send(
            P.hello_reply(idle=self.idle_timeout, max_key=self.state.max_key_bytes, max_value=self.state.max_value_bytes)
        )
        cid = self._next_cid
        self._next_cid += 1
        session = Session(cid, conn)
        self._sessions[cid] = session
        loop = asyncio.get_running_loop()
        session.last = loop.time()
        if self.idle_timeout is not None:
            session.idle_timer = loop.call_at(session.last + self.idle_timeout, self._idle_check, session)
        try:
            await self._requests(session, loop)
        except ConnectionClosedError:
            pass
        finally:
            writer = self._end_session(session)
            if writer is not None:
                await asyncio.gather(writer, return_exceptions=True)

    async def _requests(self, session: Session, loop: asyncio.AbstractEventLoop) -> None:
        conn = session.conn
        fast = self._frame_handler(session, loop)
        conn.set_frame_handler(fast)  # requests are now served from the frame callback
        cid = session.cid
        while True:
            # With the frame handler installed, recv() returns only once the
            # handler stepped aside (a reply met a full socket buffer: serve
            # here, with awaited sends, until it drains) or raises on close.
            frame = await conn.recv()
            session.last = loop.time()
            try:
                replies = self._handle(session, frame.header, frame.payload)
            except P.BadMessage as e:
                log.info("closing store connection from %s: %s", conn.peer, e)
                await send_quietly(conn, P.error_frame(e.code, str(e), request=e.request))
                return
            lost: ConnectionClosedError | None = None
            for r in replies:
                if r.client == cid:
                    if lost is None:
                        head, payload = self._encode(session, r)
                        try:
                            await self._send(session, head, payload)
                        except ConnectionClosedError as e:
                            lost = e  # still deliver what this request owes other clients
                else:
                    self._post(r)
            if lost is not None:
                raise lost
            if not conn.closed:
                conn.set_frame_handler(fast)  # the socket buffer drained (send returned): back to the fast path

    def _frame_handler(self, session: Session, loop: asyncio.AbstractEventLoop) -> Callable[[Any], None]:
        """The fast path: serve each request in the connection's frame callback.

        No task wake-up per request: the state machine runs and the reply is
        written synchronously. A reply that cannot be handed to the socket
        without waiting (the client does not read) makes the handler step
        aside; the session task then serves with awaited sends (backpressure)
        and reinstalls it once the buffer drained. A bad request is answered
        with an error and closes this connection only.
        """
        conn = session.conn
        cid = session.cid
        encode = self._encode
        post = self._post
        handlers = self._handlers
        special = self._special
        now = loop.time
        send_nowait = conn.send_nowait

        def step_aside() -> None:
            # Queued, but the socket buffer is full (the client does not
            # read): stop serving from the callback; the session task serves
            # with awaited sends until it drained, and the writer watches
            # that it drains within the send timeout.
            conn.set_frame_handler(None)
            self._post_frame(session, _DRAIN)

        def write(head: dict[str, Any], payload: Any) -> None:
            if not send_nowait(head, payload):
                step_aside()

        def on_frame(frame: Any) -> None:
            # _handle and write inlined: this runs once per request.
            session.last = now()
            h = frame.header
            op = h.get("op")
            handler = handlers.get(op) if type(op) is str else None
            try:
                if handler is not None:
                    replies = handler(session, h, frame.payload)
                else:
                    replies = special(session, h, frame.payload)
            except P.BadMessage as e:
                log.info("closing store connection from %s: %s", conn.peer, e)
                conn.set_frame_handler(None)
                try:
                    send_nowait(P.error_frame(e.code, str(e), request=e.request), None)
                except ConnectionClosedError:
                    pass
                conn.close()  # flushes the error reply; the session task sees the close and cleans up
                return
            for r in replies:
                if r.client == cid:
                    head, payload = encode(session, r)
                    try:
                        if not send_nowait(head, payload):
                            step_aside()
                    except ConnectionClosedError:
                        pass  # the session task sees the close; other clients' replies still go out
                else:
                    post(r)

        return on_frame

    def _end_session(self, session: Session) -> asyncio.Task[None] | None:
        """Forget ``session``: drop its waiters and timers, close it; returns its writer to await."""
        self._sessions.pop(session.cid, None)
        self.state.drop_client(session.cid)
        for handle in session.timers.values():
            handle.cancel()
        session.timers.clear()
        if session.idle_timer is not None:
            session.idle_timer.cancel()
            session.idle_timer = None
        writer = session.writer
        if writer is not None:
            writer.cancel()
        session.conn.close()
        return writer

    def _idle_check(self, session: Session) -> None:
        session.idle_timer = None
        if session.conn.closed or self.idle_timeout is None:
            return
        loop = asyncio.get_running_loop()
        deadline = session.last + self.idle_timeout
        if self.state.waiter_count(session.cid) > 0:
            deadline = loop.time() + self.idle_timeout
        elif deadline <= loop.time():
            log.info("closing idle store connection from %s (silent for %gs)", session.conn.peer, self.idle_timeout)
            session.conn.close()
            return
        session.idle_timer = loop.call_at(deadline, self._idle_check, session)

    # ------------------------------------------------------------ replies

    def _unpop_dropped(self, session: Session, why: str) -> None:
        self._admission.dropped(session.conn.peer, why)

    def _encode(self, session: Session, r: Reply) -> tuple[dict[str, Any], bytes | None]:
        if session.timers:
            # The reply ends its request's timeout, unless that request still waits: then this reply is another
            # request's that reused its id (a client's mistake, which must not make the waiting one wait forever).
            rid = r.request
            if rid in session.timers and not self.state.waiting(session.cid, rid):
                session.timers.pop(rid).cancel()
        if r.failure is not None:
            f = r.failure
            return P.error_frame(f.code, f.message, request=r.request, key=f.key, limit=f.limit, maximum=f.maximum,
                                 missing=f.missing), None
        value = r.value
        kind = type(value)
        if kind is bytes:
            if len(value) <= P.HEADER_VALUES_LIMIT:
                return {"id": r.request, "v": [value]}, None
            head: dict[str, Any] = {"id": r.request}
            return head, P.pack_values(head, (value,))
        if kind is list:
            head = {"id": r.request}
            return head, P.pack_values(head, value)
        return {"id": r.request, "r": value}, None

    def _post(self, r: Reply) -> None:
        """Queue a reply for its session's writer task (dropped if the client is gone)."""
        session = self._sessions.get(r.client)  # type: ignore[call-overload]  # (our clients are ints)
        if session is not None:
            self._post_frame(session, r)

    def _post_frame(self, session: Session, item: Reply | dict[str, Any]) -> None:
        """Queue a reply or a raw header for ``session``'s writer task, starting it if needed.

        Over the outbox limit the client is cut off instead.
        """
        if session.conn.closed:
            return
        session.outbox.append(item)
        session.outbox_bytes += _size(item)
        if session.outbox_bytes > self.limits.outbox_bytes:
            self._cut_off(session, f"{session.outbox_bytes} bytes of replies wait for it (max_outbox_bytes)")
            return
        if session.writer is None:
            session.wake = asyncio.Event()
            session.writer = asyncio.get_running_loop().create_task(self._write_loop(session))
        else:
            assert session.wake is not None
            session.wake.set()

    async def _write_loop(self, session: Session) -> None:
        assert session.wake is not None
        outbox = session.outbox
        try:
            while True:
                while outbox:
                    r = outbox.popleft()
                    session.outbox_bytes -= _size(r)
                    if r is _DRAIN:
                        await self._drained(session)
                    elif type(r) is dict:
                        await self._send(session, r)
                    else:
                        head, payload = self._encode(session, r)  # type: ignore[arg-type]
                        await self._send(session, head, payload)
                session.wake.clear()
                await session.wake.wait()
        except ConnectionClosedError:
            pass

    async def _send(self, session: Session, head: dict[str, Any], payload: Any = None) -> None:
        """Send one frame; if the socket buffer is full, wait until it drains, at most the send timeout."""
        if not session.conn.send_nowait(head, payload):
            await self._drained(session)

    async def _drained(self, session: Session) -> None:
        """Wait until what was sent to ``session`` left; cut it off if that takes longer than the send timeout."""
        timeout = self.limits.send_timeout
        try:
            async with asyncio.timeout(timeout):
                await session.conn.drained()
        except TimeoutError:
            self._cut_off(session, f"it left its replies unread for {timeout:g}s (send_timeout)")
            raise ConnectionLost(f"store client {session.conn.peer} was cut off") from None

    def _cut_off(self, session: Session, why: str) -> None:
        """Drop a client that does not read: reset its connection, free its replies (the session task ends it)."""
        self._admission.cut_off(session.conn.peer, why)
        session.outbox.clear()
        session.outbox_bytes = 0
        session.conn.abort()  # (an orderly close would wait for it to read what is queued)

_DRAIN: Final[dict[str, Any]] = {}
"""Outbox marker: the fast path met a full socket buffer; the writer waits for it to drain (bounded)."""


_FRAME: Final = 64
"""Counted per outbox entry beside what it holds: the deque slot, a frame's head once encoded."""
_HEADER: Final = 256
"""A raw header in the outbox (``pong``, a ``cancelled`` ack): the dict object with its entries."""
_FAILURE: Final = 256
"""An error reply beside its strings: the Reply and Failure tuples, the error frame's fields."""


def _size(item: Reply | dict[str, Any]) -> int:
    """What an outbox entry holds: its value bytes, or an error's strings, plus the objects around them.

    Every entry counts what it keeps alive, so that a client that never reads
    reaches ``max_outbox_bytes`` with about that much memory held for it
    (whatever its replies are: values, timeout errors, pongs).
    """
    if type(item) is dict:
        return _HEADER
    value = item.value  # type: ignore[union-attr]
    if type(value) is bytes:
        return _FRAME + len(value)
    if type(value) is list:
        return _FRAME + sum(len(v) for v in value)
    failure = item.failure  # type: ignore[union-attr]
    if failure is not None:
        return _failure_size(failure)
    return _FRAME


def _failure_size(f: Failure) -> int:
    size = _FAILURE + sys.getsizeof(f.message)
    if f.key is not None:
        size += sys.getsizeof(f.key)
    if f.missing:
        size += sum(_FRAME + sys.getsizeof(k) for k in f.missing)
    return size
