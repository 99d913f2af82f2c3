"""The simulated network seam: connections, listeners and each host's network view.

:class:`SimConnection`, :class:`SimListener` and :class:`HostNetwork`
implement :mod:`aiodist.net.base`. An endpoint owns its buffers (frames the
program has not read, the kernel's receive buffer, frames waiting for room
in the window) and hands what it sends to its outgoing
:class:`~sim.links.Stream`; :class:`~sim.links.Links` decides when each frame
arrives. Connecting goes through the run's fabric (:mod:`sim.network`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from aiodist.errors import ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, anew
from aiodist.net.base import Address, Connection, ConnectionHandler, Frame, FrameHandler, Header, Listener, PayloadSink
from aiodist.net.base import Network as _SeamNetwork
from aiodist.wire import DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_SIZE, as_byte_view, encode_header

from .headers import wire_header
from .links import Host, Links, Stream

LOCAL_NAMES = frozenset({"", "0.0.0.0", "::", "127.0.0.1", "localhost", "::1"})
"""Addresses that mean "this host" (listen on them, or connect to yourself)."""


def _fail_future(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _wake_future(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)


def _copied(payload: Any) -> tuple[bytearray | None, int]:
    """A payload's bytes, copied at the send (the sender may reuse its buffer), and their count."""
    mv = as_byte_view(payload)
    n = mv.nbytes
    return (bytearray(mv) if n else None), n


def _connected(fut: asyncio.Future[Any], conn: SimConnection) -> None:
    if fut.done():
        conn.close()
    else:
        fut.set_result(conn)


# --------------------------------------------------------------------------- the seam


