"""What the virtual ranks print and log during a ``python -m sim run``: per-rank prefixes and folded log records.

:class:`RankPrefixedOutput` prefixes every line a rank prints with
``[rankR]: `` (as ``aiodist run`` does); :class:`RankLogCollector` keeps
aiodist's log records of a run, each with its rank and virtual time, and
prints them folded (records that differ only in numbers share one line).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import Iterator
from typing import Any, TextIO

from aiodist.context import getenv
from aiodist.launch.conventions import rank_tag

from .loop import LANE
from .result import _shape
from .result import _ranks_text as ranks_text


def _lane_tag() -> str:
    """The output prefix of the running lane: its rank's, or ``[rank?]: `` for a lane without one (the store host)."""
    rank = getenv("RANK")
    return rank_tag(int(rank)) if rank and rank.isdecimal() else "[rank?]: "


class RankPrefixedOutput(io.TextIOBase):
    """Prefixes every line a virtual rank prints with ``[rankR]: `` (as ``aiodist run`` and torchrun do).

    A rank's line is written once it ends; :meth:`flush` also writes the
    unfinished ones (each ended with a newline). The stream written to is not
    this object's: :meth:`close` never closes it. Closing (explicitly, or when
    the object is finalized, possibly late: at a garbage collection or at
    interpreter teardown) writes what is still buffered and flushes the
    stream if it is still open; if it was closed first (e.g. a test's captured
    stdout), what is still buffered is dropped, silently: it has nowhere to go,
    and a finalizer has no one to tell.
    """

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._partial: dict[str, str] = {}  # line prefix -> the unfinished line after it
        self._closing = False

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if self.closed:
            raise ValueError("write to a closed RankPrefixedOutput")
        if LANE.get() < 0:  # the simulator itself
            return self._out.write(s)
        tag = _lane_tag()
        *lines, rest = (self._partial.pop(tag, "") + s).split("\n")
        for line in lines:
            self._out.write(f"{tag}{line}\n")
        if rest:
            self._partial[tag] = rest
        return len(s)

    def flush(self) -> None:
        """Write every rank's unfinished line, then flush the stream (ValueError if it is closed, as files do)."""
        if self._closing:
            return  # (io's close() flushes once more: done already, or the stream is closed)
        for tag, rest in sorted(self._partial.items()):
            self._out.write(f"{tag}{rest}\n")
        self._partial.clear()
        self._out.flush()

    def close(self) -> None:
        """Flush if the stream is still open, else drop what is buffered; the stream itself stays open."""
        if self._closing:
            return
        try:
            if not getattr(self._out, "closed", False):
                self.flush()
        finally:
            self._closing = True
            self._partial.clear()
            super().close()


class RankLogCollector(logging.Handler):
    """Collects the records of aiodist's loggers during a run, each with its rank and virtual time.

    Without it, a crash in a big run floods stderr with one unprefixed line
    per rank (e.g. every survivor's flight-recorder summary); :meth:`report`
    prints them prefixed with ``[rank R t=...]`` and folds lines that differ
    only in numbers into one line plus the list of ranks.
    """

    MAX_SHOWN = 10

    def __init__(self) -> None:
        super().__init__()
        # (rank, virtual time, text): the text is made at once, and the record dropped: a record keeps its
        # arguments and exception, whose traceback keeps the frames' locals (e.g. every receive buffer of a
        # program that logs a handled timeout in a loop) alive until the run ends.
        self.records: list[tuple[str, float | None, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        rank = (getenv("RANK") or "?") if LANE.get() >= 0 else "sim"
        try:
            now: float | None = asyncio.get_running_loop().time()
        except RuntimeError:
            now = None
        self.records.append((rank, now, _text(record)))

    @contextlib.contextmanager
    def capture(self, name: str = "aiodist") -> Iterator[RankLogCollector]:
        logger = logging.getLogger(name)
        propagate = logger.propagate
        logger.addHandler(self)
        logger.propagate = False
        try:
            yield self
        finally:
            logger.removeHandler(self)
            logger.propagate = propagate

    def lines(self) -> list[str]:
        groups: dict[str, list[tuple[str, float | None, str]]] = {}
        for rank, now, text in self.records:
            groups.setdefault(_shape(text), []).append((rank, now, text))
        out: list[str] = []
        for members in list(groups.values())[: self.MAX_SHOWN]:
            rank, now, text = members[0]
            when = f" t={now:.6f}s" if now is not None else ""
            out.append(f"[rank {rank}{when}] {text}")
            others = [int(m[0]) for m in members[1:] if m[0].isdigit()]
            if len(members) > 1:
                who = f" from ranks {ranks_text(others)}" if others else ""
                out.append(f"    ... and {len(members) - 1} more like it{who}")
        hidden = sum(len(m) for m in list(groups.values())[self.MAX_SHOWN:])
        if hidden:
            out.append(f"    ... and {hidden} more log records of other kinds")
        return out

    def report(self, stream: Any) -> None:
        if self.records:
            stream.write("\n".join(self.lines()) + "\n")
            stream.flush()


def _text(record: logging.LogRecord) -> str:
    """``LEVEL logger: message [Exception: text]`` for one record."""
    try:
        msg = record.getMessage()
    except Exception as e:  # noqa: BLE001 - a bad format string must not hide the run's result
        msg = f"{record.msg!r} (unformattable: {e!r})"
    text = f"{record.levelname} {record.name}: {msg}"
    if record.exc_info and record.exc_info[1] is not None:
        text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
    return text
