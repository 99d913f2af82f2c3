"""The real network: framed connections over asyncio TCP.

Receiving uses :class:`asyncio.BufferedProtocol` with :class:`~aiodist.wire.FrameDecoder`,
so large payloads are written by the kernel straight into their destination
(a caller's array when a payload sink supplies it). Sending writes the header
and the payload buffer without copying them; small frames sent in the same
loop iteration are coalesced into one write (see :meth:`TCPConnection.send_nowait`).
Works on the default asyncio loop and on uvloop (see :mod:`aiodist.eventloop`).

Flow control: ``send`` returns only once the transport's buffer is empty again,
i.e. the payload has been handed to the kernel; the caller may then reuse its
buffer. Receive-side, reading pauses while too many frames wait unread.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import logging
import socket
import types
from collections.abc import Callable
from typing import Any

from ..context import getenv
from ..errors import ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, ProtocolError
from ..wire import DEFAULT_MAX_FRAME_SIZE, PREAMBLE, FrameDecoder, as_byte_view, encode_frame
from .accept import listen_socket
from .base import Address, Connection, ConnectionHandler, Frame, Header, Listener, Network, PayloadSink

log = logging.getLogger("aiodist.net")


def _frame_maker() -> Callable[[Header, memoryview | None], Frame]:
    """The cheapest way to build a :class:`Frame`, which is done for every frame received.

    ``Frame`` is a frozen, slotted dataclass: its ``__init__`` sets each field
    through a Python-level ``object.__setattr__`` call, several times slower
    than setting the slots through their descriptors, as done here. Falls
    back to the constructor if ``Frame`` ever stops being slotted.
    """
    slots = [Frame.__dict__.get(name) for name in ("header", "payload")]
    if not all(isinstance(d, types.MemberDescriptorType) for d in slots):
        return Frame
    new = object.__new__
    set_header, set_payload = slots[0].__set__, slots[1].__set__  # type: ignore[union-attr]

    def make(header: Header, payload: memoryview | None) -> Frame:
        frame = new(Frame)
        set_header(frame, header)
        set_payload(frame, payload)
        return frame  # type: ignore[no-any-return]

    return make


_make_frame = _frame_maker()

_COALESCE_LIMIT = 1 << 16  # frames up to this size are batched into one write
_MAX_QUEUED_FRAMES = 4096  # pause reading beyond this many unread frames
DEFAULT_HANDSHAKE_TIMEOUT = 10.0


class TCPConnection(Connection, asyncio.BufferedProtocol):
    """One TCP connection; it is its own asyncio protocol."""

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, peer: str = "?") -> None:
        self._decoder = FrameDecoder(max_frame_size=max_frame_size)
        # Fast path: the transport calls the decoder's get_buffer directly (one
        # Python call less per read); the method below documents it.
        self.get_buffer = self._decoder.get_buffer  # type: ignore[method-assign]
        self._transport: asyncio.Transport | None = None
        self._peer = peer
        self._frames: collections.deque[Frame] = collections.deque()
        self._recv_waiter: asyncio.Future[None] | None = None
        self._exc: ConnectionClosedError | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self._paused_writing = False
        self._paused_reading = False
        self._deferred = False  # a payload whose destination the sink has not named yet
        self._reading = True
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._wbuf = bytearray()
        self._flush_scheduled = False
        # Coalescing state (see send_nowait): a frame went straight to the
        # transport since the last receive or flush, so the next ones are batched.
        self._wrote = False
        self._delivering = False  # handing a batch of received frames to the frame handler
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_frame: Callable[[Frame], None] | None = None

    def __repr__(self) -> str:
        state = "closed" if self._exc is not None else "open"
        return f"<TCPConnection {self._peer} {state} queued={len(self._frames)}>"

    # -- asyncio protocol callbacks ----------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass
        self._loop = asyncio.get_running_loop()
        self._closed_fut = self._loop.create_future()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peername = transport.get_extra_info("peername")
        if peername:
            self._peer = f"{peername[0]}:{peername[1]}"
        # Limits of 0: pause_writing whenever anything is left unsent, so that
        # resume_writing tells us the buffer is empty (send() then returns).
        transport.set_write_buffer_limits(high=0, low=0)
        transport.write(PREAMBLE)

    def start_handshake_timer(self, timeout: float | None) -> None:
        if timeout is None or self._loop is None or self._decoder.handshake_done:
            return
        self._handshake_timer = self._loop.call_later(timeout, self._handshake_expired, timeout)

    def _handshake_expired(self, timeout: float) -> None:
        self._handshake_timer = None
        if not self._decoder.handshake_done and self._exc is None:
            log.info("closing connection from %s: no handshake within %gs", self._peer, timeout)
            self._fail(ConnectionLost(f"{self._peer} sent no handshake within {timeout:g}s"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        # Something arrived: a new burst of sends may go out at once (see send_nowait).
        self._wrote = False
        decoder = self._decoder
        try:
            frames = decoder.buffer_updated(nbytes)
        except Exception as e:
            self._decode_failed(e)
            return
        if self._handshake_timer is not None and decoder.handshake_done:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if decoder.awaiting_target and not self._deferred:
            self._deferred = True  # stop reading until resume_payload() names the payload's destination
            self._update_reading()
        if not frames:
            return
        on_frame = self._on_frame
        if on_frame is not None and len(frames) == 1 and self._exc is None:
            # The usual case of request/reply traffic, inlined: one frame for
            # the handler; a reply it sends goes straight out (see send_nowait).
            header, payload = frames[0]
            try:
                on_frame(_make_frame(header, payload))
            except Exception as e:  # a local bug in the handler: never kill the loop
                self._handler_failed(e)
            return
        self._deliver(frames)

    def _decode(self, step: Callable[[Any], list[tuple[Header, memoryview | None]]], arg: Any) -> list[tuple[Header, memoryview | None]] | None:
        """Run one decoder step; on bad bytes (or a failing payload sink) fail the connection and return None."""
        try:
            return step(arg)
        except Exception as e:
            self._decode_failed(e)
        return None

    def _decode_failed(self, e: Exception) -> None:
        """The decoder raised: bad bytes from the peer, or a payload sink that failed (a local bug)."""
        if isinstance(e, ProtocolError):
            log.info("closing connection from %s: %s", self._peer, e)
            self._fail(ConnectionLost(f"protocol error from {self._peer}: {e}"))
            return
        # A payload sink that raised: never kill the loop.
        log.error("payload sink failed on connection %s", self._peer, exc_info=e)
        self._fail(ConnectionLost(f"payload sink failed on connection to {self._peer}: {e!r}"))

    def _update_reading(self) -> None:
        t = self._transport
        if t is None or self._exc is not None:
            return
        want = not self._deferred and not self._paused_reading
        if want != self._reading:
            self._reading = want
            if want:
                t.resume_reading()
            else:
                t.pause_reading()

    def resume_payload(self, target: memoryview | None) -> None:
        """Name the destination of a payload the sink deferred (``None``: a new buffer) and read on.

        The sink returned :data:`~aiodist.wire.DEFER` for it; reading stopped
        meanwhile. A no-op if the connection closed.
        """
        if self._exc is not None or not self._decoder.awaiting_target:
            return
        frames = self._decode(self._decoder.provide_target, target)
        if frames is None:
            return
        self._deferred = self._decoder.awaiting_target
        self._update_reading()
        if frames:
            self._deliver(frames)

    def _deliver(self, frames: list[tuple[Header, memoryview | None]]) -> None:
        if self._on_frame is None:
            self._enqueue(frames)
            return
        if len(frames) == 1:
            # The usual case of request/reply traffic: no batching needed; a
            # reply the handler sends goes straight out (see send_nowait).
            if self._exc is None:
                header, payload = frames[0]
                self._handle_frame(header, payload)
            return
        # Several frames at once: replies sent by the handler are collected
        # and written together when the batch is done.
        outer = self._delivering  # True when a handler made us deliver again (resume_payload)
        self._delivering = True
        try:
            for i, (header, payload) in enumerate(frames):
                if self._exc is not None:
                    return
                if self._on_frame is None:  # the handler stepped aside: the rest is for recv()
                    self._enqueue(frames[i:])
                    return
                if not self._handle_frame(header, payload):
                    return
        finally:
            self._delivering = outer
            if not outer:
                if self._wbuf and self._exc is None:
                    self._write_buffered()
                # Many frames at once (pipelined replies) usually wake many
                # senders: batch their frames until the next iteration.
                self._wrote_now()

    def _handle_frame(self, header: Header, payload: memoryview | None) -> bool:
        """Hand one frame to the frame handler; False if the handler failed (the connection is then closed)."""
        on_frame = self._on_frame
        assert on_frame is not None
        try:
            on_frame(_make_frame(header, payload))
        except Exception as e:  # a local bug in the handler: never kill the loop
            self._handler_failed(e)
            return False
        return True

    def _handler_failed(self, e: Exception) -> None:
        log.error("frame handler failed on connection %s", self._peer, exc_info=e)
        self._fail(ConnectionLost(f"frame handler failed on connection to {self._peer}: {e!r}"))

    def _enqueue(self, frames: list[tuple[Header, memoryview | None]]) -> None:
        """Queue frames for recv()."""
        for header, payload in frames:
            self._frames.append(_make_frame(header, payload))
        if len(self._frames) > _MAX_QUEUED_FRAMES and not self._paused_reading:
            self._paused_reading = True
            self._update_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._set_exc(ConnectionLost(f"{self._peer} closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._set_exc(ConnectionLost(f"{self._peer} closed the connection"))
        else:
            self._set_exc(ConnectionLost(f"connection to {self._peer} broke: {exc}"))
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._paused_writing = False
        self._wake_drainers()
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._wake_drainers()

    # -- Connection interface -------------------------------------------------

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def closed(self) -> bool:
        return self._exc is not None

    def set_payload_sink(self, sink: PayloadSink | None) -> None:
        self._decoder.sink = sink

    def set_frame_handler(self, handler: Callable[[Frame], None] | None) -> None:
        """Deliver frames by calling ``handler(frame)`` as they complete, instead of through :meth:`recv`.

        An optional fast path (no task wake-up and future per frame): frames
        already queued are handed over first, in order. :meth:`recv` then
        only reports the end of the connection (it raises once it closes).
        """
        self._on_frame = handler
        while handler is not None and self._frames and self._exc is None and self._on_frame is handler:
            handler(self._frames.popleft())
        if self._paused_reading:
            self._paused_reading = False
            self._update_reading()

    async def send(self, header: Header, payload: Any = None) -> None:
        if not self.send_nowait(header, payload):
            await self._drain()

    def try_send(self, header: Header, payload: Any = None) -> bool:
        """Queue one small frame (a copy) if the buffer has room: True; else queue nothing: False.

        A large payload (more than the coalescing limit, written without a
        copy) is never taken here: :meth:`send` waits until it is safe to reuse.
        """
        if self._exc is not None or self._paused_writing:
            return False
        if payload is not None:
            payload = as_byte_view(payload)
            if payload.nbytes > _COALESCE_LIMIT:  # large whatever the header: no encoding for nothing
                return False
        head, body = encode_frame(header, payload)
        if body is None:
            self._queue_small(head)
        elif len(head) + body.nbytes <= _COALESCE_LIMIT:
            self._queue_small(head + body)
        else:
            return False
        return True

    def send_nowait(self, header: Header, payload: Any = None) -> bool:
        """Queue one frame without waiting; False: the buffer is full, wait before sending more.

        Unlike :meth:`send`, a large payload may still be referenced by the
        transport when this returns False: keep it unchanged until a later
        ``send`` (or :meth:`drained`) returns.

        Coalescing: the first small frame of a loop iteration is written at
        once (no added latency). Further frames sent in the same iteration
        are batched and written by one ``_flush`` at the start of the next
        (``call_soon``, scheduled by the first write), or, while a batch of
        received frames is being handed to the frame handler, by one write
        when the batch is done. A frame that arrives resets the batching (a
        reply written from its handler goes out at once). A frame is never
        held for longer than the rest of the iteration it was sent in: it
        must not wait for a receive that may never come.
        """
        if self._exc is not None:
            raise self._exc
        head, body = encode_frame(header, payload)
        if body is None:
            return self._queue_small(head)
        if len(head) + body.nbytes <= _COALESCE_LIMIT:
            return self._queue_small(head + body)
        # Large: written without copying, after whatever is batched.
        if self._wbuf:
            self._write_buffered()
        self._transport.writelines((head, body))  # type: ignore[union-attr]
        self._wrote_now()
        return not self._paused_writing

    def _queue_small(self, data: bytes) -> bool:
        """Write ``data`` now, or batch it for the end of this loop iteration (see :meth:`send_nowait`)."""
        if not (self._wrote or self._delivering or self._paused_writing or self._wbuf):
            self._transport.write(data)  # type: ignore[union-attr]
            self._wrote_now()
            return not self._paused_writing
        self._wbuf += data
        if len(self._wbuf) >= _COALESCE_LIMIT:
            self._write_buffered()
        self._wrote_now()
        return not self._paused_writing

    def _wrote_now(self) -> None:
        """Something was written or batched in this iteration: batch what follows until the next one.

        The next iteration starts afresh (``_flush``): a frame never waits for
        anything but the end of the iteration it was sent in.
        """
        self._wrote = True
        if not self._flush_scheduled and not self._delivering:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        """At the start of the next iteration: write the frames batched during the last one."""
        self._flush_scheduled = False
        self._wrote = False
        if self._wbuf and self._exc is None and self._transport is not None:
            self._write_buffered()

    def _write_buffered(self) -> None:
        data, self._wbuf = self._wbuf, bytearray()
        self._transport.write(data)  # type: ignore[union-attr]

    async def drained(self) -> None:
        """Wait until everything queued was handed to the kernel (raises if the connection broke)."""
        if self._paused_writing:
            await self._drain()
        elif self._exc is not None:
            raise self._exc

    async def _drain(self) -> None:
        assert self._loop is not None
        fut = self._loop.create_future()
        self._drain_waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._drain_waiters:
                self._drain_waiters.remove(fut)
        if self._exc is not None:
            raise self._exc

    def _wake_drainers(self) -> None:
        while self._drain_waiters:
            fut = self._drain_waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def recv(self) -> Frame:
        while not self._frames:
            if self._exc is not None:
                raise self._exc
            assert self._loop is not None
            self._recv_waiter = self._loop.create_future()
            try:
                await self._recv_waiter
            finally:
                self._recv_waiter = None
        frame = self._frames.popleft()
        if self._paused_reading and len(self._frames) <= _MAX_QUEUED_FRAMES // 2:
            self._paused_reading = False
            self._update_reading()
        return frame

    def _wake_reader(self) -> None:
        w = self._recv_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _set_exc(self, exc: ConnectionClosedError) -> None:
        if self._exc is None:
            self._exc = exc
        self._wake_reader()
        self._wake_drainers()

    def _fail(self, exc: ConnectionClosedError) -> None:
        self._set_exc(exc)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        if self._exc is None:
            self._exc = ConnectionClosedLocally(f"connection to {self._peer} was closed by this side")
            self._frames.clear()
        self._wake_reader()
        self._wake_drainers()
        if self._transport is not None and not self._transport.is_closing():
            if self._wbuf:
                self._write_buffered()  # frames batched in this iteration still go out
            self._transport.close()

    async def wait_closed(self) -> None:
        if self._closed_fut is not None:
            await asyncio.shield(self._closed_fut)


class TCPListener(Listener):
    def __init__(self, handler: ConnectionHandler) -> None:
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._address: Address = ("", 0)
        self._conns: dict[int, TCPConnection] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._next_id = 0
        self._closing = False

    def __repr__(self) -> str:
        state = "closing" if self._closing else "serving"
        return f"<TCPListener {self._address[0]}:{self._address[1]} {state} conns={len(self._conns)}>"

    @property
    def address(self) -> Address:
        return self._address

    def _accepted(self, conn: TCPConnection) -> None:
        if self._closing:
            conn.close()
            return
        cid = self._next_id
        self._next_id += 1
        self._conns[cid] = conn
        self._tasks[cid] = asyncio.get_running_loop().create_task(self._run_handler(cid, conn))

    async def _run_handler(self, cid: int, conn: TCPConnection) -> None:
        try:
            await self._handler(conn)
        except (asyncio.CancelledError, ConnectionClosedError):
            pass
        except Exception:
            log.exception("connection handler for %s failed", conn.peer)
        finally:
            conn.close()
            self._conns.pop(cid, None)
            self._tasks.pop(cid, None)

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.close()
        for task in list(self._tasks.values()):
            task.cancel()

    async def wait_closed(self) -> None:
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


@functools.lru_cache(maxsize=16)
def local_address_toward(peer: str | None) -> str:
    """This machine's address on the route to ``peer`` (loopback for a local or missing peer).

    Uses a UDP socket's ``connect``, which picks a route without sending anything.
    """
    if not peer or peer == "localhost":
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(peer, None, socket.AF_INET, socket.SOCK_DGRAM)
        addr = infos[0][4][0]
        if ipaddress.ip_address(addr).is_loopback:
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return str(s.getsockname()[0])
    except (OSError, ValueError, IndexError):
        log.warning("cannot find a local address towards MASTER_ADDR=%s; listening on 127.0.0.1", peer)
        return "127.0.0.1"


class TCPNetwork(Network):
    """asyncio TCP. Stateless: one instance serves every rank of a process."""

    def __init__(self, *, host: str | None = None) -> None:
        self._host = host

    def __repr__(self) -> str:
        return "<TCPNetwork>"

    def default_host(self) -> str:
        """The address this host's listeners are published under.

        ``127.0.0.1`` for a single-machine job; when the rank's MASTER_ADDR is
        another machine, the local address of the route towards it (so that
        ranks on other nodes can connect back). ``AIODIST_HOST`` overrides both
        (read by the callers).
        """
        if self._host:
            return self._host
        return local_address_toward(getenv("MASTER_ADDR"))

    async def connect(
        self, address: Address, *, timeout: float | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    ) -> Connection:
        host, port = address
        loop = asyncio.get_running_loop()
        conn = TCPConnection(max_frame_size=max_frame_size, peer=f"{host}:{port}")
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: conn, host, port)
        except TimeoutError:
            raise TimeoutError(f"connecting to {host}:{port} timed out after {timeout:g}s") from None
        except OSError as e:
            raise ConnectionLost(f"could not connect to {host}:{port}: {e.strerror or e}") from None
        return conn

    async def listen(
        self,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int | None = None,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> Listener:
        host, port = address
        listener = TCPListener(handler)
        mfs = max_frame_size or DEFAULT_MAX_FRAME_SIZE

        def factory() -> TCPConnection:
            conn = _ServerConnection(listener, handshake_timeout, max_frame_size=mfs)
            return conn

        try:
            server = await listen_socket(host, port, factory)
        except OSError as e:
            raise ConnectionLost(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        listener._server = server  # type: ignore[assignment]  # an AcceptLoop: close, wait_closed, sockets
        sockname = server.sockets[0].getsockname()
        listener._address = (host or sockname[0], sockname[1])
        return listener


class _ServerConnection(TCPConnection):
    def __init__(self, listener: TCPListener, handshake_timeout: float | None, **kw: Any) -> None:
        super().__init__(**kw)
        self._listener = listener
        self._handshake_timeout = handshake_timeout

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.start_handshake_timer(self._handshake_timeout)
        self._listener._accepted(self)
