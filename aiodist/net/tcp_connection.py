"""One framed connection over asyncio TCP: the protocol object, its receiving half and its life cycle.

Receiving uses :class:`asyncio.BufferedProtocol` with :class:`~aiodist.wire.FrameDecoder`,
so a payload is written by the kernel straight into its destination (a
caller's array when a payload sink supplies one), and memory is only
allocated as bytes arrive; reading pauses while too many frames wait unread.
A payload the sink had no buffer for yet is read in chunks; after each one
the sink is asked again, and the loop gets one turn before the next chunk is
read (ready callbacks run: a task about to post the receive for it can), so
most of a payload that came a little early still lands in place. That turn
waits for nothing else: reading goes on in the next iteration whatever the
sink answers.
Sending is :class:`~aiodist.net.outbox.Outbox`'s: small frames coalesced,
large payloads handed to the kernel without a copy and without asyncio's
transport keeping the caller's memory. Closing is orderly and lingering
(see :meth:`TCPConnection._finish_closing`); aborting resets.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import socket
import struct
from typing import Any, cast

from ..errors import ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, ProtocolError, anew
from ..wire import DEFAULT_MAX_FRAME_SIZE, PREAMBLE, FrameDecoder
from . import fork
from .base import Connection, Frame, FrameHandler, Header, PayloadSink
from .outbox import KernelRoom, Outbox
from .waiters import wake

log = logging.getLogger("aiodist.net")

_MAX_QUEUED_FRAMES = 4096  # pause reading beyond this many unread frames
_LINGER = 5.0  # after an orderly close: how long to wait for the peer's end of stream (see _finish_closing)


class _State(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    CLOSING = "closing"  # close() was called: what is queued still goes out, then end-of-stream
    CLOSED = "closed"


class TCPConnection(Connection, asyncio.BufferedProtocol):
    """One TCP connection; it is its own asyncio protocol."""

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, peer: str = "?") -> None:
        self._decoder = FrameDecoder(max_frame_size=max_frame_size)
        # Fast path: the transport calls the decoder's get_buffer directly (one
        # Python call less per read); the method below documents it.
        self.get_buffer = self._decoder.get_buffer  # type: ignore[method-assign]
        self._state = _State.CONNECTING
        self._transport: asyncio.Transport | None = None
        self._outbox: Outbox | None = None  # (made with the transport)
        self._peer = peer
        self._frames: collections.deque[Frame] = collections.deque()
        self._recv_waiter: asyncio.Future[None] | None = None
        self._exc: ConnectionClosedError | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self._paused_reading = False
        self._yielding = False  # reading stopped for one loop turn (see the module doc)
        self._reading = True
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_frame: FrameHandler | None = None
        self._progress = 0  # bytes received (see Connection.progress)

    def __repr__(self) -> str:
        return f"<TCPConnection {self._peer} {self._state.value} unread={len(self._frames)} {self._outbox!r}>"

    # -- asyncio protocol callbacks ----------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # (uvloop's is not an asyncio.Transport subclass)
        if self._state is not _State.CONNECTING:  # closed before it was made
            transport.abort()
            return
        self._transport = transport
        self._state = _State.OPEN
        self._loop = asyncio.get_running_loop()
        self._closed_fut = self._loop.create_future()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            fork.own(sock.fileno())  # (a forked child lets go of it: see aiodist.net.fork)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        # Over TLS the transport encrypts (copies) what it is given, on its own schedule: the kernel's room
        # says nothing about when it lets go of a slice, so everything is handed over as copies.
        tls = transport.get_extra_info("ssl_object") is not None
        outbox = self._outbox = Outbox(self._loop, transport, None if tls else KernelRoom.of(sock))
        # Fast paths: the callers reach the outbox directly (the methods below say what they do).
        self.try_send = outbox.try_send  # type: ignore[method-assign]
        self.send_nowait = outbox.send_nowait  # type: ignore[method-assign]
        peername = transport.get_extra_info("peername")
        if peername:
            self._peer = f"{peername[0]}:{peername[1]}"
        # pause_writing whenever anything is left unsent, so that resume_writing tells us the
        # transport's buffer is empty. (The TLS transports pause at size >= high, the others at > high.)
        transport.set_write_buffer_limits(high=1 if tls else 0, low=0)
        transport.write(PREAMBLE)

    def start_handshake_timer(self, timeout: float | None, *, whole: float | None = None) -> None:
        """Close the connection if the peer's preamble has not come within ``timeout`` seconds from now
        (``whole``: the whole handshake timeout, for the log, when part of it was spent already)."""
        if timeout is None or self._loop is None or self._decoder.handshake_done:
            return
        self._handshake_timer = self._loop.call_later(
            timeout, self._handshake_expired, timeout if whole is None else whole
        )

    def _handshake_expired(self, timeout: float) -> None:
        self._handshake_timer = None
        if not self._decoder.handshake_done and self._exc is None:
            log.info("closing connection from %s: no handshake within %gs", self._peer, timeout)
            self._fail(ConnectionLost(f"{self._peer} sent no handshake within {timeout:g}s"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        # Something arrived: a new burst of sends may go out at once (see outbox).
        self._outbox.wrote = False  # type: ignore[union-attr]
        self._progress += nbytes
        decoder = self._decoder
        try:
            frames = decoder.buffer_updated(nbytes)
        except Exception as e:
            self._decode_failed(e)
            return
        if self._handshake_timer is not None and decoder.handshake_done:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if decoder.declined:  # the sink has no buffer yet for a payload arriving: a loop turn first
            decoder.declined = False
            self._yield_reading()
        if not frames:
            return
        on_frame = self._on_frame
        if on_frame is not None and len(frames) == 1 and self._exc is None:
            # The usual case of request/reply traffic, inlined: one frame for
            # the handler; a reply it sends goes straight out (see send_nowait).
            header, payload = frames[0]
            try:
                on_frame(Frame(header, payload))
            except Exception as e:  # a local bug in the handler: never kill the loop
                self._handler_failed(e)
            return
        self._deliver(frames)

    def _decode_failed(self, e: Exception) -> None:
        """The decoder raised: bad bytes from the peer, or a payload sink that failed (a local bug)."""
        frames, self._decoder.completed = self._decoder.completed, []
        if frames:  # the frames before the bad one were fine: they are delivered
            self._deliver(frames)
        if isinstance(e, ProtocolError):
            log.info("closing connection from %s: %s", self._peer, e)
            self._fail(ConnectionLost.protocol_error(self._peer, e))
            return
        # A payload sink that raised: never kill the loop.
        log.error("payload sink failed on connection %s", self._peer, exc_info=e)
        self._fail(ConnectionLost(f"payload sink failed on connection to {self._peer}: {e!r}"))

    def _yield_reading(self) -> None:
        """Stop reading until the next loop iteration (ready callbacks run first)."""
        if not self._yielding and self._loop is not None:
            self._yielding = True
            self._update_reading()
            self._loop.call_soon(self._end_yield)

    def _end_yield(self) -> None:
        self._yielding = False
        self._update_reading()

    def _update_reading(self) -> None:
        t = self._transport
        if t is None or self._exc is not None:
            return
        want = not self._paused_reading and not self._yielding
        if want != self._reading:
            self._reading = want
            if want:
                t.resume_reading()
            else:
                t.pause_reading()

    def _deliver(self, frames: list[tuple[Header, memoryview | None]]) -> None:
        if self._on_frame is None:
            self._enqueue(frames)
            return
        if len(frames) == 1:
            if self._exc is None:
                header, payload = frames[0]
                self._handle_frame(header, payload)
            return
        # Several frames at once: replies sent by the handler are collected
        # and written together when the batch is done.
        outbox = self._outbox
        assert outbox is not None
        outbox.begin_batch()
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
            outbox.end_batch()

    def _handle_frame(self, header: Header, payload: memoryview | None) -> bool:
        """Hand one frame to the frame handler; False if the handler failed (the connection is then broken)."""
        on_frame = self._on_frame
        assert on_frame is not None
        try:
            on_frame(Frame(header, payload))
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
            self._frames.append(Frame(header, payload))
        if len(self._frames) > _MAX_QUEUED_FRAMES and not self._paused_reading:
            self._paused_reading = True
            self._update_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._set_exc(ConnectionLost(f"{self._peer} closed the connection"))
        return False  # (asyncio closes the transport; what we queued is still flushed first)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._set_exc(ConnectionLost(f"{self._peer} closed the connection"))
        else:
            lost = ConnectionLost(f"connection to {self._peer} broke: {exc}")
            lost.detail = str(exc) or type(exc).__name__
            self._set_exc(lost)
        self._state = _State.CLOSED
        if self._outbox is not None:
            self._outbox.stop(self._exc)  # type: ignore[arg-type]
        self._release()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        wake(self._closed_fut)

    def pause_writing(self) -> None:
        self._outbox.pause()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        outbox = self._outbox
        assert outbox is not None
        outbox.resume()
        if self._state is _State.CLOSING and outbox.empty:
            self._finish_closing()

    # -- Connection interface -------------------------------------------------

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def closed(self) -> bool:
        return self._exc is not None

    def set_payload_sink(self, sink: PayloadSink | None) -> None:
        if self._exc is None:
            self._decoder.sink = sink

    def set_max_frame_size(self, n: int) -> None:
        self._decoder.set_max_frame_size(n)

    def release_senders(self) -> None:
        if self._outbox is not None:
            self._outbox.release()

    def redirect_payload(self, header: Header) -> None:
        self._decoder.redirect(header)  # (between reads: the transport holds no view of the old buffer)

    def set_frame_handler(self, handler: FrameHandler | None) -> None:
        if self._exc is not None and handler is not None:
            return  # (closed: nothing will arrive, and the handler must not be kept alive)
        self._on_frame = handler
        while handler is not None and self._frames and self._exc is None and self._on_frame is handler:
            handler(self._frames.popleft())
        if self._paused_reading:
            self._paused_reading = False
            self._update_reading()

    def _ended(self) -> ConnectionClosedError:
        """What a call on a connection without an outbox raises: its error, anew (see :func:`anew`)."""
        if self._exc is not None:
            return anew(self._exc)
        return ConnectionClosedLocally(f"connection to {self._peer} is not open")

    async def send(self, header: Header, payload: Any = None) -> None:
        outbox = self._outbox
        if outbox is None:
            raise self._ended()
        if outbox.send_nowait(header, payload):
            return
        try:
            await outbox.wait_sent()
        except asyncio.CancelledError:
            if outbox.reset_needed:
                log.warning("resetting connection to %s: a cancelled send's payload was still being read",
                            self._peer)
                self.abort()
            raise

    def try_send(self, header: Header, payload: Any = None) -> bool:
        """Queue one small frame (a copy) if nothing waits: True; else queue nothing: False.

        A large payload (more than the coalescing limit, written without a
        copy) is never taken here: :meth:`send` waits until it is safe to reuse.
        """
        return self._outbox is not None and self._outbox.try_send(header, payload)

    def send_nowait(self, header: Header, payload: Any = None) -> bool:
        """Queue one frame without waiting; False: the buffer is full, wait before sending more.

        After False, a large payload may still be read: keep it unchanged
        until a later ``send`` (or :meth:`drained`) returns. Small frames sent
        in one loop iteration are coalesced (see :mod:`aiodist.net.outbox`).
        """
        if self._outbox is None:
            raise self._ended()
        return self._outbox.send_nowait(header, payload)

    async def drained(self) -> None:
        """Wait until everything queued was handed to the kernel (raises if the connection closed or broke)."""
        if self._outbox is None:
            raise self._ended()
        await self._outbox.drained()

    async def recv(self) -> Frame:
        while not self._frames:
            if self._exc is not None:
                raise anew(self._exc)
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
        wake(self._recv_waiter)

    def _set_exc(self, exc: ConnectionClosedError) -> None:
        if self._exc is None:
            self._exc = exc
        self._wake_reader()
        if self._outbox is not None:
            self._outbox.refuse(self._exc)

    def _fail(self, exc: ConnectionClosedError) -> None:
        """Break the connection (a protocol error, a local bug in a handler): reset, drop everything."""
        self._set_exc(exc)
        self._state = _State.CLOSED
        if self._outbox is not None:
            self._outbox.stop(self._exc)  # type: ignore[arg-type]
        self._release()
        if self._transport is not None:
            self._transport.abort()

    def _release(self) -> None:
        """Drop the receive buffers, the sink and the handler at once (they may refer back to us)."""
        self._decoder.release()
        self._on_frame = None
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def close(self) -> None:
        if self._exc is None:
            self._exc = ConnectionClosedLocally(f"connection to {self._peer} was closed by this side")
        self._frames.clear()
        self._release()
        self._wake_reader()
        if self._state is _State.OPEN:
            self._state = _State.CLOSING
            outbox = self._outbox
            assert outbox is not None
            outbox.close(self._exc)
            if outbox.empty:
                self._finish_closing()
        elif self._state is _State.CONNECTING:
            self._state = _State.CLOSED

    def _finish_closing(self) -> None:
        """Everything queued was handed to the transport: it sends the rest, then end-of-stream.

        A lingering close: only our direction is shut (FIN after the data); we
        read on (and drop what comes) until the peer's end of stream, or for
        at most ``_LINGER`` seconds. Closing the socket at once would make the
        kernel answer data still arriving with a reset, and a reset can make
        the peer lose the last frames we sent.
        """
        t = self._transport
        if t is None or t.is_closing() or self._linger is not None:
            return
        if not t.can_write_eof():
            t.close()
            return
        try:
            t.write_eof()
        except OSError:  # (the peer is gone already)
            t.abort()
            return
        assert self._loop is not None
        self._linger = self._loop.call_later(_LINGER, self._linger_expired)

    def _linger_expired(self) -> None:
        self._linger = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()

    def abort(self) -> None:
        was = self._state
        if self._exc is None or was is _State.CLOSING:
            self._exc = ConnectionClosedLocally(f"connection to {self._peer} was aborted by this side")
        self._frames.clear()
        self._state = _State.CLOSED
        if self._outbox is not None:
            self._outbox.stop(self._exc)
        self._release()
        self._wake_reader()
        t = self._transport
        if t is not None and (was is _State.OPEN or was is _State.CLOSING):
            sock = t.get_extra_info("socket")
            if sock is not None:
                try:  # a reset (RST), not an orderly end: the kernel drops what it still holds
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except (OSError, ValueError):
                    pass
            t.abort()

    @property
    def progress(self) -> int:
        return self._progress

    async def wait_closed(self) -> None:
        if self._closed_fut is not None:
            await asyncio.shield(self._closed_fut)
