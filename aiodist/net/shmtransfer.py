"""Payloads through the shared-memory rings: placed piece by piece on one side, copied out on the other.

:class:`RingTransfer` is the part of :class:`~aiodist.net.shm.ShmConnection`
that moves large payloads (see :mod:`aiodist.net.shm` for the protocol and
why the memory ordering holds): the sender queues frames as jobs and places
their payloads into its ring as far as the ring has room, announcing each
piece with a small frame on the socket; the receiver maps the peer's ring
when it is announced, copies each piece out into the payload's destination
and acknowledges it. This layer's own frames carry the key ``"\\x00"``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING

from ..errors import ConnectionClosedError, ProtocolError
from ..wire import payload_buffer
from .base import Frame, Header, PayloadSink
from .shmring import RingSpace, Spares
from .shmseg import Segment, SegmentRef, SharedMemoryError

if TYPE_CHECKING:
    from .shmstream import FrameStream

log = logging.getLogger("aiodist.net")

INLINE_MAX = 1 << 16
"""Payloads up to this many bytes travel inline on the socket; larger ones through the ring."""

_K = "\x00"  # the key of this layer's own frames
_HELLO, _READY, _FIRST, _MORE, _ACK = 0, 1, 2, 3, 4


class _Job:
    """A frame waiting to be sent behind a large payload that is going through the ring."""

    __slots__ = ("header", "data", "total", "started", "fut")

    def __init__(self, header: Header, data: memoryview | None, fut: asyncio.Future[None] | None) -> None:
        self.header = header
        self.data = data  # what is still to be placed (None: no payload)
        self.total = 0 if data is None else data.nbytes
        self.started = False  # its first piece was announced
        self.fut = fut


class _Incoming:
    """A payload arriving through the ring: where it goes and how much came."""

    __slots__ = ("header", "total", "target", "pos")

    def __init__(self, header: Header, total: int, target: memoryview) -> None:
        self.header = header
        self.total = total
        self.target = target  # the sink's buffer, or memory of our own
        self.pos = 0

def _usable(target: memoryview, nbytes: int) -> memoryview:
    if not isinstance(target, memoryview):
        target = memoryview(target)
    if target.nbytes != nbytes or target.readonly or not target.c_contiguous:
        raise ProtocolError(f"payload sink returned an unusable buffer for {nbytes} bytes")
    return target if target.format == "B" and target.ndim == 1 else target.cast("B")


class RingTransfer:
    """Large payloads through the rings; :class:`~aiodist.net.shm.ShmConnection` holds the state named here."""

    _stream: FrameStream
    _peer: str
    _peer_pid: int
    _max_frame_size: int
    _closing: bool
    _sink: PayloadSink | None
    _jobs: collections.deque[_Job]
    _out: Segment | None
    _space: RingSpace | None
    _inline: bool
    _in: Segment | None
    _incoming: _Incoming | None
    _spares: Spares

    if TYPE_CHECKING:
        def _deliver(self, frame: Frame) -> None: ...
        def _set_exc(self, exc: ConnectionClosedError) -> None: ...
        def _wake_drainers(self) -> None: ...
        def _unmap(self) -> None: ...

    def redirect_payload(self, header: Header) -> None:
        """(Connection.redirect_payload) The rest of a payload arriving into the sink's buffer goes to our memory."""
        inc = self._incoming
        if inc is None or inc.header is not header:
            return
        own = payload_buffer(inc.total)
        own[: inc.pos] = inc.target[: inc.pos]
        inc.target = own

    def _withdraw(self, job: _Job) -> None:
        """The sender of ``job`` was cancelled: drop the frame if nothing of it left, else keep a copy of the rest."""
        job.fut = None
        if job not in self._jobs:
            return
        if not job.started:
            self._jobs.remove(job)
            job.data = None
            self._wake_drainers()
        elif job.data is not None:
            job.data = memoryview(bytes(job.data))

    def _pump(self) -> None:
        """Send queued frames in order, placing large payloads into the ring as far as it has room."""
        jobs, stream = self._jobs, self._stream
        try:
            while jobs:
                job = jobs[0]
                data = job.data
                if data is None or data.nbytes <= INLINE_MAX and not job.started or self._inline:
                    stream.send_nowait(job.header, data)
                else:
                    space, ring = self._space, self._out
                    if space is None:
                        return  # until the peer says whether it mapped our ring
                    assert ring is not None and ring.view is not None
                    while data.nbytes:
                        offset, n = space.place(data.nbytes)
                        if n == 0:
                            return  # the ring is full: the next acknowledgement goes on
                        ring.view[offset : offset + n] = data[:n]
                        if job.started:
                            stream.send_nowait({_K: _MORE, "o": offset, "l": n})
                        else:
                            job.started = True
                            stream.send_nowait({_K: _FIRST, "h": job.header, "n": job.total, "o": offset, "l": n})
                        data = job.data = data[n:]
                jobs.popleft()
                job.data = None
                if job.fut is not None and not job.fut.done():
                    job.fut.set_result(None)
        except ConnectionClosedError as e:
            self._set_exc(e)
            return
        except TypeError as e:  # an unserializable header: that frame is dropped, its sender told
            job = jobs.popleft()
            if job.fut is not None and not job.fut.done():
                job.fut.set_exception(e)
            self._pump()
            return
        self._wake_drainers()
        if self._closing:
            self._stream.close()
            self._unmap()

    def _hello(self, h: Header) -> None:
        raw = h["ring"]
        ok = False
        if raw is not None and self._in is None:
            ref = SegmentRef.unpack(raw)
            if ref.pid != self._peer_pid:
                raise ProtocolError(f"the peer (pid {self._peer_pid}) announced a ring of process {ref.pid}")
            try:
                self._in = Segment.attach(ref)
                ok = True
            except SharedMemoryError as e:
                log.info("cannot map the ring of %s (its payloads stay inline): %s", self._peer, e)
        self._stream.send_nowait({_K: _READY, "ok": ok})

    def _piece(self, h: Header, first: bool) -> None:
        ring = self._in
        if ring is None or ring.view is None:
            raise ProtocolError("a payload piece, but no ring was mapped")
        offset, n = h["o"], h["l"]
        if type(offset) is not int or type(n) is not int or n <= 0 or offset < 0 or offset + n > ring.ref.size:
            raise ProtocolError(f"a piece of {n!r} bytes at {offset!r} does not fit a ring of {ring.ref.size}")
        inc = self._incoming
        if first:
            if inc is not None:
                raise ProtocolError("a payload began in the middle of another")
            header, total = h["h"], h["n"]
            if type(header) is not dict or type(total) is not int or total <= INLINE_MAX:
                raise ProtocolError(f"a malformed payload announcement {h!r}")
            if total > self._max_frame_size:
                raise ProtocolError(f"a payload of {total} bytes exceeds the limit of {self._max_frame_size} bytes")
            target = self._sink(header, total, 0) if self._sink is not None else None
            # Nobody waits for it yet: memory of our own, reused (see Spares). Only the pages the
            # pieces fill become resident: memory grows with the bytes that arrive, not with the claim.
            target = self._spares.lend(total) if target is None else _usable(target, total)
            inc = self._incoming = _Incoming(header, total, target)
        elif inc is None:
            raise ProtocolError("a payload piece without its beginning")
        if inc.pos + n > inc.total:
            raise ProtocolError(f"pieces of {inc.pos + n} bytes for a payload of {inc.total}")
        inc.target[inc.pos : inc.pos + n] = ring.view[offset : offset + n]
        inc.pos += n
        if not self._stream.closed:  # (after the end the peer needs no acknowledgement)
            self._stream.send_nowait({_K: _ACK, "l": n})
        if inc.pos == inc.total:
            self._incoming = None
            self._deliver(Frame(inc.header, inc.target))

