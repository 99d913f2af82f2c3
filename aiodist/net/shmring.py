"""The bookkeeping of one direction of a shared-memory ring: where the next piece goes (pure, no I/O).

The sender copies a payload into the ring piece by piece and announces each
piece (offset, length) in a frame on the connection's socket; the receiver
copies the piece out and acknowledges its length. Pieces never wrap around
the end of the ring, and acknowledgements come back in the order the pieces
were announced (the receiver reads them in stream order), so the pieces in
flight are one contiguous stretch of the ring, oldest first.

When nothing is in flight the next piece goes to the start of the ring
again: traffic that leaves the ring empty between messages (a request and
its reply, a collective's exchange) keeps using the same pages, already
mapped and in cache, instead of touching the whole ring page by page.
"""

from __future__ import annotations

import collections

__all__ = ["RingSpace"]


class RingSpace:
    """The sender's view of a ring of ``size`` bytes; pieces of at most ``piece_max`` bytes."""

    __slots__ = ("size", "piece_max", "_pieces", "_head", "in_flight")

    def __init__(self, size: int, piece_max: int) -> None:
        if size <= 0 or not 0 < piece_max <= size:
            raise ValueError(f"bad ring geometry: size {size}, pieces of {piece_max}")
        self.size = size
        self.piece_max = piece_max
        self._pieces: collections.deque[tuple[int, int]] = collections.deque()  # (offset, length), oldest first
        self._head = 0  # where the stretch in flight ends (the next piece goes here, or at 0)
        self.in_flight = 0

    def __repr__(self) -> str:
        return f"<RingSpace {self.in_flight}/{self.size} in flight>"

    @property
    def free(self) -> int:
        return self.size - self.in_flight

    def place(self, want: int) -> tuple[int, int]:
        """Reserve the next piece for up to ``want`` bytes: (offset, length); length 0 when there is no room."""
        if not self._pieces:
            offset, room = 0, self.size
        else:
            tail = self._pieces[0][0]
            if self._head > tail:  # in flight: [tail, head); free: [head, size), then [0, tail)
                offset, room = self._head, self.size - self._head
                if room == 0:
                    offset, room = 0, tail
            else:  # wrapped: in flight [tail, size) and [0, head); free: [head, tail)
                offset, room = self._head, tail - self._head
        length = min(want, self.piece_max, room)
        if length <= 0:
            return offset, 0
        self._pieces.append((offset, length))
        self._head = offset + length
        self.in_flight += length
        return offset, length

    def release(self, length: int) -> None:
        """The receiver acknowledged the oldest piece (of ``length`` bytes). ValueError if that is not it."""
        if not self._pieces or self._pieces[0][1] != length:
            oldest = self._pieces[0][1] if self._pieces else None
            raise ValueError(f"acknowledgement of {length} bytes, but the oldest piece in flight is {oldest}")
        self._pieces.popleft()
        self.in_flight -= length
