"""The bookkeeping of one direction of a shared-memory ring: where the next piece goes (pure, no I/O).

The sender copies a payload into the ring piece by piece and announces each
piece (offset, length) in a frame on the connection's socket; the receiver
copies the piece out and acknowledges its length. Pieces never wrap around
the end of the ring, and acknowledgements come back in the order the pieces
were announced (the receiver reads them in stream order), so the sender only
keeps two counters: bytes placed and bytes acknowledged.
"""

from __future__ import annotations

__all__ = ["RingSpace"]


class RingSpace:
    """The sender's view of a ring of ``size`` bytes; pieces of at most ``piece_max`` bytes."""

    __slots__ = ("size", "piece_max", "placed", "acked")

    def __init__(self, size: int, piece_max: int) -> None:
        if size <= 0 or not 0 < piece_max <= size:
            raise ValueError(f"bad ring geometry: size {size}, pieces of {piece_max}")
        self.size = size
        self.piece_max = piece_max
        self.placed = 0  # bytes ever placed
        self.acked = 0  # bytes ever acknowledged

    def __repr__(self) -> str:
        return f"<RingSpace {self.in_flight}/{self.size} in flight>"

    @property
    def in_flight(self) -> int:
        return self.placed - self.acked

    @property
    def free(self) -> int:
        return self.size - (self.placed - self.acked)

    def place(self, want: int) -> tuple[int, int]:
        """Reserve the next piece for up to ``want`` bytes: (offset, length); length 0 when the ring is full."""
        offset = self.placed % self.size
        length = min(want, self.piece_max, self.size - offset, self.free)
        if length <= 0:
            return offset, 0
        self.placed += length
        return offset, length

    def release(self, length: int) -> None:
        """The receiver acknowledged ``length`` bytes (the oldest ones). ValueError if it never got them."""
        if not 0 < length <= self.in_flight:
            raise ValueError(f"acknowledgement of {length} bytes, but {self.in_flight} are in flight")
        self.acked += length
