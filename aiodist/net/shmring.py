"""The bookkeeping of one direction of a shared-memory ring (where the next piece goes), and the
receiving side's spare memory (no I/O).

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
import weakref

import numpy as np

__all__ = ["RingSpace", "Spares"]


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


class Spares:
    """Memory for payloads that nobody waits for yet (no sink buffer), reused from one to the next.

    Fresh memory of that size costs a page fault per page when written (the
    allocator hands big blocks back to the system and maps them anew): more
    than the copy itself. A buffer lent out comes back when the last view of
    the payload goes. At most ``keep`` bytes are kept; dropped at close.
    """

    __slots__ = ("_free", "_kept", "keep")

    def __init__(self, keep: int) -> None:
        self._free: dict[int, list[np.ndarray]] = {}
        self._kept = 0
        self.keep = keep

    def lend(self, nbytes: int) -> memoryview:
        """A buffer of ``nbytes``: a kept one, or new (its pages resident only once written)."""
        free = self._free.get(nbytes)
        if free:
            base = free.pop()
            self._kept -= nbytes
        else:
            base = np.empty(nbytes, np.uint8)
        view = base[:]
        weakref.finalize(view, self._back, base)
        return view.data  # (a memoryview of the array: the array lives as long as the view)

    def _back(self, base: np.ndarray) -> None:
        if self._kept + base.nbytes <= self.keep:
            self._free.setdefault(base.nbytes, []).append(base)
            self._kept += base.nbytes

    def clear(self) -> None:
        self._free.clear()
        self._kept = 0
        self.keep = 0
