"""Prefix every line of a byte stream with a rank tag (pure, incremental).

Feed it the chunks a pipe delivers; it returns the complete lines seen so far,
each with the prefix, and keeps the unfinished tail for the next chunk.
"""

from __future__ import annotations

from .conventions import rank_tag

__all__ = ["LinePrefixer", "rank_prefix"]


def rank_prefix(rank: int) -> bytes:
    """The tag for ``rank``'s lines: ``b"[rank2]: "`` (:func:`~aiodist.launch.conventions.rank_tag`)."""
    return rank_tag(rank).encode()


class LinePrefixer:
    """Turns a stream of chunks into prefixed lines.

    ``max_line`` bounds the memory a line without a newline may hold: a longer
    run of bytes is emitted as a line of its own (a newline is added), so a
    rank printing megabytes without a newline cannot exhaust the launcher.
    """

    def __init__(self, prefix: bytes, *, max_line: int = 1 << 20) -> None:
        if max_line < 1:
            raise ValueError("max_line must be >= 1")
        self._prefix = prefix
        self._max_line = max_line
        self._tail = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of the unfinished last line held back."""
        return len(self._tail)

    def feed(self, data: bytes) -> bytes:
        """Add ``data``; return the newly completed lines, prefixed."""
        if not data:
            return b""
        self._tail += data
        end = self._tail.rfind(b"\n")
        out: list[bytes] = []
        if end >= 0:
            complete = bytes(self._tail[: end + 1])
            del self._tail[: end + 1]
            for line in complete.split(b"\n")[:-1]:
                out.append(self._prefix + line + b"\n")
        while len(self._tail) >= self._max_line:
            out.append(self._prefix + bytes(self._tail[: self._max_line]) + b"\n")
            del self._tail[: self._max_line]
        return b"".join(out)

    def flush(self) -> bytes:
        """The unfinished last line, prefixed and newline-terminated (``b""`` if none)."""
        if not self._tail:
            return b""
        line = self._prefix + bytes(self._tail) + b"\n"
        self._tail.clear()
        return line
