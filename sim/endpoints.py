"""A simulated connection's endpoint (aiodist's Connection seam): what it holds and how it receives.

:class:`SimConnection` implements :class:`aiodist.net.base.Connection`. An
endpoint owns its buffers (frames the program has not read, the kernel's
receive buffer, frames waiting for room in the window) and hands what it
sends to its outgoing :class:`~sim.links.Stream` (the sending half is
:class:`~sim.endpoint_send.SendPath`); :class:`~sim.links.Links` decides
when each frame arrives. Hosts, listeners and connecting:
:mod:`sim.host_network` and the run's fabric (:mod:`sim.network`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from aiodist.errors import ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, anew
from aiodist.net.base import Connection, Frame, FrameHandler, Header, PayloadSink
from aiodist.wire import DEFAULT_MAX_HEADER_SIZE, encode_header

from .endpoint_send import SendPath
from .links import Host, Links, Stream


def _fail_future(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _connected(fut: asyncio.Future[Any], conn: SimConnection) -> None:
    if fut.done():
        conn.close()
    else:
        fut.set_result(conn)


# --------------------------------------------------------------------------- the seam


class SimConnection(SendPath, Connection):
    """One endpoint of a simulated connection (see the module docstring)."""

    # Slotted: a big run has ~20 endpoints per rank, and each touches its own attributes on every
    # frame (a slotted instance is a quarter of one with a dict, and its fields sit together).
    __slots__ = ("_links", "_host", "_peer_host", "_id", "_peer_ep", "_out", "_frames", "_waiter", "_exc", "_sink",
                 "_fin_sent", "_max_frame_size", "_closed_fut", "_paused", "_kernel", "_kernel_bytes", "_incoming",
                 "_writers", "_on_frame", "_draining")  # (and SendPath's)

    def __init__(self, links: Links, host: Host, peer_host: Host, cid: int, max_frame_size: int) -> None:
        self._links = links
        self._host = host
        self._peer_host = peer_host
        self._id = cid
        self._peer_ep: SimConnection | None = None
        self._out: Stream | None = None  # what this side sends travels there (set once both ends exist)
        # Frames the program has not read (recv, or a handler's backlog): a deque once first needed.
        self._frames: deque[Frame] | tuple[()] = ()
        # set_frame_handler
        self._on_frame: FrameHandler | None = None
        self._draining = False
        # send_nowait: frames the window could not take yet (TCP: asyncio's write buffer), and drained() waiters
        self._outbox: deque[tuple[Header, bytearray | None, int]] | tuple[()] = ()
        self._drainers: list[asyncio.Future[None]] | tuple[()] = ()
        self._waiter: asyncio.Future[None] | None = None
        self._exc: ConnectionClosedError | None = None
        self._sink: PayloadSink | None = None
        self._fin_sent = False
        self._max_frame_size = max_frame_size
        self._closed_fut: asyncio.Future[None] | None = None
        # Flow control (see Network.max_unread_frames / socket_buffer): frames this side's
        # protocol has not read yet because its queue is full, and the senders waiting for room.
        # Both stay an empty tuple until first needed: a deque costs ~600 bytes, and a 4096-rank run
        # has ~100k endpoints that almost never use them.
        self._paused = False
        self._kernel: deque[tuple[Header, bytearray | None, int]] | tuple[()] = ()
        self._kernel_bytes = 0
        # Bytes the peer sent to this side that have not arrived yet. Kept here, on the receiving
        # end, rather than on the sender: a delivery then touches only its own endpoint.
        self._incoming = 0
        self._writers: deque[asyncio.Future[None]] | tuple[()] = ()

    def __repr__(self) -> str:
        state = "closed" if self._exc is not None else "open"
        return f"<SimConnection {self._host.name}->{self._peer_host.name} #{self._id} {state}>"

    @property
    def peer(self) -> str:
        return f"sim:{self._peer_host.name}"

    @property
    def closed(self) -> bool:
        return self._exc is not None

    def set_payload_sink(self, sink: PayloadSink | None) -> None:
        if self._exc is None:
            self._sink = sink

    def set_max_frame_size(self, n: int) -> None:
        """Frames delivered from now on are limited to ``n`` bytes (msgpack header + payload), as on TCP."""
        if n <= 0:
            raise ValueError(f"max_frame_size must be positive, got {n}")
        self._max_frame_size = n

    def set_frame_handler(self, handler: FrameHandler | None) -> None:
        """Deliver frames by calling ``handler(frame)`` as they arrive, instead of through :meth:`recv`.

        The same contract as :meth:`aiodist.net.tcp.TCPConnection.set_frame_handler`:
        frames already queued are handed over first, in order; :meth:`recv` then only
        reports the end of the connection. A handler that raises breaks the connection.
        ``None`` goes back to queueing frames for :meth:`recv`.
        """
        self._on_frame = handler
        if handler is not None and not self._draining:
            self._dispatch()  # (while a dispatch runs, it hands the rest to the new handler)
        elif self._paused and self._exc is None and len(self._frames) < self._links.max_unread_frames:
            self._resume(self._links.max_unread_frames)

    def _dispatch(self) -> None:
        """Hand the queued frames to the frame handler, in order, then read what waits in the kernel.

        ``_draining`` marks a dispatch in progress: frames taken meanwhile (a
        handler that swaps handlers, a resume) are queued and this loop hands
        them over, so a handler is never re-entered and order is kept.
        """
        self._draining = True
        try:
            while self._frames and self._exc is None:  # (read anew: a frame queued meanwhile may start the deque)
                handler = self._on_frame
                if handler is None or not self._handle(handler, self._frames.popleft()):
                    return
        finally:
            self._draining = False
            if not self._frames:
                self._frames = ()  # (an idle endpoint keeps no deque: ~600 bytes each, ~20 per rank)
        if self._paused and self._exc is None and len(self._frames) < self._links.max_unread_frames:
            self._resume(self._links.max_unread_frames)  # the queue emptied: read what waits in the kernel

    def _handle(self, handler: FrameHandler, frame: Frame) -> bool:
        try:
            handler(frame)
        except Exception as e:  # noqa: BLE001 - mirror TCP: a failing handler breaks the connection
            self._abort(f"frame handler failed on connection to {self.peer}: {e!r}")
            return False
        return True

    def _deliver(self, header: Header, data: bytearray | None, n: int, msg: int) -> None:
        """A frame arrived (the link's delivery): account for it, fire a receive trigger, then let it in."""
        self._incoming -= n
        links = self._links
        if self._writers and self._incoming + self._kernel_bytes <= links.socket_buffer:
            self._wake_writers()
        if self._exc is not None:
            return
        host = self._host
        loop = links.loop
        tracer = links.tracer
        if tracer.keep:  # (the digest has the arrival already: the send's entry holds it)
            tracer.delivered(loop.now, host, self._peer_host, n, msg)
        host.received += 1
        if host.received >= host.watch_recv:
            # A receive trigger fires before the program sees the frame: a crash it causes leaves
            # the frame unread (the handler would otherwise run first); a pause it causes holds it.
            links.on_recv(host)
            if self._exc is not None:
                return
            if loop.lane_paused(host.lane):  # the program reads it first thing once it runs again
                loop.first_on_resume(host.lane, self._arrived, (header, data, n), host.ctx)  # type: ignore[arg-type]
                return
        if self._paused:  # our protocol stopped reading: the bytes wait in the kernel
            self._buffer(header, data, n)
        else:
            self._take(header, data, n)

    def _arrived(self, header: Header, data: bytearray | None, n: int) -> None:
        """The rest of a delivery a receive trigger paused this process for."""
        if self._exc is None:
            if self._paused:
                self._buffer(header, data, n)
            else:
                self._take(header, data, n)

    def _buffer(self, header: Header, data: bytearray | None, n: int) -> None:
        if not self._kernel:
            self._kernel = deque()
        self._kernel.append((header, data, n))
        self._kernel_bytes += n

    def _take(self, header: Header, data: bytearray | None, n: int) -> None:
        """The protocol reads one frame: into the sink's buffer or a fresh one, then the queue."""
        limit = self._max_frame_size
        if n + DEFAULT_MAX_HEADER_SIZE > limit and n + len(encode_header(header)) > limit:  # (rarely encoded)
            self._abort(f"frame of {n + len(encode_header(header))} bytes from {self._peer_host.name} exceeds "
                        f"the limit of {limit} bytes")
            return
        if data is None:
            payload = None
        else:
            sink = self._sink
            target = None
            if sink is not None:
                try:
                    target = sink(header, n, 0)  # (asked once: a payload arrives here whole)
                    if target is not None:
                        if target.nbytes != n or target.readonly or not target.c_contiguous:
                            raise ValueError(f"payload sink returned an unusable buffer for {n} bytes")
                        if target.format != "B" or target.ndim != 1:
                            target = target.cast("B")
                        target[:] = data
                except Exception as e:  # noqa: BLE001 - mirror TCP: a failing sink breaks the connection
                    self._abort(f"payload sink failed on connection to {self.peer}: {e!r}")
                    return
            payload = target if target is not None else memoryview(data)
        frame = Frame(header, payload)
        frames = self._frames
        handler = self._on_frame
        if handler is not None and not frames and not self._draining:
            # The fast path: hand the frame to the handler now, inside the delivery step, as
            # TCP's data_received does (no queue, no extra loop step, no reader task).
            self._draining = True
            try:
                handler(frame)
            except Exception as e:  # noqa: BLE001 - mirror TCP: a failing handler breaks the connection
                self._abort(f"frame handler failed on connection to {self.peer}: {e!r}")
                return
            finally:
                self._draining = False
            if self._frames:  # the handler swapped handlers or resumed reading meanwhile
                self._dispatch()
            return
        if not frames:
            frames = self._frames = deque()
        frames.append(frame)
        if len(frames) >= self._links.max_unread_frames:
            self._paused = True  # like aiodist.net.tcp: stop reading beyond this many unread frames
        if handler is not None:
            if not self._draining:
                self._dispatch()
            return
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _resume(self, limit: int) -> None:
        """Read what waits in the kernel (up to ``limit`` queued frames) and wake blocked senders."""
        self._paused = False
        kernel = self._kernel
        while kernel and not self._paused and self._exc is None and len(self._frames) < limit:
            header, data, n = kernel.popleft()
            self._kernel_bytes -= n
            self._take(header, data, n)
        if kernel:
            self._paused = True
        if self._writers and self._incoming + self._kernel_bytes <= self._links.socket_buffer:
            self._wake_writers()

    def _wake_writers(self) -> None:
        while self._writers:
            w = self._writers.popleft()
            if not w.done():
                w.set_result(None)

    async def recv(self) -> Frame:
        """Next frame; frames that arrived before the peer closed are returned first.

        Cancellation leaves the connection intact and loses no frame.
        """
        while not self._frames:
            if self._exc is not None:
                raise anew(self._exc)
            self._waiter = asyncio.Future(loop=self._links.loop)
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame = self._frames.popleft()
        if not self._frames:
            self._frames = ()  # (see _dispatch)
        if self._paused and len(self._frames) <= self._links.max_unread_frames // 2:
            self._resume(self._links.max_unread_frames)
        return frame

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        self._wake_writers()
        if self._drainers:
            self._wake_drainers()
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)

    def _fail(self, exc: ConnectionClosedError) -> None:
        if self._exc is None:
            self._exc = exc
        self._fin_sent = True
        self._host.endpoints.pop(self._id, None)
        self._release()
        self._wake()

    def _abort(self, reason: str) -> None:
        """Break this connection from this side: both ends see ConnectionLost."""
        self._fail(ConnectionLost(reason))
        peer = self._peer_ep
        if peer is not None and peer._exc is None:
            peer._fail(ConnectionLost(f"connection reset by {self._host.name}: {reason}"))

    def _remote_closed(self, reason: str) -> None:
        kernel = self._kernel
        while kernel and self._exc is None:  # the FIN comes after the data: all of it stays readable
            header, data, n = kernel.popleft()  # (not _resume: it stops at max_unread_frames again)
            self._kernel_bytes -= n
            self._take(header, data, n)
        if self._exc is None:
            self._exc = ConnectionLost(f"{self._peer_host.name} closed the connection ({reason})")
            self._links.tracer.emit(self._links.loop.now, "fin", self._host.name, self._peer_host.name,
                                    detail=reason)
        self._fin_sent = True
        self._host.endpoints.pop(self._id, None)
        self._release()
        self._wake()

    def _send_fin(self, reason: str) -> None:
        if not self._fin_sent and self._out is not None:
            self._fin_sent = True
            self._out.fin_reason = reason
            self._links.transmit(self._out, None, None, 0, self._links.loop.now)

    def _broke(self, reason: str) -> None:
        """The link gave up on what this side sent (retransmit timeout): the connection is lost here."""
        if self._exc is None:
            self._fail(ConnectionLost(reason))

    def _die(self, reason: str) -> None:
        """The owning process crashed: the kernel delivers what was sent, then a FIN."""
        self._send_fin(reason)
        if self._exc is None:
            self._exc = ConnectionLost(reason)

    def _vanish(self, reason: str) -> None:
        """The owning machine vanished: nothing is sent or acknowledged any more; the peer is not told."""
        peer = self._peer_ep
        if peer is not None and peer._out is not None:
            peer._out.vanished = True
        if self._exc is None:
            self._exc = ConnectionLost(reason)

    def close(self) -> None:
        """Close in order: what :meth:`send_nowait` queued still leaves, then the FIN. See the seam."""
        if self._exc is None:
            self._exc = ConnectionClosedLocally(f"connection to {self.peer} was closed by this side")
            self._frames = ()
            outbox, self._outbox = self._outbox, ()
            for h, data, n in outbox:  # what was queued still leaves, before the FIN (as TCP flushes on close)
                self._put(h, data, n, self._links.loop.now)
        self._send_fin("closed")
        self._host.endpoints.pop(self._id, None)
        self._release()
        self._wake()

    def abort(self) -> None:
        """Reset: frames still queued here are dropped and the peer sees ConnectionLost at once."""
        if self._exc is None or not isinstance(self._exc, ConnectionLost):
            self._exc = ConnectionClosedLocally(f"connection to {self.peer} was aborted by this side")
        self._frames = ()
        self._outbox = ()
        self._fin_sent = True
        self._host.endpoints.pop(self._id, None)
        self._release()
        self._wake()
        peer = self._peer_ep
        if peer is not None and peer._exc is None:
            self._links.tracer.emit(self._links.loop.now, "reset", self._host.name, self._peer_host.name,
                                    detail="aborted")
            peer._fail(ConnectionLost(f"connection reset by {self._host.name}"))

    def _release(self) -> None:
        """Forget the sink and the frame handler (they may refer back to this connection)."""
        self._sink = None
        if self._on_frame is not None:
            self._on_frame = None

    async def wait_closed(self) -> None:
        return None
