"""Connections between processes of one host: frames on a Unix socket, large payloads through shared memory.

:class:`ShmConnection` implements the network seam over a Unix domain stream
socket that carries the ordinary wire frames (so small messages take the same
path as over TCP, minus the TCP stack). A payload larger than
:data:`INLINE_MAX` goes through a *ring* of shared memory instead: each side
creates the ring it sends into (a memfd, see :mod:`.shmseg`) and announces it
in its first frame; the other side maps it and says so, and from then on a
large payload is copied into the ring piece by piece, each piece announced by
a small frame (offset, length) on the socket and acknowledged once the
receiver copied it out into the payload's destination (the buffer a payload
sink supplied, or memory of the connection's own, kept for reuse: see
:class:`~aiodist.net.shmring.Spares`).
Until the peer has mapped the ring, and if it cannot, payloads stay inline.
The payload sink is asked once per payload, when it is announced
(``received`` 0; asking again is optional in the seam's contract): a payload
it has no buffer for is copied out of the ring into memory of our own.

Memory ordering: the sender copies a piece into the ring *before* it writes
the frame that announces it, and the receiver reads the piece only *after*
it read that frame. Both are system calls on one socket, whose queue the
kernel protects with a lock: the sender's stores happen before its release of
that lock, the receiver's loads after its acquisition of it. So the receiver
sees the whole piece, on any architecture (also after glibc's non-temporal
stores, which it fences). The same holds for the acknowledgement in the other
direction, so the sender never overwrites bytes the receiver still copies. A
process killed in the middle of a copy never announces the piece: the peer
sees the socket's end of file, and the half-written bytes are never read.

The frames of this layer carry the key ``"\\x00"``, which a user's header may
not contain; they never reach the user. The socket's end (EOF of a SIGKILLed
peer included) ends the connection at once and unmaps both rings.

The socket's protocol is :class:`~aiodist.net.shmstream.FrameStream`; moving
payloads through the rings is :class:`~aiodist.net.shmtransfer.RingTransfer`.
The network that makes these connections (and TCP ones to other hosts) is
:class:`aiodist.net.shmnet.HostNetwork`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from ..errors import ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, ProtocolError, anew
from ..wire import DEFAULT_MAX_FRAME_SIZE, as_byte_view, encode_header
from .base import Connection, Frame, FrameHandler, Header, PayloadSink
from .shmring import RingSpace, Spares
from .shmseg import PEERS, Segment, SharedMemoryError
from .shmstream import MAX_SALVAGE as MAX_SALVAGE
from .shmstream import FrameStream as FrameStream
from .shmtransfer import _ACK, _FIRST, _HELLO, _K, _MORE, _READY, INLINE_MAX, RingTransfer, _Incoming, _Job, _usable

log = logging.getLogger("aiodist.net")

__all__ = ["ShmConnection", "INLINE_MAX", "RING_BYTES", "PIECE_BYTES", "SPARE_BYTES", "MAX_QUEUED_FRAMES", "MAX_SALVAGE"]

RING_BYTES = 8 << 20
"""Bytes of each direction's ring (memory is only taken by the pages a connection uses)."""
PIECE_BYTES = 1 << 20
"""The largest piece announced at once: the receiver copies one while the sender fills the next."""
SPARE_BYTES = 8 << 20
"""Memory kept per connection for payloads that arrive before anybody waits for them (see :class:`~aiodist.net.shmring.Spares`)."""
MAX_QUEUED_FRAMES = 4096
"""Frames waiting for ``recv``: beyond this many the socket is no longer read."""


