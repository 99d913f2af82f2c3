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
bytes are written once, by the kernel, where they belong. A sink that had no
buffer for a payload is asked again after each read while the rest of it is
arriving; a buffer it names then gets the bytes received so far copied in,
and the rest is written straight into it.

Memory follows bytes: nothing is filled in from what a prefix *claims*. A
payload with no destination of its own gets uninitialised memory
(:func:`payload_buffer`), whose pages the kernel provides as the bytes are
written: address space is reserved for the claim, resident memory only for
what arrives. A header larger than the staging area grows the staging area as
its bytes arrive. Both stay within ``max_frame_size``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from .errors import FrameTooLargeError, ProtocolError

MAGIC = b"AIOD"
VERSION = 1
PREAMBLE = MAGIC + struct.pack("<HH", VERSION, 0)
PREAMBLE_SIZE = len(PREAMBLE)

_PREFIX_STRUCT = struct.Struct("<IQ")
PREFIX_SIZE = _PREFIX_STRUCT.size

DEFAULT_MAX_FRAME_SIZE = (1 << 30) + (1 << 20)
"""Default bound on header + payload of one frame (1 GiB of payload plus a header)."""

MAX_MESSAGE_BYTES = 1 << 30
"""The largest payload one message (a send, a pickled object) may have: what a frame carries besides its header.
Larger ones are refused by the sender up front (a peer would take the frame for an attack and drop the link)."""

DEFAULT_MAX_HEADER_SIZE = 1 << 20

_FIRST_ASK_STEP = 1 << 12
_ASK_STEP = 1 << 16
_ASK_STEPS = 8
"""A payload the sink had no buffer for is read in chunks, the sink asked again after each: first
_FIRST_ASK_STEP bytes (a receive posted in the loop turn right after the header came then takes all
but those and the bytes staged with the header), then _ASK_STEPS chunks of _ASK_STEP bytes (it may
be posted a few loop turns later), then each as large as what arrived before it (a handful of asks
in all, however large the payload)."""

_STAGING_SIZE = 1 << 16
_STAGING_MAX = (1 << 17) + (1 << 12)
"""The staging area grows (once) to this size for a frame that does not fit: up to 128 KiB of
payload then arrives in one read and is decoded in one pass (two reads and two decoder passes
cost more than copying it out of the staging area). Connections of small frames never grow."""


def _staging_size(max_frame_size: int) -> int:
    """The staging area for frames of at most ``max_frame_size`` bytes: small while frames are limited
    (a connection that has not authenticated costs a few KiB, not 64), else :data:`_STAGING_SIZE`."""
    return min(_STAGING_SIZE, max_frame_size + PREFIX_SIZE + PREAMBLE_SIZE)


def payload_buffer(nbytes: int) -> memoryview:
    """A writable buffer of ``nbytes`` for a payload with no destination of its own.

    Uninitialised (``numpy.empty``): nothing writes the claimed size up front,
    so the pages of a large buffer (a fresh mapping) become resident only as
    the received bytes are written into them, and a small one reuses freed
    memory without clearing it first. The frame is delivered only once every
    byte was written, so nothing stale is ever seen.
    """
    return np.empty(nbytes, dtype=np.uint8).data


Sink = Callable[[dict[str, Any], int, int], Any]
"""(header, payload_nbytes, received) -> a writable buffer or None (see :data:`aiodist.net.base.PayloadSink`)."""


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
_pack: Callable[[Any], bytes] = _packer.pack  # msgpack is untyped


def encode_header(header: dict[str, Any]) -> bytes:
    try:
        return _pack(header)
    except (TypeError, ValueError, OverflowError) as e:
        raise _unserializable(e) from None


def _unserializable(e: Exception) -> TypeError:
    _packer.reset()  # drop whatever a failed pack left in its buffer
    return TypeError(f"frame header is not serializable: {e}")


def encode_frame(header: dict[str, Any], payload: Any = None) -> tuple[bytes, memoryview | None]:
    """Encode one frame as (prefix + header bytes, payload view or None).

    The payload is not copied: write both parts, in order, to the transport.
    """
    try:
        h = _pack(header)  # encode_header, inlined: this runs for every frame sent
    except (TypeError, ValueError, OverflowError) as e:
        raise _unserializable(e) from None
    if payload is None:
        return _PREFIX_STRUCT.pack(len(h), 0) + h, None
    mv = as_byte_view(payload)
    return _PREFIX_STRUCT.pack(len(h), mv.nbytes) + h, (mv if mv.nbytes else None)


