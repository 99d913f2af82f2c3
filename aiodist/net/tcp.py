"""The real network: framed connections over asyncio TCP (the default loop and uvloop).

Receiving uses :class:`asyncio.BufferedProtocol` with :class:`~aiodist.wire.FrameDecoder`,
so a payload is written by the kernel straight into its destination (a
caller's array when a payload sink supplies one), and memory is only
allocated as bytes arrive.

Sending: a small frame (up to 64 KiB with its header) is copied; the small
frames sent in one loop iteration are coalesced into one write (see
:meth:`TCPConnection.send_nowait`). A large payload is not copied: it is
handed to the kernel in slices no larger than what the socket's send buffer
takes at once (Linux tells us), so asyncio's transport never holds the
caller's memory; what is written while the kernel is full is a small copy.
Frames behind a large one wait, in order, in the connection's own queue. So
a ``send`` that is cancelled leaves nothing of the caller's behind: a frame
that had not started is dropped, one that had started is finished from a
copy of its rest.

Flow control: ``send`` returns once its frame is in the kernel's hands (or
copied) and the connection's queue is below its bound; receive-side, reading
pauses while too many frames wait unread.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import ipaddress
import logging
import socket
import struct
import sys
from typing import Any, cast

from ..rankenv import getenv
from ..errors import ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, ProtocolError
from ..wire import DEFAULT_MAX_FRAME_SIZE, PREAMBLE, FrameDecoder, as_byte_view, encode_frame
from .base import Address, Connection, ConnectionHandler, Frame, FrameHandler, Header, Listener, Network, PayloadSink

log = logging.getLogger("aiodist.net")

_COALESCE_LIMIT = 1 << 16  # frames up to this size (header included) are copied and batched into one write
_MAX_QUEUED_FRAMES = 4096  # pause reading beyond this many unread frames
_COPY_SLICE = 1 << 15  # what is copied and written while the kernel's send buffer is (nearly) full
_MIN_VIEW = 1 << 16  # the least the kernel must take at once for a slice of the caller's memory
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
_LINGER = 5.0  # after an orderly close: how long to wait for the peer's end of stream (see _finish_closing)

_SO_MEMINFO = 55 if sys.platform == "linux" else None  # (Linux >= 4.6: a socket's memory counters)
_MEMINFO = struct.Struct("9I")


class _KernelRoom:
    """How many bytes a send on a socket takes at once, now (Linux; elsewhere unknown: None).

    The kernel accepts data while the memory its send queue holds is below
    the socket's send buffer (``SO_MEMINFO``); three quarters of the
    difference are taken as room, as queued memory counts per-packet overhead
    too. (The kernel wakes a writer once a third of the buffer is free: the
    room then is about a megabyte on loopback.)
    """

    __slots__ = ("_sock",)

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def room(self) -> int:
        """Bytes a send takes at once (0 if that cannot be known any more: the socket is closing)."""
        try:
            info = _MEMINFO.unpack(self._sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, _MEMINFO.size))
        except (OSError, ValueError, struct.error):
            return 0
        sndbuf: int = info[3]
        queued: int = info[5]
        return (sndbuf - queued) * 3 // 4

    @classmethod
    def of(cls, sock: Any) -> _KernelRoom | None:
        """The room of ``sock``'s send buffer, if this system tells it."""
        if sock is None or _SO_MEMINFO is None:
            return None
        try:
            _MEMINFO.unpack(sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, _MEMINFO.size))
        except (OSError, ValueError, struct.error):
            return None
        return cls(sock)


