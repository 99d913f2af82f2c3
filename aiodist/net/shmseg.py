"""Segments of anonymous shared memory, and how a process on the same host maps another's.

A :class:`Segment` is a ``memfd`` (``os.memfd_create``) mapped into this
process: memory with no name anywhere (nothing in ``/dev/shm``), freed by the
kernel once the last process holding it has closed its descriptor and
unmapped it -- a process killed with SIGKILL leaves nothing behind.

Another process reaches a segment through its :class:`SegmentRef` (owner's
pid, descriptor number, inode, size), which travels in an ordinary frame: it
opens ``/proc/<pid>/fd/<fd>`` (the kernel allows this to processes of the
same user, the check it makes for ptrace-read access), checks that the inode
is the one announced (a descriptor number reused since would be another
file), and maps it. That is the only way a descriptor reaches another
process here: asyncio's socket transports cannot carry ``SCM_RIGHTS``.
Attaching fails with :class:`SharedMemoryError`, never with a wrong mapping.

:data:`PEERS` tells whoever mapped a peer's memory (the intra-node
collectives, see :mod:`aiodist.collectives.intranode`) that the peer's
connection ended, so that the mappings of a dead peer are dropped at once
and its memory is freed.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AiodistError

__all__ = ["SharedMemoryError", "SegmentRef", "Segment", "create_memory", "still_held", "PeerWatch", "PEERS", "PAGE"]

PAGE = mmap.PAGESIZE
_WORD = struct.Struct("=q")


class SharedMemoryError(AiodistError):
    """Shared memory could not be created or mapped (``.reason`` says why)."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """What another process of this host needs to map a :class:`Segment`."""

    pid: int
    fd: int
    ino: int
    size: int

    def pack(self) -> list[int]:
        return [self.pid, self.fd, self.ino, self.size]

    @classmethod
    def unpack(cls, raw: Any) -> SegmentRef:
        """The ref from :meth:`pack`'s list; SharedMemoryError for anything else."""
        if not isinstance(raw, (list, tuple)) or len(raw) != 4 or not all(type(v) is int and v >= 0 for v in raw):
            raise SharedMemoryError(f"malformed shared memory reference {raw!r}", reason="malformed")
        return cls(*raw)


