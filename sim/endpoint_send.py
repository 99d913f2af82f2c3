"""The sending half of a simulated connection: the window, the outbox and the sender's CPU.

:class:`SendPath` is the part of :class:`~sim.endpoints.SimConnection` that
sends: ``send`` / ``try_send`` / ``send_nowait`` / ``drained`` copy a frame
at the send and hand it to the outgoing :class:`~sim.links.Stream`. A frame
waits while the peer's window is full (bytes in flight plus bytes unread in
its kernel beyond the socket buffer), in the outbox for ``send_nowait`` (as
in asyncio's write buffer) or in a blocked ``send``; with a per-message
overhead it departs once the sending host's CPU is done with it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from aiodist.errors import ConnectionClosedError, anew
from aiodist.net.base import Header
from aiodist.wire import as_byte_view

from .headers import wire_header
from .links import Host, Links, Stream

if TYPE_CHECKING:
    from .endpoints import SimConnection


def _wake_future(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)


def _copied(payload: Any) -> tuple[bytearray | None, int]:
    """A payload's bytes, copied at the send (the sender may reuse its buffer), and their count."""
    mv = as_byte_view(payload)
    n = mv.nbytes
    return (bytearray(mv) if n else None), n


class SendPath:
    """Sending on a simulated connection; :class:`~sim.endpoints.SimConnection` holds the state named here."""

    __slots__ = ("_outbox", "_drainers")  # (set in SimConnection.__init__, with the rest of its state)

    _links: Links
    _host: Host
    _peer_ep: SimConnection | None
    _out: Stream | None
    _exc: ConnectionClosedError | None
    _outbox: deque[tuple[Header, bytearray | None, int]] | tuple[()]
    _drainers: list[asyncio.Future[None]] | tuple[()]
    _incoming: int
    _kernel_bytes: int
    _writers: deque[asyncio.Future[None]] | tuple[()]

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
        depart = self._departure() if links.overhead else loop.now  # (no CPU cost per message: it leaves now)
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
        host = self._host
        blocked = links.loop._blocked
        if blocked:  # (a blocking call in this process's step: what it sends leaves when the call ends)
            depart = max(depart, links.loop.lane_clock(host.lane))
        if out.held is None and not links.blocks and not out.vanished:
            links.launch(out, h, data, n, depart)  # (transmit's common case, without the call)
        else:
            links.transmit(out, h, data, n, depart)
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
