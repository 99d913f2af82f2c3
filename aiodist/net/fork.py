"""What a forked child of a rank lets go of: the rank's sockets.

A rank that forks (a torch ``DataLoader`` worker, ``multiprocessing`` with
the fork start method) gives the child a copy of every descriptor it holds.
Were the child to keep them, a rank killed while its child lives on would
leave its connections open: the peers would see no end of stream and learn
of the death only when its heartbeats stop (seconds, not milliseconds), and
its listening sockets would still take connections. Descriptors marked
close-on-exec do not help: the child does not exec.

So the networks :func:`own` each socket they open (connections and
listeners, the store's included), and in a forked child
(:func:`os.register_at_fork`) each one still open, under any number, is
pointed at ``/dev/null`` (the number stays taken, so the child's copies of
the Python objects close a harmless descriptor if they ever close theirs).
The parent is untouched. A child cannot use its parent's connections anyway:
they belong to the parent's event loop. (Shared memory the child inherits
stays mapped on purpose: a worker may write into ``aiodist.empty`` arrays.)

This is per-process state by nature (fork copies a process), kept here and
nowhere else. Processes started by ``subprocess`` exec a new program and run
no fork handler (their descriptors are close-on-exec already).
"""

from __future__ import annotations

import os

__all__ = ["own", "disown"]

_owned: dict[int, tuple[int, int]] = {}  # descriptor -> (device, inode) of the socket it was when owned


def own(fd: int) -> None:
    """Let forked children drop descriptor ``fd`` (a socket this process uses); a no-op if it is not open."""
    try:
        st = os.fstat(fd)
    except OSError:
        return
    _owned[fd] = (st.st_dev, st.st_ino)


def disown(fd: int) -> None:
    """Forget ``fd`` (about to be closed). Forgetting is optional: a closed or reused number is checked at fork."""
    _owned.pop(fd, None)


def _open_descriptors(owned: list[int]) -> list[int]:
    """Every descriptor of this process (``/proc/self/fd``; the owned numbers if it cannot be read).

    (An event loop may hold a socket under another number than the one it shows: uvloop duplicates
    the socket it is given. So the child compares files, not numbers.)
    """
    try:
        return sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return owned


def _in_child() -> None:
    owned = list(_owned.items())
    _owned.clear()
    if not owned:
        return
    files = dict.fromkeys(ident for _, ident in owned)
    try:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for fd in _open_descriptors([fd for fd, _ in owned]):
            if fd == null:
                continue
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) in files:  # (one of the sockets owned, not a number reused since)
                    os.dup2(null, fd, inheritable=False)
            except OSError:
                continue
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_in_child)
