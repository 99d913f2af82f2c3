"""The launcher's own stdout/stderr, written without ever blocking its event loop.

The ranks' prefixed output (and the launcher's messages) reach a
:class:`StreamWriter`: a bounded byte queue that a thread of its own writes
to the stream, in order. The event loop only appends to the queue, so a reader
that stops reading (a pager left on its first screen, a stalled pipe) cannot
stop the launcher from handling signals, watching exits or running its
timeouts.

Backpressure keeps the memory bounded: once more than ``high_water`` bytes
wait, every reader attached to the writer (the ranks' pipes for that stream)
is paused, and resumed when the queue is down to ``low_water``. A stalled
reader so makes the ranks block in ``print`` (their pipe to the launcher
fills), as it would with no launcher in between. Output accepted with
``may_drop`` (the ranks being stopped: they are never paused, so that they can
exit) is dropped instead beyond ``drop_above`` bytes waiting.

A stream whose writes fail (EPIPE: ``| head -1``) is broken: what waits and
what comes later is dropped silently, and the job runs on.

Process management, not protocol code: a thread and blocking writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from collections import deque
from typing import BinaryIO, Protocol

__all__ = ["DROP_ABOVE", "HIGH_WATER", "LOW_WATER", "Outputs", "Pausable", "StreamWriter"]

HIGH_WATER = 2 << 20
"""Bytes waiting in a writer above which the ranks' pipes for its stream are paused."""
LOW_WATER = 512 << 10
"""Bytes waiting at or below which they are read again."""
DROP_ABOVE = 8 << 20
"""Bytes waiting beyond which output written with ``may_drop`` (ranks being stopped) is dropped."""

_BATCH = 64 << 10  # bytes joined into one write
_POLL = 0.02  # how often close() looks at the writer's progress


class Pausable(Protocol):
    """What backpressure pauses: a read transport (a rank's pipe)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _fd_of(stream: BinaryIO) -> int | None:
    """The file descriptor under ``stream``, if it has one (then written with ``os.write``, after a flush)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is both the latter)
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