class ShmConnection(RingTransfer, Connection):
    """A connection to a process of this host (see the module doc)."""

    def __init__(self, stream: FrameStream, *, peer_pid: int, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._stream = stream
        self._peer = f"pid {peer_pid} (unix socket)"
        self._peer_pid = peer_pid
        self._loop = asyncio.get_running_loop()
        self._max_frame_size = max_frame_size
        self._exc: ConnectionClosedError | None = None
        self._closing = False  # close() was called: no new frames; queued ones still go
        self._frames: collections.deque[Frame] = collections.deque()
        self._recv_waiter: asyncio.Future[None] | None = None
        self._on_frame: Callable[[Frame], None] | None = None
        self._sink: PayloadSink | None = None
        self._paused = False  # too many frames wait for recv: the stream's handler is detached
        self._jobs: collections.deque[_Job] = collections.deque()
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._out: Segment | None = None  # the ring we send into
        self._space: RingSpace | None = None  # set once the peer mapped it (READY)
        self._inline = False  # no ring (ours failed, or the peer could not map it): payloads go inline
        self._answered = False  # the peer said whether it mapped our ring
        self._in: Segment | None = None  # the ring the peer sends into
        self._incoming: _Incoming | None = None
        self._spares = Spares(SPARE_BYTES)
        self._progress = 0  # frames received on the stream (see Connection.progress)
        stream.owner = self
        PEERS.opened(peer_pid)
        stream.set_frame_handler(self._on_stream_frame)
        hello: Header = {_K: _HELLO, "ring": None}
        try:
            self._out = Segment.create(RING_BYTES, name="aiodist-ring")
            hello["ring"] = self._out.ref.pack()
        except SharedMemoryError as e:
            log.info("no shared memory ring towards %s (payloads go inline): %s", self._peer, e)
            self._inline = True
        stream.send_nowait(hello)

    def __repr__(self) -> str:
        state = "closed" if self._exc is not None else "closing" if self._closing else "open"
        ring = "ring" if self._space is not None else "inline" if self._inline else "ring pending"
        return f"<ShmConnection {self._peer} {state} {ring} queued={len(self._jobs)}>"

    # ------------------------------------------------------------------ seam

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def closed(self) -> bool:
        return self._exc is not None

    def set_payload_sink(self, sink: PayloadSink | None) -> None:
        # Called here, in frame order, for inline payloads and ring payloads alike (the stream's
        # decoder would call it for the inline ones as it parses, ahead of a ring payload's first piece).
        if self._exc is None:
            self._sink = sink

    def set_max_frame_size(self, n: int) -> None:
        """Frames (inline or through the ring) whose header has not arrived yet are limited to ``n`` bytes."""
        self._stream.set_max_frame_size(n)  # (first: it refuses a bad value before this side keeps it)
        self._max_frame_size = n

    def set_frame_handler(self, handler: FrameHandler | None) -> None:
        """Deliver frames to ``handler(frame)`` as they complete (queued ones first) instead of through recv."""
        if self._exc is not None and handler is not None:
            return  # (closed: nothing will arrive, and the handler must not be kept alive)
        self._on_frame = handler
        while handler is not None and self._frames and self._on_frame is handler:
            handler(self._frames.popleft())
        self._resume_if_drained()

    def try_send(self, header: Header, payload: Any = None) -> bool:
        """Send now if nothing is in the way (True), else send nothing (False).

        A large payload is taken when the ring has room for all of it: it is
        copied there at once, so the caller's buffer is free when this returns.
        """
        if _K in header:
            raise ValueError(f"a frame header may not contain the key {_K!r} (reserved for the shared memory layer)")
        if self._exc is not None or self._closing or self._jobs:
            return False
        if payload is None:
            return self._stream.try_send(header, payload)
        view = as_byte_view(payload)
        if view.nbytes <= INLINE_MAX or self._inline:
            return self._stream.try_send(header, view)
        if self._space is None or self._space.free < view.nbytes:
            return False
        encode_header(header)  # (raises TypeError now if it cannot go: the ring is not touched for nothing)
        self._jobs.append(_Job(header, view, None))
        self._pump()
        return True

    def send_nowait(self, header: Header, payload: Any = None) -> bool:
        """Queue one frame; False: wait (:meth:`drained`) before sending more, and keep ``payload`` unchanged till then."""
        if self._exc is not None:
            raise anew(self._exc)
        if self._closing:
            raise ConnectionClosedLocally(f"connection to {self._peer} was closed by this side")
        if _K in header:
            raise ValueError(f"a frame header may not contain the key {_K!r} (reserved for the shared memory layer)")
        view = None if payload is None else as_byte_view(payload)
        large = view is not None and view.nbytes > INLINE_MAX and not self._inline
        if not large and not self._jobs:
            return self._stream.send_nowait(header, view)
        if view is not None and not large:
            view = memoryview(bytes(view))  # queued behind a large one: the caller may reuse its buffer at once
        encode_header(header)  # (raises TypeError now if it cannot go: the ring is not touched for nothing)
        self._jobs.append(_Job(header, view, None))
        self._pump()
        return not self._jobs

    async def send(self, header: Header, payload: Any = None) -> None:
        """Send one frame; returns once the caller may reuse ``payload``.

        Cancellation: the frame was queued whole (its remaining bytes are then
        copied, so the caller's buffer is free) or not at all.
        """
        if self._exc is None and not self._closing and not self._jobs and _K not in header:
            if payload is None or self._inline or _nbytes(payload) <= INLINE_MAX:
                await self._stream.send(header, payload)
                return
        if not self.send_nowait(header, payload) and self._jobs:
            # (No view of ``payload`` is kept in this frame: a cancelled send's traceback must not hold it.)
            job = self._jobs[-1]
            job.fut = fut = self._loop.create_future()
            try:
                await fut
            except asyncio.CancelledError:
                self._withdraw(job)
                raise
            finally:
                del job
        await self._stream.drained()

    async def drained(self) -> None:
        """Wait until every queued frame was handed over (raises if the connection closed or broke)."""
        while self._jobs and self._exc is None:
            fut = self._loop.create_future()
            self._drain_waiters.append(fut)
            await fut
        if self._exc is not None:
            raise anew(self._exc)
        await self._stream.drained()

    async def recv(self) -> Frame:
        while not self._frames:
            if self._exc is not None:
                raise anew(self._exc)
            self._recv_waiter = self._loop.create_future()
            try:
                await self._recv_waiter
            finally:
                self._recv_waiter = None
        frame = self._frames.popleft()
        self._resume_if_drained()
        return frame

    def close(self) -> None:
        """Close in order: frames queued to send still go (from copies: the senders' buffers are theirs
        again, and their sends return now, as TCP's do), then end-of-stream; later sends and receives raise
        ConnectionClosedLocally."""
        if self._exc is None:
            self._exc = ConnectionClosedLocally(f"connection to {self._peer} was closed by this side")
            self.release_senders()
        self._closing = True
        self._drop_received()
        self._wake(self._recv_waiter)
        if not self._jobs:
            self._stream.close()
            self._unmap()  # (the peer keeps its own mapping of what it still has to read)

    def release_senders(self) -> None:
        """(Connection.release_senders) Queued frames go on from copies; their senders return now."""
        for job in self._jobs:
            if job.data is not None and not isinstance(job.data.obj, bytes):
                job.data = memoryview(bytes(job.data))
            if job.fut is not None and not job.fut.done():
                job.fut.set_result(None)  # (it waited for ring space a peer that stopped never gives)

    def abort(self) -> None:
        """Reset now: queued frames are dropped (their senders get ConnectionClosedLocally); the peer sees ConnectionLost."""
        if self._exc is None or self._closing:
            self._exc = ConnectionClosedLocally(f"connection to {self._peer} was aborted by this side")
        self._closing = True
        self._set_exc(self._exc)
        self._drop_received()
        self._stream.abort()

    def _drop_received(self) -> None:
        """Unread frames, a half-arrived payload, the sink and the handler go at once (they may refer back to us)."""
        self._frames.clear()
        self._incoming = None
        self._sink = None
        self._on_frame = None

    async def wait_closed(self) -> None:
        await self._stream.wait_closed()

    # ------------------------------------------------------------------ receiving

    @property
    def progress(self) -> int:
        return self._progress

    def _on_stream_frame(self, frame: Frame) -> None:
        self._progress += 1  # (a large payload's pieces are announced by frames too)
        header = frame.header
        if _K not in header:
            if self._incoming is not None:
                self._fail(ProtocolError("a frame arrived in the middle of a payload"))
                return
            if frame.payload is not None and self._sink is not None:
                target = self._sink(header, frame.payload.nbytes, 0)
                if target is not None:
                    target = _usable(target, frame.payload.nbytes)
                    target[:] = frame.payload
                    frame = Frame(header, target)
            self._deliver(frame)
            return
        try:
            self._control(header)
        except ProtocolError as e:
            self._fail(e)
        except (SharedMemoryError, ValueError, TypeError, KeyError) as e:
            self._fail(ProtocolError(f"bad shared memory frame {header!r}: {e}"))

    def _deliver(self, frame: Frame) -> None:
        if self._exc is not None:
            return
        on_frame = self._on_frame
        if on_frame is not None and not self._frames:
            on_frame(frame)
            return
        self._frames.append(frame)
        if len(self._frames) > MAX_QUEUED_FRAMES and not self._paused:
            self._paused = True  # the stream keeps what comes next (and stops reading) until recv catches up
            self._stream.set_frame_handler(None)
        self._wake(self._recv_waiter)

    def _resume_if_drained(self) -> None:
        if self._paused and len(self._frames) <= MAX_QUEUED_FRAMES // 2:
            self._paused = False
            if self._stream.closed:  # (it takes no handler any more: what it kept for us comes out here)
                for frame in self._stream.take_unread():
                    self._on_stream_frame(frame)
            else:
                self._stream.set_frame_handler(self._on_stream_frame)

    def _control(self, h: Header) -> None:
        kind = h[_K]
        if kind == _FIRST or kind == _MORE:
            self._piece(h, kind == _FIRST)
        elif kind == _ACK:
            if self._space is None:
                raise ProtocolError("an acknowledgement before any piece")
            self._space.release(h["l"])
            if self._jobs:
                self._pump()
        elif kind == _HELLO:
            self._hello(h)
        elif kind == _READY:
            if self._answered:
                raise ProtocolError("a second answer about the ring")
            self._answered = True
            if h["ok"] is True and self._out is not None:
                self._space = RingSpace(self._out.ref.size, PIECE_BYTES)
            else:
                self._inline = True
            if self._jobs:
                self._pump()
        else:
            raise ProtocolError(f"unknown shared memory frame kind {kind!r}")

    # ------------------------------------------------------------------ the end

    def _fail(self, e: ProtocolError) -> None:
        log.info("closing the connection to %s: %s", self._peer, e)
        self._set_exc(ConnectionLost.protocol_error(self._peer, e))
        self._stream.close()

    def _stream_lost(self, exc: Exception | None) -> None:
        if self._paused and self._exc is None:  # frames it kept for us arrived before the end: they count
            self._paused = False
            for frame in self._stream.take_unread():
                self._on_stream_frame(frame)
        if exc is None:
            self._set_exc(ConnectionLost(f"{self._peer} closed the connection"))
        else:
            self._set_exc(ConnectionLost(f"connection to {self._peer} broke: {exc}"))
        self._release()
        PEERS.closed(self._peer_pid)

    def _set_exc(self, exc: ConnectionClosedError) -> None:
        if self._exc is None:
            self._exc = exc
        jobs, self._jobs = self._jobs, collections.deque()
        for job in jobs:
            job.data = None
            if job.fut is not None and not job.fut.done():
                job.fut.set_exception(self._exc)
        self._incoming = None
        self._wake(self._recv_waiter)
        self._wake_drainers()

    def _release(self) -> None:
        """The stream ended: drop what refers back to us and unmap both rings (frames not read yet stay for recv)."""
        self._incoming = None
        self._sink = None
        self._on_frame = None
        self._stream.set_frame_handler(None)
        self._unmap()

    def _unmap(self) -> None:
        """Both rings and the spare memory go (nothing is sent or read through them any more)."""
        for seg in (self._out, self._in):
            if seg is not None:
                seg.close()
        self._out = self._in = None
        self._space = None
        self._spares.clear()

    def _wake_drainers(self) -> None:
        if not self._jobs or self._exc is not None:
            waiters, self._drain_waiters = self._drain_waiters, []
            for fut in waiters:
                self._wake(fut)

    @staticmethod
    def _wake(fut: asyncio.Future[None] | None) -> None:
        if fut is not None and not fut.done():
            fut.set_result(None)


def _nbytes(payload: Any) -> int:
    """The size of ``payload``'s buffer, without keeping a view of it."""
    with memoryview(payload) as view:
        return view.nbytes
