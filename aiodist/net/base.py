"""The network seam: what the runtime needs from a network, and nothing more.

Two implementations exist: :mod:`aiodist.net.tcp` (asyncio TCP, the real one)
and ``sim.endpoints`` (simulated links on a virtual clock). The runtime only
ever talks to :func:`aiodist.context.current_network`, never to a concrete
class, so the simulator runs the production code unchanged. Every method the
runtime calls is declared here; ``tests/net_conformance`` runs the same tests
against both implementations.

A :class:`Connection` carries *frames*: a msgpack-able ``dict`` header plus an
optional raw byte payload. Frames are delivered whole and in order (TCP-like:
no silent loss on a live connection). Errors say whose fault it is:

* :class:`~aiodist.errors.ConnectionLost`: the peer closed or reset the
  connection, the network broke it, or the peer sent bytes that break the
  protocol (a frame over the size limit included). Not your doing.
* :class:`~aiodist.errors.ConnectionClosedLocally`: this side called
  :meth:`Connection.close` or :meth:`Connection.abort`. Your doing.
* ``TypeError`` / ``ValueError`` from a send: the header is not serializable
  or the payload is not a C-contiguous buffer; nothing was sent.
"""

from __future__ import annotations

import abc
import asyncio
import ssl as _ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

Address = tuple[str, int]
"""A (host, port) pair. Port 0 in :meth:`Network.listen` means "pick one"."""

Header = dict[str, Any]

PayloadSink = Callable[[Header, int, int], "memoryview | None"]
"""Called with (header, payload_nbytes, received) to ask where a frame's payload goes.

First when the frame's header has arrived, before its payload is read
(``received`` is 0). Return a writable, C-contiguous ``memoryview`` of
exactly ``payload_nbytes`` bytes to receive the payload straight into it
(zero copy), or ``None``: the connection then receives the payload into
memory of its own that grows with the bytes that actually arrive (never the
size the header claims, up front).

Asked again: after ``None``, while the rest of that payload is still
arriving, the connection may ask again with the same header object and
``received`` > 0 (how many of its bytes arrived into its own memory), at its
chunk boundaries (TCP: 64 KiB chunks, then chunks as large as what arrived
before, and one loop turn before each next chunk is read, so a task woken
meanwhile can post its receive); it never waits for an answer beyond that. A buffer named then gets those bytes copied in and the rest lands
there directly; the frame's payload is that buffer, and it is not asked
about that frame again. ``None`` again: nothing changes (it may be asked
again later). A re-ask is about the frame already announced, never a new
one: the sink tells them apart by ``received`` (and the header object).
Asking again is optional for a connection: one whose payloads arrive whole
(the simulator) asks once. So a sink that can name a buffer only once
a receive was posted (a peer a step ahead) still gets most of the payload
written in place.

It runs synchronously inside the connection's receive path: it must be
quick. One that raises, or returns an unusable buffer, is a local bug: the
connection is broken (both ends see :class:`~aiodist.errors.ConnectionLost`)
and the error is logged."""

FrameHandler = Callable[["Frame"], None]
"""Called with each complete frame, synchronously, in order (see :meth:`Connection.set_frame_handler`)."""

ConnectionHandler = Callable[["Connection"], Awaitable[None]]


class Frame:
    """One message: a header dict and an optional payload.

    ``payload`` is ``None`` when the frame carried no payload bytes; otherwise a
    byte-format memoryview (the caller's own buffer when a
    :data:`PayloadSink` supplied one).
    """

    __slots__ = ("header", "payload")

    def __init__(self, header: Header, payload: memoryview | None = None) -> None:
        self.header = header
        self.payload = payload

    def __repr__(self) -> str:
        size = "no payload" if self.payload is None else f"{self.payload.nbytes} bytes"
        return f"Frame({self.header!r}, {size})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return self.header == other.header and self.payload == other.payload

    __hash__ = None  # type: ignore[assignment]  # (a header is a dict)