class SimConnection(Connection):
    """One endpoint of a simulated connection (see the module docstring)."""

    # Slotted: a big run has ~20 endpoints per rank, and each touches its own attributes on every
    # frame (a slotted instance is a quarter of one with a dict, and its fields sit together).
    __slots__ = ("_links", "_host", "_peer_host", "_id", "_peer_ep", "_out", "_frames", "_waiter", "_exc", "_sink",
                 "_fin_sent", "_max_frame_size", "_closed_fut", "_paused", "_kernel", "_kernel_bytes", "_incoming",
                 "_writers", "_on_frame", "_draining", "_outbox", "_drainers")

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

    async def send(self, header: Header, payload: Any = None) -> None:
        """Copy the frame onto the link; return when the sender's CPU is done with it.

        With a per-message ``overhead`` o, the host's CPU handles its sends one
        at a time: the frame departs (and ``send`` returns) o after the CPU is
        free. Cancellation: the frame was handed over before the first await,
        so it is sent even if that wait is cancelled.
        """
        if self._exc is not None:
            raise anew(self._exc)
        h = wire_header(header)
        data, n = (None, 0) if payload is None else _copied(payload)
        links = self._links
        loop = links.loop
        if loop.lane in loop.dead_lanes:  # the rest of a step of a process that just crashed
            await loop.create_future()
        peer = self._peer_ep
        if peer is not None and (self._outbox or peer._incoming + peer._kernel_bytes > links.socket_buffer):
            await self._wait_for_room(peer)  # the window is full: bytes in flight or unread in the peer's kernel
        now = loop.now
        depart = self._departure() if links.overhead else now
        self._put(h, data, n, depart)
        if loop.lane in loop.dead_lanes:  # a send trigger crashed this process
            await loop.create_future()
        if depart > now:
            waiter = loop.create_future()
            loop.schedule(depart, loop.lane, _wake_future, (waiter,), links.kernel_ctx)
            await waiter

    def try_send(self, header: Header, payload: Any = None) -> bool:
        """:meth:`send` when it would not wait (True), without a coroutine; else send nothing (False).

        It would wait with a per-message overhead, a send trigger due at this
        frame (it may crash the sender), a full window, or in a crashed process.
        """
        links = self._links
        loop = links.loop
        peer = self._peer_ep
        host = self._host
        if (self._exc is not None or links.overhead or host.sent + 1 >= host.watch_fatal or peer is None
                or self._outbox or peer._incoming + peer._kernel_bytes > links.socket_buffer or loop.lane in loop.dead_lanes):
            return False
        h = wire_header(header)
        data, n = (None, 0) if payload is None else _copied(payload)
        self._put(h, data, n, loop.now)
        return True

    def send_nowait(self, header: Header, payload: Any = None) -> bool:
        """Queue one frame without waiting, as TCP's does; False: await :meth:`drained` before sending more.

        A frame the window cannot take now waits on this side (TCP: in asyncio's
        write buffer) and leaves, in order, as the peer reads; so does everything
        sent after it. False also when the sender's CPU is still busy with it (a
        per-message overhead). In a crashed process nothing leaves and
        :meth:`drained` never returns.
        """
        if self._exc is not None:
            raise anew(self._exc)
        h = wire_header(header)
        data, n = (None, 0) if payload is None else _copied(payload)
        links = self._links
        loop = links.loop
        if loop.lane in loop.dead_lanes:
            return False
        peer = self._peer_ep
        if self._outbox or (peer is not None and peer._incoming + peer._kernel_bytes > links.socket_buffer):
            if not self._outbox:
                self._outbox = deque()
                self._flush_when_read()
            self._outbox.append((h, data, n))
            return False
        depart = self._departure()
        self._put(h, data, n, depart)
        if loop.lane in loop.dead_lanes:  # a send trigger crashed this process
            return False
        return depart <= loop.now

    async def drained(self) -> None:
        """Wait until the frames :meth:`send_nowait` queued have left and the CPU is done with them.

        Raises if the connection broke. Cancellation leaves the queued frames queued.
        """
        loop = self._links.loop
        if loop.lane in loop.dead_lanes:
            await loop.create_future()
        while self._outbox and self._exc is None:
            fut: asyncio.Future[None] = loop.create_future()
            if not self._drainers:
                self._drainers = []
            self._drainers.append(fut)
            try:
                await fut
            finally:
                if fut in self._drainers:
                    self._drainers.remove(fut)
        if self._exc is not None:
            raise anew(self._exc)
        busy = self._host.cpu_free
        if busy > loop.now:
            waiter = loop.create_future()
            loop.schedule(busy, loop.lane, _wake_future, (waiter,), self._links.kernel_ctx)
            await waiter

    def _flush_when_read(self) -> None:
        """Send the outbox on once the peer reads (a writer's wake-up on the peer's side)."""
        peer = self._peer_ep
        assert peer is not None
        fut = self._links.loop.create_future()
        fut.add_done_callback(self._flush_outbox)
        if not peer._writers:
            peer._writers = deque()
        peer._writers.append(fut)

    def _flush_outbox(self, _: Any = None) -> None:
        """Hand queued frames to the link while the window has room; the rest waits for the next read."""
        outbox = self._outbox
        links = self._links
        loop = links.loop
        peer = self._peer_ep
        while outbox and self._exc is None:
            if peer is not None and peer._exc is None and peer._incoming + peer._kernel_bytes > links.socket_buffer:
                self._flush_when_read()
                return
            h, data, n = outbox.popleft()
            self._put(h, data, n, self._departure())
            if loop.lane in loop.dead_lanes:  # a send trigger crashed this process
                return
        self._outbox = ()
        self._wake_drainers()

    def _wake_drainers(self) -> None:
        drainers, self._drainers = self._drainers, ()
        for w in drainers:
            if not w.done():
                w.set_result(None)

    def _departure(self) -> float:
        """When a frame sent now leaves: now, or once the sender's CPU is done with it (o each, LogP)."""
        links = self._links
        now = links.loop.now
        if not links.overhead:
            return now
        host = self._host
        start = now if now > host.cpu_free else host.cpu_free
        host.cpu_free = start + links.overhead * host.factor
        return host.cpu_free

    def _put(self, h: Header, data: bytearray | None, n: int, depart: float) -> None:
        """Hand the frame to the link (it departs at ``depart``); a send trigger due now fires."""
        peer = self._peer_ep
        if peer is not None:
            peer._incoming += n  # in flight towards the peer (held frames too) until delivered
        links = self._links
        out = self._out
        assert out is not None
        if out.held is None and not links.blocks and not out.vanished:
            links.launch(out, h, data, n, depart)  # (transmit's common case, without the call)
        else:
            links.transmit(out, h, data, n, depart)
        host = self._host
        host.sent += 1
        if host.sent >= host.watch_sent:
            links.on_send(host, out.dst)

    async def _wait_for_room(self, peer: SimConnection) -> None:
        """Block like a TCP send whose kernel buffer is full (or behind queued frames), until the peer reads.

        Cancellation: nothing was queued.
        """
        loop = self._links.loop
        limit = self._links.socket_buffer
        while (self._outbox or peer._incoming + peer._kernel_bytes > limit) and self._exc is None and peer._exc is None:
            fut = loop.create_future()
            if not peer._writers:
                peer._writers = deque()
            peer._writers.append(fut)
            try:
                await fut
            finally:
                if fut in peer._writers:
                    peer._writers.remove(fut)
        if self._exc is not None:
            raise anew(self._exc)

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