def create_memory(nbytes: int, *, name: str) -> tuple[SegmentRef, mmap.mmap]:
    """A new memfd of ``nbytes`` (rounded up to whole pages, at least one) and its mapping.

    The caller owns the descriptor (``ref.fd``). Pages take memory only once
    touched. Raises SharedMemoryError when the system refuses (no memfd, no memory).
    """
    size = max(PAGE, -(-int(nbytes) // PAGE) * PAGE)
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    except (OSError, AttributeError) as e:
        raise SharedMemoryError(f"cannot create shared memory: {e}", reason="create") from None
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
        ino = os.fstat(fd).st_ino
    except OSError as e:
        os.close(fd)
        raise SharedMemoryError(f"cannot create {size} bytes of shared memory: {e}", reason="create") from None
    return SegmentRef(os.getpid(), fd, ino, size), mapping


def still_held(ref: SegmentRef) -> bool:
    """Whether ``ref``'s owner still holds the segment (its descriptor is still that file): False once it closed
    it (the array was freed: nothing of the owner's reaches it any more) or died, or cannot be asked."""
    try:
        return os.stat(f"/proc/{ref.pid}/fd/{ref.fd}").st_ino == ref.ino
    except OSError:
        return False


class Segment:
    """A shared memory segment mapped into this process (created here, or a peer's, attached).

    ``view`` is a writable byte view of the whole mapping. :meth:`close`
    unmaps it and closes the descriptor (so does the segment's collection);
    arrays made with :meth:`array` keep the mapping (not the descriptor)
    alive until they are collected too.

    Each process's descriptor of a segment is its own open file, so the
    segment also carries a lock (``flock``) that the processes mapping it
    take shared or exclusive (:meth:`try_lock`), even two ranks of one process.
    """

    __slots__ = ("ref", "owned", "fd", "_map", "view", "_finalizer", "__weakref__")

    def __init__(self, ref: SegmentRef, fd: int, mapping: mmap.mmap, *, owned: bool) -> None:
        self.ref = ref
        self.owned = owned
        self.fd = fd  # (this process's descriptor: ``ref.fd`` is the owner's)
        self._map: mmap.mmap | None = mapping
        self.view: memoryview | None = memoryview(mapping)
        self._finalizer = weakref.finalize(self, _unmap, fd, mapping, self.view)

    def __repr__(self) -> str:
        whose = "own" if self.owned else f"pid {self.ref.pid}"
        state = "closed" if self._map is None else f"{self.ref.size} bytes"
        return f"<Segment {whose} fd={self.ref.fd} {state}>"

    @property
    def closed(self) -> bool:
        return self._map is None

    @classmethod
    def create(cls, nbytes: int, *, name: str = "aiodist") -> Segment:
        """A new zero-filled segment of ``nbytes`` (rounded up to whole pages).

        Pages take memory only once touched. Raises SharedMemoryError when the
        system refuses (no memfd, no memory).
        """
        ref, mapping = create_memory(nbytes, name=name)
        return cls(ref, ref.fd, mapping, owned=True)

    @classmethod
    def attach(cls, ref: SegmentRef) -> Segment:
        """Map another process's segment (see the module doc); SharedMemoryError if that is impossible.

        (A segment of this very process maps again just as well: ranks sharing a process in tests.)
        """
        path = f"/proc/{ref.pid}/fd/{ref.fd}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise SharedMemoryError(
                f"cannot open the shared memory of process {ref.pid} ({path}): {e.strerror or e}", reason="open"
            ) from None
        try:
            st = os.fstat(fd)
            if st.st_ino != ref.ino or st.st_size < ref.size:
                raise SharedMemoryError(
                    f"{path} is not the segment announced by process {ref.pid} (inode {st.st_ino}, not {ref.ino})",
                    reason="stale",
                )
            mapping = mmap.mmap(fd, ref.size)
        except OSError as e:
            os.close(fd)
            raise SharedMemoryError(f"cannot map the shared memory of process {ref.pid}: {e}", reason="map") from None
        except BaseException:
            os.close(fd)
            raise
        return cls(ref, fd, mapping, owned=False)

    def array(self, dtype: Any, offset: int, count: int) -> np.ndarray:
        """A numpy array of ``count`` elements of ``dtype`` at byte ``offset`` of the segment (shares memory)."""
        if self._map is None:
            raise SharedMemoryError(f"{self!r} is closed", reason="closed")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset)

    def load_word(self, offset: int) -> int:
        """The signed 64-bit word at byte ``offset`` (keeps no view of the mapping, unlike :meth:`array`)."""
        if self._map is None:
            raise SharedMemoryError(f"{self!r} is closed", reason="closed")
        return int(_WORD.unpack_from(self._map, offset)[0])

    def store_word(self, offset: int, value: int) -> None:
        """Write the signed 64-bit word at byte ``offset`` (see :meth:`load_word`)."""
        if self._map is None:
            raise SharedMemoryError(f"{self!r} is closed", reason="closed")
        _WORD.pack_into(self._map, offset, value)

    def try_lock(self, *, exclusive: bool) -> bool:
        """Take the segment's lock, shared or exclusive, without waiting; False if another holder prevents it.

        A lock taken or released by the kernel orders this process's memory
        accesses before it against those of the next process to take it.
        """
        if self._map is None:
            raise SharedMemoryError(f"{self!r} is closed", reason="closed")
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self) -> None:
        """Release the lock :meth:`try_lock` took (nothing if the segment is closed: closing released it)."""
        if self._map is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Unmap and close the descriptor. Idempotent. Arrays of it still alive keep the mapping till they go."""
        self._map = self.view = None
        self._finalizer()


def _unmap(fd: int, mapping: mmap.mmap, view: memoryview) -> None:
    try:
        view.release()
        mapping.close()
    except BufferError:
        pass  # arrays still export it: the mapping goes with the last of them
    try:
        os.close(fd)
    except OSError:
        pass


class PeerWatch:
    """Callbacks to run once this process has no connection left to a peer process (keyed by its pid).

    Connections report :meth:`opened` and :meth:`closed`; when the last one
    to a pid closes (a duplicate connection that is dropped does not count),
    the callbacks registered for it run, once. Callbacks are held weakly (a
    bound method of an object that died is forgotten). Owned by the process
    (pids are a process-wide notion): :data:`PEERS`.
    """

    def __init__(self) -> None:
        self._open: dict[int, int] = {}
        self._watchers: dict[int, list[weakref.WeakMethod[Callable[[int], None]]]] = {}

    def __repr__(self) -> str:
        return f"<PeerWatch connected={sorted(self._open)} watched={sorted(self._watchers)}>"

    def opened(self, pid: int) -> None:
        self._open[pid] = self._open.get(pid, 0) + 1

    def closed(self, pid: int) -> None:
        left = self._open.get(pid, 0) - 1
        if left > 0:
            self._open[pid] = left
            return
        self._open.pop(pid, None)
        for ref in self._watchers.pop(pid, []):
            callback = ref()
            if callback is not None:
                callback(pid)

    def watch(self, pid: int, callback: Callable[[int], None]) -> None:
        """Call ``callback(pid)`` (a bound method) when the last connection to ``pid`` closes.

        Register it while a connection to ``pid`` is known to be open (one just
        carried a frame from it), or a duplicate closing meanwhile may look like
        the last one.
        """
        self._watchers.setdefault(pid, []).append(weakref.WeakMethod(callback))


PEERS = PeerWatch()
"""The process's :class:`PeerWatch`: the shared memory connections report to it."""