class Connection(abc.ABC):
    """A bidirectional, ordered, framed connection.

    Sending: ``send`` may be called from several tasks at once; frames never
    interleave and leave in the order of the calls. A payload is ``None`` or
    any C-contiguous object exporting the buffer protocol (bytes, bytearray,
    memoryview, numpy array).

    Receiving: either with :meth:`recv` (one reader task at a time) or with a
    frame handler (:meth:`set_frame_handler`). A payload lands in the buffer a
    :data:`PayloadSink` names, or in memory of the connection's own.

    Closing: :meth:`close` is orderly (frames already queued still leave,
    then end-of-stream), :meth:`abort` is a reset (queued frames are
    dropped). After either, this side's ``send``/``recv``/``drained`` raise
    :class:`~aiodist.errors.ConnectionClosedLocally`, and the connection drops
    its receive buffers at once (it keeps no reference cycle alive).
    """

    __slots__ = ()  # (implementations may be slotted)

    @property
    @abc.abstractmethod
    def peer(self) -> str:
        """A printable name of the other end (``"127.0.0.1:5000"``, ``"sim:rank3"``)."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once closed or aborted by either side, or broken."""

    def release_senders(self) -> None:
        """The sends waiting for the peer to take their frames return now (the frames still go, from copies
        where they were the callers' memory): the peer was declared failed, but the connection is kept (to
        tell it so). Nothing to do where sends do not wait for the peer."""
        return None

    def redirect_payload(self, header: Header) -> None:
        """The frame ``header`` (the object the payload sink was given) is arriving into a buffer the sink
        named, whose owner no longer wants it: what arrived is copied into memory of the connection's own, and
        the rest lands there; the sink's buffer is not written again, and the frame's payload is that memory.

        Nothing happens when that frame is not arriving into a sink's buffer (complete already, or in the
        connection's own memory), or when payloads arrive whole (the simulator's).
        """
        return None

    @property
    def progress(self) -> int | None:
        """A count that grows whenever anything arrives from the peer, part of a frame included.

        ``None``: not counted (frames arrive whole). The failure detector reads
        it: a large frame whose bytes keep coming is a sign of life; one whose
        bytes stopped coming is not, whatever length its header announced.
        """
        return None

    # -- sending -----------------------------------------------------------

    @abc.abstractmethod
    async def send(self, header: Header, payload: Any = None) -> None:
        """Queue one frame and wait until the caller may reuse ``payload`` (flow control).

        The payload is not copied where that can be avoided, so the caller
        must not modify it until ``send`` returns. Raises
        :class:`~aiodist.errors.ConnectionClosedError` (nothing was queued).

        Cancellation: the frame was either queued whole (it will be sent and
        the connection no longer refers to ``payload``) or not at all.
        """

    def try_send(self, header: Header, payload: Any = None) -> bool:
        """Send one frame at once if that needs no waiting (True); else send nothing (False).

        No coroutine and no copy of the caller's obligations: a frame taken
        here is sent as :meth:`send` would send it, and ``payload`` may be
        reused as soon as this returns. False (nothing sent) also on a closed
        connection: the caller then uses :meth:`send`, which raises. The
        default takes nothing; implementations take what they can.
        """
        return False

    @abc.abstractmethod
    def send_nowait(self, header: Header, payload: Any = None) -> bool:
        """Queue one frame without waiting; False: the buffer is full, ``await drained()`` before more.

        The frame is queued either way (in order with every other send). A
        True result means ``payload`` may be reused now; after False it may
        still be read until :meth:`drained` (or a later ``send``) returns. A
        frame may be batched with the others sent in the same loop iteration,
        never held longer. Raises :class:`~aiodist.errors.ConnectionClosedError`
        on a closed connection (nothing queued).
        """

    @abc.abstractmethod
    async def drained(self) -> None:
        """Wait until every frame queued so far has been handed to the network.

        Then every payload passed to :meth:`send_nowait` may be reused. Raises
        :class:`~aiodist.errors.ConnectionClosedError` if the connection
        closed or broke. Cancellation leaves the queued frames queued.
        """

    # -- receiving -----------------------------------------------------------

    @abc.abstractmethod
    async def recv(self) -> Frame:
        """Wait for the next frame.

        Frames that arrived before the peer closed are returned first; then
        :class:`~aiodist.errors.ConnectionLost`. After this side's ``close()``
        or ``abort()``: :class:`~aiodist.errors.ConnectionClosedLocally`.
        While a frame handler is installed, frames go to it: ``recv`` only
        reports the end of the connection. Cancellation leaves the connection
        intact; no frame is lost.
        """

    @abc.abstractmethod
    def set_frame_handler(self, handler: FrameHandler | None) -> None:
        """Deliver frames by calling ``handler(frame)`` as they complete, instead of through :meth:`recv`.

        No task wake-up and no future per frame. Frames already queued for
        ``recv`` are handed over first, in order. A handler that steps aside
        (``set_frame_handler(None)``, even from inside the handler) gets no
        more frames, not even the rest of a batch that arrived together:
        those go to ``recv``, in order. A handler that raises is a local bug:
        the error is logged and the connection is broken (both ends see
        :class:`~aiodist.errors.ConnectionLost`).
        """

    @abc.abstractmethod
    def set_payload_sink(self, sink: PayloadSink | None) -> None:
        """Install (or remove) the :data:`PayloadSink` asked where each incoming payload goes."""

    @abc.abstractmethod
    def set_max_frame_size(self, n: int) -> None:
        """Limit frames whose header has not been read yet to ``n`` bytes (header + payload).

        A protocol keeps frames to a few KiB before a connection has
        authenticated and raises the limit after, before it tells the peer
        that it may send more. A frame over the limit is the peer's fault:
        the connection breaks with :class:`~aiodist.errors.ConnectionLost`
        before anything is allocated for it.
        """

    # -- closing -------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Close in order: frames already queued are still delivered, then end-of-stream.

        Returns at once (see :meth:`wait_closed`). Unread received frames are
        dropped. Idempotent.
        """

    @abc.abstractmethod
    def abort(self) -> None:
        """Reset now: queued frames are dropped and the peer sees ConnectionLost. Idempotent."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Wait until the connection is fully closed (after close/abort, or once the peer ended it).

        Cancellation only stops the wait.
        """

    async def aclose(self) -> None:
        """:meth:`close`, then :meth:`wait_closed`."""
        self.close()
        await self.wait_closed()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Listener(abc.ABC):
    """Accepts connections and runs ``handler(conn)`` as a task for each.

    The listener owns those tasks: :meth:`close` stops accepting, closes every
    accepted connection and cancels the handler tasks; :meth:`wait_closed`
    awaits them. A handler's return closes its connection; a handler that
    raises (other than a ConnectionClosedError) is logged and its connection
    closed; the listener keeps serving.
    """

    @property
    @abc.abstractmethod
    def address(self) -> Address:
        """The address peers should connect to (real port, never 0)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop accepting, close every accepted connection, cancel the handler tasks. Idempotent."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Wait until every handler task has ended."""

    async def aclose(self) -> None:
        """:meth:`close`, then :meth:`wait_closed`."""
        self.close()
        await self.wait_closed()

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def wait_ended(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Wait until every one of ``tasks`` has ended, however it ended (each one reports its own errors).

    What a listener's :meth:`Listener.wait_closed` does with the tasks it
    owns (handler tasks, connections being set up) once :meth:`Listener.close`
    cancelled them. Cancelling this wait cancels the tasks too.
    """
    pending = list(tasks)
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


class Network(abc.ABC):
    """Factory of connections and listeners for one host."""

    __slots__ = ()  # (implementations may be slotted)

    @abc.abstractmethod
    async def connect(
        self,
        address: Address,
        *,
        timeout: float | None = None,
        max_frame_size: int | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> Connection:
        """Open a connection to ``address``.

        Raises :class:`~aiodist.errors.ConnectionLost` (refused, unreachable,
        unknown host, or the TLS handshake failed) or ``TimeoutError``.
        ``max_frame_size``: the initial :meth:`Connection.set_max_frame_size`
        (None: the default, 1 GiB of payload). ``ssl``: a client-side context:
        the connection runs over TLS, the server checked as the context says.
        (The simulator's links run inside one process: it accepts ``ssl`` and
        has nothing to encrypt.) Cancellation (or the timeout) leaves nothing
        behind.
        """

    @abc.abstractmethod
    async def listen(
        self,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int | None = None,
        handshake_timeout: float | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> Listener:
        """Listen on ``address`` (port 0: pick a free port) and run ``handler`` for each connection.

        ``max_frame_size``: the initial limit of every accepted connection.
        ``handshake_timeout``: a peer that sends nothing valid within it is
        dropped. ``ssl``: a server-side context: every connection runs over
        TLS (a peer without it gets nowhere). Raises
        :class:`~aiodist.errors.ConnectionLost` if the address cannot be bound.
        """

    @abc.abstractmethod
    async def default_host(self) -> str:
        """The host name/IP under which peers can reach listeners of this network.

        May look a name up (with the loop's resolver: it never blocks the loop).
        """