class SimListener(Listener):
    """Accepts simulated connections on one host:port; owns the handler tasks."""

    def __init__(self, loop: Any, host: Host, address: Address, handler: ConnectionHandler,
                 max_frame_size: int, errors: list[str]) -> None:
        self._loop = loop
        self._errors = errors  # (where a handler's unexpected error is reported)
        self._host = host
        self._address = address
        self._handler = handler
        self._max_frame_size = max_frame_size
        self._conns: dict[int, SimConnection] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._closing = False

    def __repr__(self) -> str:
        return f"<SimListener {self._address[0]}:{self._address[1]} conns={len(self._conns)}>"

    @property
    def address(self) -> Address:
        return self._address

    def _accept(self, conn: SimConnection) -> None:
        self._conns[conn._id] = conn
        self._tasks[conn._id] = self._loop.create_task(self._run_handler(conn))

    async def _run_handler(self, conn: SimConnection) -> None:
        try:
            await self._handler(conn)
        except (asyncio.CancelledError, ConnectionClosedError):
            pass
        except Exception as e:  # noqa: BLE001 - like TCP: log, close the connection, keep serving
            self._errors.append(f"{self._host.name}: connection handler failed: {e!r}")
        finally:
            conn.close()
            self._conns.pop(conn._id, None)
            self._tasks.pop(conn._id, None)

    def _unbind(self) -> None:
        port = self._address[1]
        if self._host.listeners.get(port) is self:
            del self._host.listeners[port]

    def close(self) -> None:
        self._closing = True
        self._unbind()
        for conn in list(self._conns.values()):
            conn.close()
        for task in list(self._tasks.values()):
            task.cancel()

    def _crash(self, reason: str) -> None:
        self._closing = True
        self._unbind()
        for conn in list(self._conns.values()):
            conn._die(reason)
        for task in list(self._tasks.values()):
            task.cancel()

    async def wait_closed(self) -> None:
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class Dialer(Protocol):
    """What a host's network view needs from the run's fabric (:class:`sim.network.Fabric`)."""

    links: Links
    handler_errors: list[str]

    async def connect(self, src: Host, address: Address, timeout: float | None) -> SimConnection: ...


class HostNetwork(_SeamNetwork):
    """One virtual host's view of the simulated network (aiodist's Network seam)."""

    __slots__ = ("_host", "fabric")

    def __init__(self, host: Host, fabric: Dialer) -> None:
        self._host = host
        self.fabric = fabric

    def __repr__(self) -> str:
        return f"<sim.HostNetwork {self._host.name}>"

    async def default_host(self) -> str:
        return self._host.name

    async def connect(self, address: Address, *, timeout: float | None = None,
                      max_frame_size: int | None = None, ssl: Any = None) -> Connection:
        """Open a connection (a round trip). ConnectionLost if refused/unknown; TimeoutError on timeout.

        ``ssl`` is accepted and has no effect: the simulated links run inside
        one process, with nothing to encrypt.

        Cancellation (or the timeout): nothing is left behind; a connection
        the peer accepted meanwhile is closed (the peer sees ConnectionLost).
        """
        loop = self.fabric.links.loop
        if loop.lane in loop.dead_lanes:
            await loop.create_future()
        conn = await self.fabric.connect(self._host, address, timeout)
        if max_frame_size is not None:
            conn.set_max_frame_size(max_frame_size)
        return conn

    async def listen(
        self,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int | None = None,
        handshake_timeout: float | None = None,
        ssl: Any = None,
    ) -> Listener:
        """Bind ``address`` on this host (port 0 picks a free port); ConnectionLost if taken. (``ssl``: as connect.)"""
        fabric = self.fabric
        links = fabric.links
        host, port = address
        h = self._host
        if str(host) not in LOCAL_NAMES and str(host) != h.name:
            raise ConnectionLost(f"cannot listen on {host}:{port}: not an address of {h.name}")
        port = int(port)
        if port == 0:
            while h.next_port in h.listeners:
                h.next_port += 1
            port = h.next_port
            h.next_port += 1
        if port in h.listeners:
            raise ConnectionLost(f"cannot listen on {host}:{port}: address already in use")
        listener = SimListener(links.loop, h, (str(host) or h.name, port), handler,
                               max_frame_size or DEFAULT_MAX_FRAME_SIZE, fabric.handler_errors)
        h.listeners[port] = listener
        links.tracer.emit(links.loop.now, "listen", h.name, detail=str(port))
        return listener
