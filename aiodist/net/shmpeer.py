"""Reading another process's memory directly (Linux cross-memory attach).

``process_vm_readv`` copies from another process into this one in a single
copy made by the kernel, with no shared segment in between: a rank of the
same host can reduce straight from a peer's ordinary numpy array. Only
reading is offered: a peer that gave up on an operation may have reused its
memory, and a late write into it would corrupt it. The kernel allows the call
to processes the caller may ptrace (same user; not under Yama's
``ptrace_scope`` >= 1 unless related; some container profiles forbid it):
:func:`probe` tells whether it works towards a given process, and the caller
falls back to shared staging buffers when it does not.

Errors are :class:`PeerMemoryError` with the ``errno``: ``ESRCH`` means the
process is gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as errno_
import os

import numpy as np

from ..errors import AiodistError

__all__ = ["PeerMemoryError", "available", "read", "probe"]


class PeerMemoryError(AiodistError):
    """A copy from another process's memory failed (``.errno``; ESRCH: it is gone)."""

    def __init__(self, message: str, *, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _bind(name: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


_readv = _bind("process_vm_readv")


def available() -> bool:
    """True when this system's C library has the call (whether the kernel allows it: :func:`probe`)."""
    return _readv is not None


def read(pid: int, remote: int, out: np.ndarray) -> None:
    """Fill the C-contiguous ``out`` with the bytes at address ``remote`` of process ``pid`` (partial reads resumed)."""
    if _readv is None:
        raise PeerMemoryError("process_vm_readv is not available", errno=errno_.ENOSYS)
    local, nbytes = out.ctypes.data, out.nbytes
    done = 0
    lv, rv = _IOVec(), _IOVec()
    while done < nbytes:
        lv.base, lv.len = local + done, nbytes - done
        rv.base, rv.len = remote + done, nbytes - done
        got = _readv(pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else errno_.EFAULT
            raise PeerMemoryError(f"cannot read {nbytes} bytes of process {pid}'s memory: {os.strerror(err)}", errno=err)
        done += got


def probe(pid: int, remote: int, nbytes: int) -> bool:
    """Can this process read ``nbytes`` at ``remote`` in process ``pid``?"""
    try:
        read(pid, remote, np.empty(nbytes, np.uint8))
    except PeerMemoryError:
        return False
    return True
