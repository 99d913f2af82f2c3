"""Arrays that live in shared memory, so that collectives among the ranks of one host skip a copy.

``aiodist.empty(shape, dtype)`` (and ``zeros``) allocate an ordinary numpy
array whose memory is an anonymous shared segment (see
:mod:`aiodist.net.shmseg`); ``aiodist.shared_array(x)`` returns a copy of
``x`` there (what torch's ``share_memory_()`` does to a tensor). A collective
whose ranks all run on one host reads such arrays of its peers in place
(:mod:`aiodist.collectives.intranode`): an all_reduce then reads and writes
each element once, with no copy into a staging area first. On any other path
they are ordinary arrays.

The memory (and its descriptor) goes when the last array viewing it is
collected; nothing is ever left in ``/dev/shm``.
"""

from __future__ import annotations

import bisect
import math
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .net.shmseg import SegmentRef, create_memory

__all__ = ["empty", "zeros", "shared_array", "is_shared", "locate"]

# This process's shared arrays: sorted start addresses, and per start (end, ref).
_starts: list[int] = []
_spans: dict[int, tuple[int, SegmentRef]] = {}


def empty(shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialized (in fact zero-filled) array of ``shape`` and ``dtype`` in shared memory."""
    dt = np.dtype(dtype)
    dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: {dims}")
    nbytes = math.prod(dims) * dt.itemsize
    ref, mapping = create_memory(nbytes, name="aiodist-array")
    arr = np.ndarray(dims, dtype=dt, buffer=mapping)
    start = arr.ctypes.data
    bisect.insort(_starts, start)
    _spans[start] = (start + ref.size, ref)
    weakref.finalize(mapping, _forget, start, ref.fd)
    return arr


def zeros(shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    """A zero-filled array in shared memory (new shared memory is zero-filled: this is :func:`empty`)."""
    return empty(shape, dtype)


def shared_array(arr: Any) -> np.ndarray:
    """A copy of ``arr`` (anything ``np.asarray`` takes) in shared memory, same shape and dtype."""
    src = np.asarray(arr)
    out = empty(src.shape, src.dtype)
    np.copyto(out, src)
    return out


def locate(arr: np.ndarray) -> tuple[SegmentRef, int] | None:
    """(the segment, byte offset) of ``arr``'s memory when it lies inside one shared array of this process."""
    if not _starts:
        return None
    addr = arr.ctypes.data
    i = bisect.bisect_right(_starts, addr) - 1
    if i < 0:
        return None
    start = _starts[i]
    end, ref = _spans[start]
    if addr + arr.nbytes > end:
        return None
    return ref, addr - start


def is_shared(arr: Any) -> bool:
    """True when ``arr`` (a numpy array) lives in memory from :func:`empty` / :func:`shared_array`."""
    return isinstance(arr, np.ndarray) and locate(arr) is not None


def _forget(start: int, fd: int) -> None:
    """The last view of a shared array went: forget it and close its descriptor (the mapping is gone)."""
    _spans.pop(start, None)
    i = bisect.bisect_left(_starts, start)
    if i < len(_starts) and _starts[i] == start:
        del _starts[i]
    try:
        os.close(fd)
    except OSError:
        pass