# Decoder states. Plain ints, not an Enum: the state is tested several times
# per frame and a module global is much cheaper to read than an Enum member.
_ST_PREAMBLE = 0
_ST_PREFIX = 1
_ST_HEADER = 2
_ST_PAYLOAD = 3
_ST_BROKEN = 4
_ST_DISCARD = 5  # released: whatever still arrives is dropped
_STATE_NAMES = ("preamble", "prefix", "header", "payload", "broken", "discard")
_DISCARD_SIZE = 1 << 12

_unpack_prefix = _PREFIX_STRUCT.unpack_from
_unpackb = msgpack.unpackb

Frames = list[tuple[dict[str, Any], "memoryview | None"]]


class FrameDecoder:
    """Incremental frame decoder.

    Feed it with :meth:`feed` (any chunking) or with the
    :meth:`get_buffer`/:meth:`buffer_updated` pair. Complete frames come out
    as ``(header, payload)`` tuples, ``payload`` being ``None`` or a memoryview.
    Any violation raises :class:`ProtocolError` and leaves the decoder broken:
    the connection must be closed. Sizes are checked before anything is
    allocated for them, and memory is only allocated as bytes arrive.
    """

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_header_size: int = DEFAULT_MAX_HEADER_SIZE,
        expect_preamble: bool = True,
        sink: Sink | None = None,
    ) -> None:
        self._max_header = max_header_size
        self.max_frame_size = max_frame_size
        self.max_header_size = min(max_header_size, max_frame_size)
        self.sink = sink
        self._state = _ST_PREAMBLE if expect_preamble else _ST_PREFIX
        self._buf = bytearray(_staging_size(max_frame_size))
        self._view = memoryview(self._buf)
        self._start = 0  # first unconsumed staged byte
        self._end = 0  # end of staged bytes
        self._hlen = 0
        self._plen = 0
        self._header: dict[str, Any] = {}
        self._target: memoryview | None = None  # where the payload being received goes
        self._own = False  # ... memory of our own: the sink had no buffer for it (it is asked again)
        self._ask_at = 0  # ... at this many bytes received
        self.declined = False
        """The sink was asked again and had no buffer yet: a connection may let its loop turn before reading on."""
        self._pos = 0
        self.completed: Frames = []
        """After :meth:`buffer_updated` raised: the frames it had completed before the failure."""

    def __repr__(self) -> str:
        return f"<FrameDecoder state={_STATE_NAMES[self._state]} staged={self._end - self._start}>"

    def set_max_frame_size(self, n: int) -> None:
        """Limit frames whose prefix has not been decoded yet to ``n`` bytes (header + payload)."""
        if n <= 0:
            raise ValueError(f"max_frame_size must be positive, got {n}")
        self.max_frame_size = n
        self.max_header_size = min(self._max_header, n)
        if _staging_size(n) > len(self._buf) and self._state <= _ST_PAYLOAD:  # (raised: once authenticated)
            self._grow(_staging_size(n))

    @property
    def handshake_done(self) -> bool:
        """True once the peer's preamble was received and accepted."""
        return self._state == _ST_PREFIX or self._state == _ST_HEADER or self._state == _ST_PAYLOAD

    def release(self) -> None:
        """Drop every buffer and the sink at once (the connection closed); bytes that still arrive are dropped."""
        self._state = _ST_DISCARD
        self.sink = None
        self._buf = bytearray(_DISCARD_SIZE)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._header = {}
        self._target = None
        self._own = self.declined = False

    # -- BufferedProtocol-style interface ---------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes should be written."""
        if self._state == _ST_PAYLOAD:
            assert self._target is not None
            if self._own:  # up to the next chunk boundary (where the sink is asked again)
                return self._target[self._pos : self._ask_at]
            return self._target[self._pos :]
        end = self._end
        if self._start == end:
            # Everything staged was consumed (the usual case between small
            # frames): start over at the front and hand out the whole area.
            self._start = self._end = 0
            return self._view
        if end == len(self._buf):
            # Move the unconsumed tail to the front to make room.
            n = end - self._start
            self._buf[:n] = self._buf[self._start : end]
            self._start, self._end = 0, n
            if n == len(self._buf):  # a header larger than the staging area: grow as its bytes arrive
                self._grow(n * 2)
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> Frames:
        """Account for ``nbytes`` written into the last :meth:`get_buffer`; return complete frames."""
        frames: Frames = []
        state = self._state
        try:
            if state == _ST_PAYLOAD:
                pos = self._pos = self._pos + nbytes
                if pos == self._plen:
                    self._finish_payload(frames)
                elif self._own and pos >= self._ask_at:
                    self._ask_again(pos)
                return frames
            end = self._end + nbytes
            self._end = end
            if state == _ST_PREFIX:
                self._parse_small(frames, end)
            elif self._start != end:
                self._parse(frames)
        except Exception:
            self.completed = frames  # the frames before the bad one (see ``completed``)
            raise
        return frames

    def _parse_small(self, frames: Frames, end: int) -> None:
        """Fast path: decode whole frames staged back to back, then hand over to :meth:`_parse`.

        Small messages arrive whole, one or several per read; this loop
        decodes them (header, payload sink, payload copy) without the general
        state machine. Anything else (a partial frame, a size violation) stops
        it with the decoder still at a frame boundary in state PREFIX, and
        :meth:`_parse` goes on from there (raising the errors).
        """
        start = self._start
        buf = self._buf
        view = self._view
        max_header = self.max_header_size
        max_frame = self.max_frame_size
        while end - start >= PREFIX_SIZE:
            hlen, plen = _unpack_prefix(buf, start)
            stop = start + PREFIX_SIZE + hlen
            fend = stop + plen
            if fend > end or hlen == 0 or hlen > max_header or hlen + plen > max_frame:
                if fend > len(buf) and fend - start <= _STAGING_MAX and 0 < hlen <= max_header and hlen + plen <= max_frame:
                    # Still at a frame boundary: move it to the front of an area it fits in, and wait.
                    if fend - start > len(buf):
                        self._start = start
                        self._grow(_STAGING_MAX)
                    else:
                        n = end - start
                        buf[:n] = buf[start:end]
                        self._start, self._end = 0, n
                    return
                break
            raw = view[stop - hlen : stop]
            try:
                header = _unpackb(raw)
            except Exception as e:  # msgpack raises several unrelated types
                self._start = stop
                raise self._fail(ProtocolError(f"undecodable frame header: {e}")) from None
            finally:
                raw.release()
            if type(header) is not dict:
                self._start = stop
                raise self._fail(ProtocolError(f"frame header is a {type(header).__name__}, not a map"))
            if plen:
                self._start = stop  # (where the payload begins, should the sink raise)
                target = self.sink(header, plen, 0) if self.sink is not None else None
                if target is None:
                    target = memoryview(bytearray(view[stop:fend]))
                else:
                    target = self._usable(target, plen)
                    target[:] = view[stop:fend]
                frames.append((header, target))
            else:
                frames.append((header, None))
            start = fend
        self._start = start
        if start != end:
            self._parse(frames)

    def feed(self, data: Any) -> Frames:
        """Decode a chunk of bytes of any size; return the frames it completed."""
        src = as_byte_view(data)
        frames: Frames = []
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
        # The old view is dropped, not released: the transport may still hold
        # a buffer export of it (uvloop releases the buffer from get_buffer
        # only after buffer_updated returns); it is freed with the last export.
        self._buf, self._view = new, memoryview(new)
        self._start, self._end = 0, n

    def _fail(self, exc: ProtocolError) -> ProtocolError:
        self._state = _ST_BROKEN
        return exc

    def _parse(self, frames: Frames) -> None:
        while True:
            avail = self._end - self._start
            state = self._state
            if state == _ST_PREFIX:
                if avail < PREFIX_SIZE:
                    return
                self._hlen, self._plen = _PREFIX_STRUCT.unpack_from(self._buf, self._start)
                self._start += PREFIX_SIZE
                if self._hlen > self.max_header_size:
                    raise self._fail(FrameTooLargeError(self._hlen, self.max_header_size))
                if self._hlen + self._plen > self.max_frame_size:
                    raise self._fail(FrameTooLargeError(self._hlen + self._plen, self.max_frame_size))
                if self._hlen == 0:
                    raise self._fail(ProtocolError("frame without a header"))
                self._state = _ST_HEADER
            elif state == _ST_HEADER:
                if avail < self._hlen:
                    return
                raw = self._view[self._start : self._start + self._hlen]
                self._start += self._hlen
                try:
                    header = _unpackb(raw)
                except Exception as e:  # msgpack raises several unrelated types
                    raise self._fail(ProtocolError(f"undecodable frame header: {e}")) from None
                finally:
                    raw.release()
                if not isinstance(header, dict):
                    raise self._fail(ProtocolError(f"frame header is a {type(header).__name__}, not a map"))
                if self._plen == 0:
                    frames.append((header, None))
                    self._state = _ST_PREFIX
                    continue
                self._header = header
                self._begin_payload(frames)
                if self._state != _ST_PREFIX:  # waiting for the rest (written in place)
                    return
            elif state == _ST_PREAMBLE:
                if avail < PREAMBLE_SIZE:
                    return
                got = bytes(self._buf[self._start : self._start + PREAMBLE_SIZE])
                self._start += PREAMBLE_SIZE
                if got[:4] != MAGIC:
                    raise self._fail(ProtocolError(f"not an aiodist peer (preamble {got!r})"))
                (version,) = struct.unpack_from("<H", got, 4)
                if version != VERSION:
                    raise self._fail(ProtocolError(f"peer speaks protocol version {version}, this side {VERSION}"))
                self._state = _ST_PREFIX
            elif state == _ST_DISCARD:
                self._start = self._end = 0
                return
            else:  # BROKEN
                raise ProtocolError("decoder already failed; close the connection")

    def _begin_payload(self, frames: Frames) -> None:
        """The header is decoded: ask the sink where the payload goes, take what is staged, go on."""
        plen = self._plen
        target = self.sink(self._header, plen, 0) if self.sink is not None else None
        if target is None:
            target = payload_buffer(plen)
            if self.sink is not None:  # asked again at chunk boundaries
                self._own = True
                self._ask_at = min(plen, self._end - self._start + _FIRST_ASK_STEP)
                self.declined = True  # (and before the first chunk)
        else:
            target = self._usable(target, plen)
        self._target = target
        staged = min(self._end - self._start, plen)
        if staged:
            target[:staged] = self._view[self._start : self._start + staged]
            self._start += staged
        self._pos = staged
        if staged == plen:
            self._finish_payload(frames)
        else:
            self._state = _ST_PAYLOAD

    def redirect(self, header: dict[str, Any]) -> None:
        """The payload of frame ``header``, arriving into the sink's buffer, goes on into memory of our own."""
        if self._state != _ST_PAYLOAD or self._header is not header or self._own or self._target is None:
            return
        own = payload_buffer(self._plen)
        own[: self._pos] = self._target[: self._pos]
        self._target = own

    def _ask_again(self, received: int) -> None:
        """A chunk of a payload the sink had no buffer for arrived: if it names one now, move there."""
        plen = self._plen
        if self.sink is None:  # (removed meanwhile: nobody to ask)
            self._own = False
            return
        target = self.sink(self._header, plen, received)
        if target is None:
            self._ask_at = min(plen, received + (received if received > _ASK_STEPS * _ASK_STEP else _ASK_STEP))
            self.declined = True
            return
        target = self._usable(target, plen)
        own = self._target
        assert own is not None
        target[:received] = own[:received]
        # The old buffer is dropped, not released: the transport may still hold an export of it.
        self._target = target
        self._own = False

    def _finish_payload(self, frames: Frames) -> None:
        frames.append((self._header, self._target))
        self._header = {}
        self._target = None
        self._own = self.declined = False
        self._pos = 0
        self._state = _ST_PREFIX

    def _usable(self, target: memoryview, plen: int) -> memoryview:
        """The sink's buffer for a payload of ``plen`` bytes, as a flat byte view (or the decoder fails)."""
        if target.nbytes != plen or target.readonly or not target.c_contiguous:
            raise self._fail(ProtocolError(f"payload sink returned an unusable buffer for {plen} bytes"))
        if target.format != "B" or target.ndim != 1:
            target = target.cast("B")
        return target