class StreamWriter:
    """One output stream, written in order by a thread of its own (see the module doc).

    Made in a running event loop; :meth:`write`, :meth:`attach` and
    :meth:`detach` are called in that loop's thread, :meth:`close` awaited in it.

    A stream with a file descriptor is written with ``os.write`` (its Python
    buffer flushed first): a thread left in a write that never returns then
    holds no lock that the interpreter needs at exit. Any other binary stream
    (``io.BytesIO``) gets ``write`` and ``flush``.
    """

    def __init__(self, stream: BinaryIO, *, high_water: int = HIGH_WATER, low_water: int = LOW_WATER,
                 drop_above: int = DROP_ABOVE, name: str = "output") -> None:
        if not 0 <= low_water <= high_water <= drop_above:
            raise ValueError("need 0 <= low_water <= high_water <= drop_above")
        self._loop = asyncio.get_running_loop()
        self._stream = stream
        self._fd = _fd_of(stream)
        self._high = high_water
        self._low = low_water
        self._drop_above = drop_above
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # (under the lock)
        self._chunks: deque[bytes] = deque()
        self._pending = 0
        self._written = 0
        self._dropped = 0
        self._broken = False
        self._stopping = False  # close() began: the thread ends once the queue is empty
        self._closed = False  # close() ended: everything is dropped
        self._paused = False
        self._resume_scheduled = False
        # (loop thread only)
        self._readers: dict[Pausable, None] = {}  # (a dict: pauses and resumes in attach order)
        if self._fd is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        self._thread = threading.Thread(target=self._run, name=f"aiodist-{name}-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the loop's side

    @property
    def pending(self) -> int:
        """Bytes accepted and not yet written."""
        with self._lock:
            return self._pending

    @property
    def written(self) -> int:
        """Bytes written so far (grows while the reader reads)."""
        with self._lock:
            return self._written

    @property
    def dropped(self) -> int:
        """Bytes dropped: the stream broke, ``may_drop`` output beyond ``drop_above``, or left at :meth:`close`."""
        with self._lock:
            return self._dropped

    @property
    def broken(self) -> bool:
        with self._lock:
            return self._broken

    @property
    def paused(self) -> bool:
        """Are the attached readers paused (more than ``high_water`` bytes waited, not yet down to ``low_water``)?"""
        with self._lock:
            return self._paused

    def write(self, data: bytes, *, may_drop: bool = False) -> None:
        """Queue ``data`` (never blocks). Past ``high_water`` waiting, the attached readers are paused."""
        if not data:
            return
        with self._lock:
            if self._broken or self._closed or (may_drop and self._pending >= self._drop_above):
                self._dropped += len(data)
                return
            self._chunks.append(data)
            self._pending += len(data)
            self._wake.notify()
            pause = self._pending > self._high and not self._paused
            if pause:
                self._paused = True
        if pause:
            for reader in list(self._readers):
                reader.pause_reading()

    def attach(self, reader: Pausable) -> None:
        """Let backpressure pause ``reader`` (paused at once if the writer is over its high-water mark)."""
        self._readers[reader] = None
        if self.paused:
            reader.pause_reading()

    def detach(self, reader: Pausable) -> None:
        """No more backpressure on ``reader`` (resumed if it was paused)."""
        if reader in self._readers:
            del self._readers[reader]
            if self.paused:
                reader.resume_reading()

    def _resume(self) -> None:
        with self._lock:
            self._resume_scheduled = False
            if not self._paused or self._pending > self._low:
                return
            self._paused = False
        for reader in list(self._readers):
            reader.resume_reading()

    async def close(self, *, idle: float, limit: float | None = None) -> bool:
        """Write out what waits, then end the thread; True if everything was written.

        Waits as long as the reader makes progress; gives up once nothing could
        be written for ``idle`` seconds, or ``limit`` seconds after the call.
        Then (and if cancelled) what still waits is dropped, as is anything
        written afterwards, and a thread stuck in a write that never returns
        is left behind: it ends once the write returns, or with the process
        (a daemon thread, holding no lock the interpreter needs at exit).
        """
        with self._lock:
            self._stopping = True
            self._wake.notify()
        start = last_progress = self._loop.time()
        last = self.written
        try:
            while self._thread.is_alive():
                await asyncio.sleep(_POLL)
                now = self._loop.time()
                if self.written != last:
                    last, last_progress = self.written, now
                elif now - last_progress >= idle or (limit is not None and now - start >= limit):
                    break
        finally:
            with self._lock:
                self._closed = True
                self._dropped += self._pending
                self._chunks.clear()
                self._pending = 0
                self._paused = False
            for reader in list(self._readers):
                reader.resume_reading()
            self._readers.clear()
            self._thread.join(timeout=0)
        return not self._thread.is_alive() and not self.broken

    # ------------------------------------------------------------------ the thread's side

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._chunks and not self._stopping:
                    self._wake.wait()
                if not self._chunks:
                    return
                batch = [self._chunks.popleft()]
                size = len(batch[0])
                while self._chunks and size + len(self._chunks[0]) <= _BATCH:
                    size += len(self._chunks[0])
                    batch.append(self._chunks.popleft())
            ok = self._write_out(b"".join(batch) if len(batch) > 1 else batch[0])
            with self._lock:
                if self._closed:  # (close() gave up meanwhile and counted this batch as dropped)
                    continue
                self._pending -= size
                if ok:
                    self._written += size
                else:
                    self._broken = True
                    self._dropped += size + self._pending
                    self._chunks.clear()
                    self._pending = 0
                wake = self._paused and self._pending <= self._low and not self._resume_scheduled
                if wake:
                    self._resume_scheduled = True
            if wake:
                with contextlib.suppress(RuntimeError):  # (the loop is closed: nobody left to resume)
                    self._loop.call_soon_threadsafe(self._resume)

    def _write_out(self, data: bytes) -> bool:
        """Write all of ``data``; False if the stream broke."""
        try:
            if self._fd is None:
                self._stream.write(data)
                self._stream.flush()
                return True
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self._fd, view):]
                except BlockingIOError:  # (someone else made the description non-blocking: wait, not spin)
                    select.select([], [self._fd], [], 1.0)
            return True
        except (OSError, ValueError):
            return False


class Outputs:
    """The writers of one launch, one per distinct stream object (so stdout and stderr given as one keep order)."""

    def __init__(self, **options: int) -> None:
        self._options = options
        self._writers: dict[int, tuple[BinaryIO, StreamWriter]] = {}

    def writer(self, stream: BinaryIO, name: str = "output") -> StreamWriter:
        """The writer of ``stream`` (made, with its thread, on first use)."""
        if id(stream) not in self._writers:
            self._writers[id(stream)] = (stream, StreamWriter(stream, name=name, **self._options))
        return self._writers[id(stream)][1]

    async def close(self, *, idle: float, limit: float | None = None) -> None:
        """Close every writer at once (see :meth:`StreamWriter.close`): bounded by ``idle``/``limit`` in all."""
        writers = [w for _, w in self._writers.values()]
        await asyncio.gather(*(w.close(idle=idle, limit=limit) for w in writers))
