"""The network seam: what the runtime needs from a network, and nothing more.

Two implementations exist: :mod:`aiodist.net.tcp` (asyncio TCP, the real one)
and ``sim.network`` (simulated links on a virtual clock). The runtime only ever
talks to :func:`aiodist.net.current_network`, never to a concrete class, so the
simulator runs the production code unchanged.

A :class:`Connection` carries *frames*: a msgpack-able ``dict`` header plus an
optional raw byte payload. Frames are delivered whole and in order (TCP-like:
no silent loss on a live connection). Failures show up as
:class:`~aiodist.errors.ConnectionLost` (the peer or the network broke it) or
:class:`~aiodist.errors.ConnectionClosedLocally` (this side closed it).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Address = tuple[str, int]
"""A (host, port) pair. Port 0 in :meth:`Network.listen` means "pick one"."""

Header = dict[str, Any]

PayloadSink = Callable[[Header, int], "memoryview | None"]
"""Called with (header, payload_nbytes) when a frame's header has arrived and
before its payload is read. Return a writable, C-contiguous, byte-format
``memoryview`` of exactly ``payload_nbytes`` bytes to receive the payload
straight into it (zero copy), or ``None`` to let the connection allocate.
It runs synchronously inside the connection's receive path: it must be quick
and must not raise (an exception closes the connection)."""

ConnectionHandler = Callable[["Connection"], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Frame:
    """One message: a header dict and an optional payload.

    ``payload`` is ``None`` when the frame carried no payload bytes; otherwise a
    byte-format memoryview (the caller's own buffer when a
    :data:`PayloadSink` supplied one).
    """

    header: Header
    payload: memoryview | None = None


class Connection(abc.ABC):
    """A bidirectional, ordered, framed connection.

    ``send`` may be called from several tasks at once: frames never interleave.
    ``recv`` is meant for one reader task at a time.

    Optional fast paths, found with ``getattr`` (callers fall back to
    ``send``/``recv`` when an implementation lacks them):

    * ``set_frame_handler(cb)``: complete frames are handed to ``cb(frame)``
      synchronously instead of through ``recv`` (queued ones first, in order);
      ``recv`` then only reports the end of the connection. A handler that
      steps aside (``set_frame_handler(None)``) gets no more frames, not even
      the rest of a batch that arrived together: those go to ``recv``, in order.
    * ``send_nowait(header, payload) -> bool``: queue a frame without waiting;
      ``False`` means the buffer is full and the caller should wait
      (``await drained()``) before sending more. A frame may be batched with
      the others sent in the same loop iteration, never held longer.
    * ``try_send(header, payload) -> bool``: send a frame at once if that
      needs no waiting (``True``); otherwise send nothing and return ``False``
      (the caller then uses ``send``). No coroutine per frame on the common path.
    * ``resume_payload(target)``: the payload sink may answer
      :data:`aiodist.wire.DEFER` ("no buffer yet"); reading from the
      connection pauses until ``resume_payload`` names the destination.
    """

    @property
    @abc.abstractmethod
    def peer(self) -> str:
        """A printable name of the other end (``"127.0.0.1:5000"``, ``"sim:rank3"``)."""

    @abc.abstractmethod
    async def send(self, header: Header, payload: Any = None) -> None:
        """Queue one frame and wait until the transport can take more (flow control).

        ``payload`` is ``None`` or any C-contiguous object exporting the buffer
        protocol (bytes, bytearray, memoryview, numpy array); it is *not*
        copied on the TCP path, so the caller must not modify it until ``send``
        returns. Raises :class:`~aiodist.errors.ConnectionClosedError`.
        Cancellation: the frame was either fully queued or not at all.
        """

    @abc.abstractmethod
    async def recv(self) -> Frame:
        """Wait for the next frame.

        Raises :class:`~aiodist.errors.ConnectionLost` when the peer closed or
        the stream broke (including protocol errors from the peer), and
        :class:`~aiodist.errors.ConnectionClosedLocally` after ``close()``.
        Cancellation leaves the connection intact; no frame is lost.
        """

    @abc.abstractmethod
    def set_payload_sink(self, sink: PayloadSink | None) -> None:
        """Install (or remove) the :data:`PayloadSink` used for incoming payloads."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close now. Pending and later ``send``/``recv`` raise ConnectionClosedLocally."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Wait until the underlying transport is fully closed."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once closed by either side."""

    async def aclose(self) -> None:
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
    awaits them. A handler's return closes its connection.
    """

    @property
    @abc.abstractmethod
    def address(self) -> Address:
        """The address peers should connect to (real port, never 0)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    async def wait_closed(self) -> None: ...

    async def aclose(self) -> None:
        self.close()
        await self.wait_closed()

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Network(abc.ABC):
    """Factory of connections and listeners for one host."""

    @abc.abstractmethod
    async def connect(self, address: Address, *, timeout: float | None = None) -> Connection:
        """Open a connection. Raises ConnectionLost (refused/unreachable) or TimeoutError."""

    @abc.abstractmethod
    async def listen(
        self,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int | None = None,
        handshake_timeout: float | None = None,
    ) -> Listener:
        """Listen on ``address`` (port 0: pick a free port)."""

    @abc.abstractmethod
    def default_host(self) -> str:
        """The host name/IP under which peers can reach listeners of this network."""
