"""The fence that gives a rank its array back once its call of an in-place collective has ended.

In place (see :mod:`.intranode`), the peers of a rank read its array -- and
write it, when it lies in shared memory -- from its hello until the end of
their own part. A rank may end its part first: it gave up (a timeout, a
cancellation, an error), and its program may reuse the array at once. So each
rank has an *epoch*, a word in the control page of its staging segment (which
every member maps), that it alone writes and that each description of its
array quotes (:meth:`.intranode.GroupEngine.describe`). Before a call that
failed returns, the rank (:func:`abandon`):

1. adds one to its epoch;
2. takes its segment's lock exclusive, which waits until no member holds it
   shared (a peer inside a copy from or into its array), and releases it.

A peer reaching the array (:class:`Fence`) holds that lock shared for the
whole of its copies -- synchronous code between two messages, never across
an await -- taking it without waiting, then checking the epoch against the
one quoted; it checks again before each chunk it writes there, and after its
last copy. A changed epoch, or a lock it cannot take (the owner is giving up
right now), fails its operation with :class:`~aiodist.errors.PeerAbandonedError`.
The kernel orders lock operations, so a peer that takes the lock after the
owner gave up sees the new epoch, and one that held it made its copies before
the owner returned. On the path that succeeds this costs two system calls per
peer and phase of copies (one or two per operation), and one word read per
chunk written into a peer's array or per piece read out of it.

The owner waits for the lock :data:`WAIT_TRIES` times :data:`WAIT_PAUSE` at
most: a peer stopped inside a copy (SIGSTOP) must not hold the rank forever.
Past that, such a peer writes at most the chunk it was in when it stopped (it
checks the epoch before each), and fails once its copy ends.
"""

from __future__ import annotations

import time

from ..net.shmseg import PAGE, Segment

__all__ = ["CONTROL_BYTES", "WAIT_TRIES", "WAIT_PAUSE", "Abandoned", "Fence", "abandon", "epoch_at"]

CONTROL_BYTES = PAGE
"""The control page that ends each staging segment (its first word: the owner's epoch)."""
WAIT_TRIES = 2000
"""How many times a rank that gives up tries to take its lock before it returns anyway."""
WAIT_PAUSE = 0.0005
"""Seconds between two tries (a peer stops within one chunk of seeing the new epoch)."""


class Abandoned(Exception):
    """Group rank ``rank`` ended its call while this rank was reaching its array (see the module doc)."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.rank = rank


def epoch_at(seg: Segment) -> int:
    """Where the epoch word of the staging segment ``seg`` is: the first of its last :data:`CONTROL_BYTES`.

    (Read and written through the segment, never through an array: a fence
    kept by a traceback must not keep a peer's segment mapped.)"""
    return seg.ref.size - CONTROL_BYTES


def abandon(seg: Segment | None) -> bool:
    """This rank's call ends abnormally: steps 1 and 2 of the module doc on its own segment ``seg``.

    True once no peer holds the lock any more; False if one still did after
    :data:`WAIT_TRIES` tries (or there is no segment). Blocks the caller for
    that long at most; nothing of it is left behind.
    """
    if seg is None or seg.closed:
        return False
    at = epoch_at(seg)
    seg.store_word(at, seg.load_word(at) + 1)
    for _ in range(WAIT_TRIES):
        if seg.try_lock(exclusive=True):
            seg.unlock()
            return True
        time.sleep(WAIT_PAUSE)
    return False


class Fence:
    """A peer's array reached in place: the owner's epoch word, the epoch it quoted, the owner's lock."""

    __slots__ = ("rank", "seg", "at", "epoch", "held")

    def __init__(self, rank: int, seg: Segment, epoch: int) -> None:
        self.rank = rank
        self.seg = seg
        self.at = epoch_at(seg)
        self.epoch = epoch
        self.held = False

    def enter(self) -> None:
        """Take the owner's lock shared, and check the epoch (Abandoned, lock released, if it changed)."""
        if not self.seg.try_lock(exclusive=False):
            raise Abandoned(self.rank)
        self.held = True
        try:
            self.check()
        except Abandoned:
            self.leave()
            raise

    def check(self) -> None:
        """Abandoned if the owner's epoch is no longer the one it quoted."""
        if self.seg.load_word(self.at) != self.epoch:
            raise Abandoned(self.rank)

    def leave(self) -> None:
        """Release the lock :meth:`enter` took (nothing if it did not)."""
        if self.held:
            self.held = False
            self.seg.unlock()