class _Outgoing:
    """A large frame waiting in the connection's queue, handed to the kernel slice by slice."""

    __slots__ = ("head", "data", "pos", "owned", "sent", "waiter")

    def __init__(self, head: bytes, data: memoryview) -> None:
        self.head = head  # the encoded prefix and header; b"" once written
        self.data = data  # the payload: the caller's memory until own()
        self.pos = 0  # payload bytes handed over
        self.owned = False
        self.sent = False  # handed over whole (or owned by a closing connection): it goes out
        self.waiter: asyncio.Future[None] | None = None  # a send() waiting until it is handed over

    def __repr__(self) -> str:
        return f"<_Outgoing {self.pos}/{len(self.data)} {'owned' if self.owned else 'caller memory'}>"

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    @property
    def started(self) -> bool:
        return not self.head

    def own(self) -> None:
        """Copy the rest of the payload: the caller's buffer is then free."""
        if not self.owned:
            self.data = memoryview(bytes(self.data[self.pos :]))
            self.pos = 0
            self.owned = True


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
        self._room: _KernelRoom | None = None
        self._peer = peer
        self._frames: collections.deque[Frame] = collections.deque()
        self._recv_waiter: asyncio.Future[None] | None = None
        self._exc: ConnectionClosedError | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self._paused_writing = False  # the transport holds bytes the kernel did not take yet
        self._exposed = False  # ... and some of them are the caller's memory (see _write_slices)
        self._paused_reading = False
        self._reading = True
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Frames that could not be handed to the transport yet, in order: large ones
        # (_Outgoing) and, behind them, small ones copied into bytearrays.
        self._outq: collections.deque[_Outgoing | bytearray] = collections.deque()
        self._wbuf = bytearray()
        self._flush_scheduled = False
        # Coalescing state (see send_nowait): a frame went straight to the
        # transport since the last receive or flush, so the next ones are batched.
        self._wrote = False
        self._delivering = False  # handing a batch of received frames to the frame handler
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_frame: FrameHandler | None = None

    def __repr__(self) -> str:
        return (f"<TCPConnection {self._peer} {self._state.value} unread={len(self._frames)} "
                f"queued={len(self._outq)}>")

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
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self._room = _KernelRoom.of(sock)
        peername = transport.get_extra_info("peername")
        if peername:
            self._peer = f"{peername[0]}:{peername[1]}"
        # Limits of 0: pause_writing whenever anything is left unsent, so that
        # resume_writing tells us the transport's buffer is empty.
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
            self._fail(ConnectionLost(f"protocol error from {self._peer}: {e}"))
            return
        # A payload sink that raised: never kill the loop.
        log.error("payload sink failed on connection %s", self._peer, exc_info=e)
        self._fail(ConnectionLost(f"payload sink failed on connection to {self._peer}: {e!r}"))

    def _update_reading(self) -> None:
        t = self._transport
        if t is None or self._exc is not None:
            return
        want = not self._paused_reading
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
            self._delivering = False
            if self._wbuf and self._exc is None:
                self._write_buffered()
            # Many frames at once (pipelined replies) usually wake many
            # senders: batch their frames until the next iteration.
            self._wrote_now()

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
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._set_exc(ConnectionLost(f"{self._peer} closed the connection"))
        else:
            self._set_exc(ConnectionLost(f"connection to {self._peer} broke: {exc}"))
        self._state = _State.CLOSED
        self._paused_writing = False
        self._drop_sending()
        self._release()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._exposed = False
        if self._outq:
            self._pump()
        elif self._state is _State.CLOSING:
            self._finish_closing()
        if not self._paused_writing and not self._outq:
            self._wake_drainers()

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

    def set_frame_handler(self, handler: FrameHandler | None) -> None:
        if self._exc is not None and handler is not None:
            return  # (closed: nothing will arrive, and the handler must not be kept alive)
        self._on_frame = handler
        while handler is not None and self._frames and self._exc is None and self._on_frame is handler:
            handler(self._frames.popleft())
        if self._paused_reading:
            self._paused_reading = False
            self._update_reading()

    async def send(self, header: Header, payload: Any = None) -> None:
        if self.send_nowait(header, payload):
            return
        last = self._outq[-1] if self._outq else None
        if isinstance(last, _Outgoing) and last.waiter is None and not last.owned:
            await self._until_handed(last)
        else:
            await self._drain()

    async def _until_handed(self, item: _Outgoing) -> None:
        """Wait until ``item`` (our frame, of the caller's memory) is in the kernel's hands.

        Cancellation: a frame that has not started is taken out of the queue
        (not sent at all); one that has is finished from a copy of its rest.
        Either way the caller's buffer is free when this raises.
        """
        assert self._loop is not None
        fut = item.waiter = self._loop.create_future()
        try:
            await fut
        except asyncio.CancelledError:
            self._give_back(item)
            raise
        finally:
            item.waiter = None
        if not item.sent:
            assert self._exc is not None
            raise self._exc

    def _give_back(self, item: _Outgoing) -> None:
        """A send() gave up waiting for ``item``: make sure nothing keeps referring to its payload."""
        if item.sent or item not in self._outq:
            return  # handed over (or dropped) already
        if not item.started:
            self._outq.remove(item)
            item.data = memoryview(b"")  # (the cancelled task's traceback may keep the item alive)
        elif self._exposed and self._outq[0] is item:
            # The kernel refused part of a slice it said it had room for: the transport
            # still reads the caller's memory. Resetting is the only way to let go of it.
            log.warning("resetting connection to %s: a cancelled send's payload was still being read", self._peer)
            self.abort()
        else:
            item.own()

    def try_send(self, header: Header, payload: Any = None) -> bool:
        """Queue one small frame (a copy) if nothing waits: True; else queue nothing: False.

        A large payload (more than the coalescing limit, written without a
        copy) is never taken here: :meth:`send` waits until it is safe to reuse.
        """
        if self._exc is not None or self._paused_writing or self._outq:
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

        After False, a large payload may still be read: keep it unchanged
        until a later ``send`` (or :meth:`drained`) returns.

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
        # Large: queued behind whatever is batched, handed to the kernel slice by slice.
        if self._wbuf:
            self._write_buffered()
        self._outq.append(_Outgoing(head, body))
        if not self._paused_writing and len(self._outq) == 1:
            self._pump()
        self._wrote_now()
        return not self._paused_writing and not self._outq

    def _queue_small(self, data: bytes) -> bool:
        """Write ``data`` now, or batch it for the end of this loop iteration (see :meth:`send_nowait`)."""
        if self._outq:  # behind a large frame still on its way
            last = self._outq[-1]
            if isinstance(last, bytearray):
                last += data
            else:
                self._outq.append(bytearray(data))
            return False
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
        if self._wbuf and self._transport is not None and self._state is _State.OPEN:
            self._write_buffered()

    def _write_buffered(self) -> None:
        data, self._wbuf = self._wbuf, bytearray()
        if self._outq:  # (a large frame went first meanwhile: stay behind it)
            self._outq.append(data)
        else:
            self._transport.write(data)  # type: ignore[union-attr]

    def _pump(self) -> None:
        """Hand queued frames to the transport, in order, while it takes them without holding on."""
        q = self._outq
        t = self._transport
        assert t is not None
        while q and not self._paused_writing:
            item = q[0]
            if type(item) is bytearray:
                q.popleft()
                t.write(item)
                continue
            assert isinstance(item, _Outgoing)
            if not self._write_slices(t, item):
                break
            q.popleft()
            item.sent = True
            item.wake()
        if not q:
            if self._state is _State.CLOSING:
                self._finish_closing()
            elif not self._paused_writing:
                self._wake_drainers()

    def _write_slices(self, t: asyncio.Transport, item: _Outgoing) -> bool:
        """Write ``item`` while the kernel takes it; True once all of it is in the kernel's hands or copied.

        A slice of the caller's memory is only written when the kernel has
        room for all of it (else asyncio's transport would keep referring to
        it); otherwise a small copy, whose leftover the transport keeps
        (``pause_writing``) until the kernel has room again (``resume_writing``).
        """
        data = item.data
        n = len(data)
        while item.pos < n:
            if self._paused_writing:
                return False
            pos = item.pos
            if item.owned:  # (the connection's own copy: the transport may keep it)
                if item.head:
                    t.write(item.head)
                t.write(data[pos:])
                item.head, item.pos = b"", n
                break
            room = self._room.room() if self._room is not None and not item.head else None
            if room is not None and room >= _MIN_VIEW:
                k = min(n - pos, room)
                t.write(data[pos : pos + k])
                if self._paused_writing:  # the kernel did not take all of it after all
                    self._exposed = True
            else:  # the header with the payload's first bytes, or the kernel is (nearly) full: a copy
                k = min(n - pos, _COPY_SLICE)
                t.write(item.head + data[pos : pos + k])
                item.head = b""
            item.pos = pos + k
        # Done, unless the transport still holds part of a slice of the caller's memory (then
        # the frame stays first in the queue until the transport let go of it: resume_writing).
        return not self._exposed

    async def drained(self) -> None:
        """Wait until everything queued was handed to the kernel (raises if the connection closed or broke)."""
        if self._exc is not None:
            raise self._exc
        if self._paused_writing or self._outq:
            await self._drain()

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
        """Break the connection (a protocol error, a local bug in a handler): reset, drop everything."""
        self._set_exc(exc)
        self._state = _State.CLOSED
        self._drop_sending()
        self._release()
        if self._transport is not None:
            self._transport.abort()

    def _drop_sending(self) -> None:
        """Nothing more goes out: wake every sender (they raise) and forget their payloads."""
        self._wbuf = bytearray()
        outq, self._outq = self._outq, collections.deque()
        for item in outq:
            if isinstance(item, _Outgoing):
                item.wake()
        self._wake_drainers()

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
            if self._wbuf:
                self._write_buffered()  # frames batched in this iteration still go out
            for i, item in enumerate(self._outq):  # they still go out, but no longer from their senders' memory
                if isinstance(item, _Outgoing):
                    item.own()
                    if i or not self._exposed:  # (else once the transport let go of the caller's memory)
                        item.sent = True
                        item.wake()
            if not self._outq:
                self._finish_closing()
        elif self._state is _State.CONNECTING:
            self._state = _State.CLOSED
        self._wake_drainers()

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
        self._drop_sending()
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


