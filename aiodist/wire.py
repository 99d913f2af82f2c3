"""The wire codec: bytes in, frames out. No I/O, no clock (h11-style).

A connection starts with an 8-byte preamble from each side::

    b"AIOD" | u16 version | u16 flags (0)

followed by frames::

    u32 header_len | u64 payload_len | header (msgpack map) | payload (raw bytes)

all little-endian. The header is small and self-describing; the payload is
the raw bytes of an array (or any buffer) and is never copied into msgpack.

:class:`FrameDecoder` mirrors :class:`asyncio.BufferedProtocol`: the transport
asks it where to write (:meth:`FrameDecoder.get_buffer`) and tells it how many
bytes arrived (:meth:`FrameDecoder.buffer_updated`). While a large payload is
arriving, ``get_buffer`` hands out the payload's final destination (possibly a
caller-supplied buffer from a :data:`~aiodist.net.base.PayloadSink`), so the
bytes are written once, by the kernel, where they belong.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

import msgpack

from .errors import FrameTooLargeError, ProtocolError

MAGIC = b"AIOD"
VERSION = 1
PREAMBLE = MAGIC + struct.pack("<HH", VERSION, 0)
PREAMBLE_SIZE = len(PREAMBLE)

_PREFIX = struct.Struct("<IQ")
PREFIX_SIZE = _PREFIX.size

DEFAULT_MAX_FRAME_SIZE = (1 << 30) + (1 << 20)
"""Default bound on header + payload of one frame (1 GiB of payload plus a header)."""

DEFAULT_MAX_HEADER_SIZE = 1 << 20

_STAGING_SIZE = 1 << 16

DEFER: Any = type("Defer", (), {"__repr__": lambda self: "DEFER", "__slots__": ()})()
"""A sink may return this: "no buffer yet". The decoder then stops at the
payload (see :meth:`FrameDecoder.awaiting_target`) until
:meth:`FrameDecoder.provide_target` names its destination; the connection
should stop reading meanwhile, so the payload later lands in place."""

Sink = Callable[[dict[str, Any], int], Any]


def as_byte_view(payload: Any) -> memoryview:
    """A flat, byte-format view of ``payload`` without copying.

    Raises ValueError for a non-contiguous buffer (it would be sent wrongly).
    """
    mv = payload if isinstance(payload, memoryview) else memoryview(payload)
    if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous:
        return mv
    if not mv.c_contiguous:
        raise ValueError("payload must be a C-contiguous buffer; make a contiguous copy first")
    if mv.nbytes == 0:
        return memoryview(b"")
    return mv.cast("B") if mv.ndim <= 1 else mv.cast("B", (mv.nbytes,))


_packer = msgpack.Packer(use_bin_type=True)  # reused: packb builds a Packer per call
_pack = _packer.pack


def encode_header(header: dict[str, Any]) -> bytes:
    try:
        return _pack(header)
    except (TypeError, ValueError, OverflowError) as e:
        _packer.reset()  # drop whatever a failed pack left in its buffer
        raise TypeError(f"frame header is not serializable: {e}") from None


def encode_frame(header: dict[str, Any], payload: Any = None) -> tuple[bytes, memoryview | None]:
    """Encode one frame as (prefix + header bytes, payload view or None).

    The payload is not copied: write both parts, in order, to the transport.
    """
    h = encode_header(header)
    if payload is None:
        return _PREFIX.pack(len(h), 0) + h, None
    mv = as_byte_view(payload)
    return _PREFIX.pack(len(h), mv.nbytes) + h, (mv if mv.nbytes else None)


class _State(enum.Enum):
    PREAMBLE = "preamble"
    PREFIX = "prefix"
    HEADER = "header"
    PAYLOAD = "payload"
    DEFERRED = "deferred"  # a payload whose destination the sink has not named yet
    BROKEN = "broken"


class FrameDecoder:
    """Incremental frame decoder.

    Feed it with :meth:`feed` (any chunking) or with the
    :meth:`get_buffer`/:meth:`buffer_updated` pair. Complete frames come out
    as ``(header, payload)`` tuples, ``payload`` being ``None`` or a memoryview.
    Any violation raises :class:`ProtocolError` and leaves the decoder broken:
    the connection must be closed. Sizes are checked before anything is
    allocated for them.
    """

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_header_size: int = DEFAULT_MAX_HEADER_SIZE,
        expect_preamble: bool = True,
        sink: Sink | None = None,
    ) -> None:
        self.max_frame_size = max_frame_size
        self.max_header_size = min(max_header_size, max_frame_size)
        self.sink = sink
        self._state = _State.PREAMBLE if expect_preamble else _State.PREFIX
        self._buf = bytearray(_STAGING_SIZE)
        self._view = memoryview(self._buf)
        self._start = 0  # first unconsumed staged byte
        self._end = 0  # end of staged bytes
        self._hlen = 0
        self._plen = 0
        self._header: dict[str, Any] = {}
        self._target: memoryview | None = None
        self._pos = 0

    def __repr__(self) -> str:
        return f"<FrameDecoder state={self._state.value} staged={self._end - self._start}>"

    @property
    def awaiting_target(self) -> bool:
        """True while a payload waits for :meth:`provide_target` (its sink returned :data:`DEFER`)."""
        return self._state is _State.DEFERRED

    def provide_target(self, target: memoryview | None) -> list[tuple[dict[str, Any], memoryview | None]]:
        """Give the deferred payload its destination (``None``: a new buffer); return the frames completed.

        Bytes received meanwhile were staged and are copied there; decoding
        then goes on with whatever is staged behind the payload.
        """
        if self._state is not _State.DEFERRED:
            raise RuntimeError("no payload is waiting for a destination")
        frames: list[tuple[dict[str, Any], memoryview | None]] = []
        self._begin_payload(target, frames)
        if self._state is _State.PREFIX:
            self._parse(frames)
        return frames

    @property
    def handshake_done(self) -> bool:
        """True once the peer's preamble was received and accepted."""
        return self._state not in (_State.PREAMBLE, _State.BROKEN)

    # -- BufferedProtocol-style interface ---------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes should be written."""
        if self._state is _State.PAYLOAD:
            assert self._target is not None
            return self._target[self._pos :]
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            # Move the unconsumed tail to the front to make room.
            n = self._end - self._start
            self._buf[:n] = self._buf[self._start : self._end]
            self._start, self._end = 0, n
        if self._end == len(self._buf):  # a header larger than the staging area
            self._grow(len(self._buf) * 2)
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> list[tuple[dict[str, Any], memoryview | None]]:
        """Account for ``nbytes`` written into the last :meth:`get_buffer`; return complete frames."""
        frames: list[tuple[dict[str, Any], memoryview | None]] = []
        if self._state is _State.PAYLOAD:
            self._pos += nbytes
            if self._pos == self._plen:
                self._finish_payload(frames)
            return frames
        self._end += nbytes
        self._parse(frames)
        return frames

    def feed(self, data: Any) -> list[tuple[dict[str, Any], memoryview | None]]:
        """Decode a chunk of bytes of any size; return the frames it completed."""
        src = as_byte_view(data)
        frames: list[tuple[dict[str, Any], memoryview | None]] = []
        off = 0
        while off < len(src):
            buf = self.get_buffer(len(src) - off)
            n = min(len(buf), len(src) - off)
            buf[:n] = src[off : off + n]
            off += n
            frames.extend(self.buffer_updated(n))
        return frames

    # -- internals ----------------------------------------------------------

    def _grow(self, size: int) -> None:
        new = bytearray(size)
        n = self._end - self._start
        new[:n] = self._buf[self._start : self._end]
        self._view.release()
        self._buf, self._view = new, memoryview(new)
        self._start, self._end = 0, n

    def _fail(self, exc: ProtocolError) -> ProtocolError:
        self._state = _State.BROKEN
        return exc

    def _parse(self, frames: list[tuple[dict[str, Any], memoryview | None]]) -> None:
        while True:
            avail = self._end - self._start
            state = self._state
            if state is _State.PREFIX:
                if avail < PREFIX_SIZE:
                    return
                self._hlen, self._plen = _PREFIX.unpack_from(self._buf, self._start)
                self._start += PREFIX_SIZE
                if self._hlen > self.max_header_size:
                    raise self._fail(FrameTooLargeError(self._hlen, self.max_header_size))
                if self._hlen + self._plen > self.max_frame_size:
                    raise self._fail(FrameTooLargeError(self._hlen + self._plen, self.max_frame_size))
                if self._hlen == 0:
                    raise self._fail(ProtocolError("frame without a header"))
                self._state = _State.HEADER
                if self._hlen > len(self._buf):
                    self._grow(self._hlen)
            elif state is _State.HEADER:
                if avail < self._hlen:
                    return
                raw = self._view[self._start : self._start + self._hlen]
                self._start += self._hlen
                try:
                    header = msgpack.unpackb(raw, raw=False)
                except Exception as e:  # msgpack raises several unrelated types
                    raise self._fail(ProtocolError(f"undecodable frame header: {e}")) from None
                finally:
                    raw.release()
                if not isinstance(header, dict):
                    raise self._fail(ProtocolError(f"frame header is a {type(header).__name__}, not a map"))
                if self._plen == 0:
                    frames.append((header, None))
                    self._state = _State.PREFIX
                    continue
                self._header = header
                self._start_payload(frames)
                if self._state is not _State.PREFIX:  # waiting for the rest (written in place) or for a target
                    return
            elif state is _State.DEFERRED:
                return
            elif state is _State.PREAMBLE:
                if avail < PREAMBLE_SIZE:
                    return
                got = bytes(self._buf[self._start : self._start + PREAMBLE_SIZE])
                self._start += PREAMBLE_SIZE
                if got[:4] != MAGIC:
                    raise self._fail(ProtocolError(f"not an aiodist peer (preamble {got!r})"))
                (version,) = struct.unpack_from("<H", got, 4)
                if version != VERSION:
                    raise self._fail(ProtocolError(f"peer speaks protocol version {version}, this side {VERSION}"))
                self._state = _State.PREFIX
            else:  # BROKEN
                raise ProtocolError("decoder already failed; close the connection")

    def _start_payload(self, frames: list[tuple[dict[str, Any], memoryview | None]]) -> None:
        target = self.sink(self._header, self._plen) if self.sink is not None else None
        if target is DEFER:
            self._state = _State.DEFERRED
            return
        self._begin_payload(target, frames)

    def _begin_payload(self, target: memoryview | None, frames: list[tuple[dict[str, Any], memoryview | None]]) -> None:
        plen = self._plen
        if target is None:
            target = memoryview(bytearray(plen))
        elif target.nbytes != plen or target.readonly or not target.c_contiguous:
            raise self._fail(ProtocolError(f"payload sink returned an unusable buffer for {plen} bytes"))
        elif target.format != "B" or target.ndim != 1:
            target = target.cast("B")
        self._target = target
        staged = min(self._end - self._start, plen)
        if staged:
            target[:staged] = self._view[self._start : self._start + staged]
            self._start += staged
        self._pos = staged
        if staged == plen:
            self._finish_payload(frames)
        else:
            self._state = _State.PAYLOAD

    def _finish_payload(self, frames: list[tuple[dict[str, Any], memoryview | None]]) -> None:
        frames.append((self._header, self._target))
        self._header = {}
        self._target = None
        self._pos = 0
        self._state = _State.PREFIX
