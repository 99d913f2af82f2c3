"""The framed Unix socket under a shared-memory connection (:class:`~aiodist.net.shm.ShmConnection`).

:class:`FrameStream` is the TCP connection's protocol, reused on a Unix
domain socket: it learns the peer's pid and user (``SO_PEERCRED``) and, when a write
fails because the peer left, still reads what the peer sent before it went.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import Frame
from .tcp_connection import TCPConnection

if TYPE_CHECKING:
    from .shm import ShmConnection

__all__ = ["FrameStream", "MAX_SALVAGE", "peer_credentials", "same_pid_namespace"]

MAX_SALVAGE = 16 << 20
"""Bytes read at most from a socket whose write failed because the peer left (what it sent last)."""

_PEERCRED = struct.Struct("3i")


def peer_credentials(sock: socket.socket) -> tuple[int | None, int | None]:
    """The pid and user of the process at the other end of a Unix socket (``SO_PEERCRED``; None if not said).

    The pid is None too when that process lives in another PID namespace (two
    containers sharing the host's network, e.g. Kubernetes ``hostNetwork``
    pods): its pid there is not its pid here, so neither its shared memory
    (``/proc/PID/fd``) nor its memory can be reached by pid, and the
    connection must go over TCP.
    """
    try:
        pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return None, None
    return (pid if same_pid_namespace(pid) else None), uid


def same_pid_namespace(pid: int) -> bool:
    """True when process ``pid`` (as this process sees it) is in this process's PID namespace.

    Pid 0 is the kernel's answer for a process outside our namespace's view (an
    ancestor's or a sibling's namespace); a process we see but in a namespace
    nested under ours has another namespace file. False also when ``/proc``
    will not say: shared memory needs ``/proc/PID`` anyway.
    """
    if pid <= 0:
        return False
    try:
        theirs = os.stat(f"/proc/{pid}/ns/pid")
        ours = os.stat("/proc/self/ns/pid")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


class FrameStream(TCPConnection):
    """The framed Unix socket under a :class:`ShmConnection` (the TCP connection's protocol, reused)."""

    owner: ShmConnection | None = None
    on_made: Callable[[FrameStream], None] | None = None
    peer_pid: int | None = None  # the process at the other end (None if the system will not say)
    peer_uid: int | None = None  # its user (None if the system will not say)
    only_uid: int | None = None  # if set, a peer of another user is closed before anything is written to it
    _unread: socket.socket | None = None  # a second descriptor of the socket, to read what a failed write left

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = self.peer
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.peer_pid, self.peer_uid = peer_credentials(sock)
        if self.only_uid is not None and self.peer_uid != self.only_uid:
            self.close()  # (before anything is written: the base then aborts the transport)
        super().connection_made(transport)
        self._peer = peer  # (a Unix socket's peername is no host:port)
        if self._transport is None:
            return
        if sock is not None:
            try:
                self._unread = sock.dup()
                self._unread.setblocking(False)
            except OSError:
                self._unread = None
        if self.on_made is not None:
            self.on_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self._exc is None:
            self._read_the_rest()
        unread, self._unread = self._unread, None
        if unread is not None:
            unread.close()
        super().connection_lost(exc)
        owner, self.owner = self.owner, None
        if owner is not None:
            owner._stream_lost(exc)

    def _read_the_rest(self) -> None:
        """The transport broke on a write (EPIPE: the peer is gone) without reading what the peer sent
        before it left: read it now, so that its last frames (a notice that this rank was declared
        failed, say) arrive before the end. Bounded by what the socket holds and :data:`MAX_SALVAGE`."""
        sock = self._unread
        left = MAX_SALVAGE
        while sock is not None and left > 0 and self._exc is None:
            buf = self.get_buffer(-1)
            try:
                n = sock.recv_into(buf, min(len(buf), left))
            except OSError:  # (nothing more: EAGAIN, or a reset)
                return
            if n == 0:
                return
            left -= n
            self.buffer_updated(n)

    def take_unread(self) -> list[Frame]:
        """The frames kept for ``recv`` (while no handler took them), in order; they are no longer kept."""
        frames = list(self._frames)
        self._frames.clear()
        return frames