async def local_address_toward(peer: str | None) -> str:
    """This machine's address on the route to ``peer`` (loopback for a local or missing peer).

    The name is looked up with the loop's resolver (never blocking the loop);
    the route is found with a UDP socket's ``connect``, which sends nothing.
    """
    if not peer or peer == "localhost":
        return "127.0.0.1"
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(peer, None, family=socket.AF_INET,
                                                             type=socket.SOCK_DGRAM)
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
    """asyncio TCP. One instance serves every rank of a process."""

    def __init__(self, *, host: str | None = None) -> None:
        self._host = host
        self._toward: dict[str, str] = {}  # MASTER_ADDR -> local_address_toward(MASTER_ADDR)

    def __repr__(self) -> str:
        return "<TCPNetwork>"

    async def default_host(self) -> str:
        """The address this host's listeners are published under.

        ``127.0.0.1`` for a single-machine job; when the rank's MASTER_ADDR is
        another machine, the local address of the route towards it (so that
        ranks on other nodes can connect back). ``AIODIST_HOST`` overrides both
        (read by the callers).
        """
        if self._host:
            return self._host
        master = getenv("MASTER_ADDR") or ""
        found = self._toward.get(master)
        if found is None:
            found = self._toward[master] = await local_address_toward(master)
        return found

    async def connect(
        self, address: Address, *, timeout: float | None = None, max_frame_size: int | None = None
    ) -> Connection:
        host, port = address
        loop = asyncio.get_running_loop()
        conn = TCPConnection(max_frame_size=max_frame_size or DEFAULT_MAX_FRAME_SIZE, peer=f"{host}:{port}")
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: conn, host, port)
        except TimeoutError:
            conn.abort()
            raise TimeoutError(f"connecting to {host}:{port} timed out after {timeout:g}s") from None
        except OSError as e:
            raise ConnectionLost(f"could not connect to {host}:{port}: {e.strerror or e}") from None
        except BaseException:
            conn.abort()
            raise
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
            return _ServerConnection(listener, handshake_timeout, max_frame_size=mfs)

        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(factory, host or None, port, reuse_address=True)
        except OSError as e:
            raise ConnectionLost(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        listener._server = server
        sockname = server.sockets[0].getsockname()
        listener._address = (host or sockname[0], sockname[1])
        return listener


class _ServerConnection(TCPConnection):
    def __init__(self, listener: TCPListener, handshake_timeout: float | None, **kw: Any) -> None:
        super().__init__(**kw)
        self._listener: TCPListener | None = listener
        self._handshake_timeout = handshake_timeout

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.start_handshake_timer(self._handshake_timeout)
        listener, self._listener = self._listener, None
        assert listener is not None
        listener._accepted(self)
