"""What a peer's frames may claim: the group ids and sequence numbers this rank knows, and per-peer budgets.

Pure bookkeeping for the routing tables (:mod:`.routing`), which consult it
before a frame touches them:

* :class:`GroupBook` -- the groups known here (their members), the ones this
  rank is not a member of, the ones destroyed here, the newest group id
  allocated, and per group the newest sequence number this rank posted a
  receive for and the floor below which every operation completed here. It
  says why a frame's group or sequence number is impossible (bad input).
* :class:`Budgets` -- how many frames and payload bytes each peer has
  buffered here before their receives were posted, against the per-peer
  limits.
"""

from __future__ import annotations

import bisect
from typing import Any

from .frames import brief

MAX_EARLY_FRAMES = 65536
"""Default per-peer bound on frames buffered before their receive is posted."""
MAX_EARLY_BYTES = 1 << 30
"""Default per-peer bound on payload bytes buffered before their receive is posted (1 GiB)."""
SEQ_WINDOW = 1 << 16
"""Default: how many sequence numbers a keyed message may be ahead of the newest one this rank
posted a receive for in its group (and a point-to-point number ahead of the next one expected)."""
GROUP_WINDOW = 1024
"""Default: how many group ids a message's group may be ahead of the newest one allocated here."""


class GroupBook:
    """The groups and sequence numbers this rank knows (see the module doc).

    ``span[g]``: the global ranks of a known group whose members are
    contiguous, as a range (the common case, checked without a call);
    ``top_seq[g]``: the newest sequence number posted for; ``floor[g]``:
    every operation below it completed here.
    """

    __slots__ = ("seq_window", "group_window", "known", "span", "foreign", "destroyed", "newest", "top_seq", "floor")

    def __init__(self) -> None:
        self.seq_window = SEQ_WINDOW
        self.group_window = GROUP_WINDOW
        self.known: dict[Any, tuple[int, ...] | None] = {}  # members (None: senders are not checked)
        self.span: dict[Any, range] = {}
        self.foreign: dict[Any, None] = {}
        self.destroyed: dict[Any, None] = {}
        self.newest = 0
        self.top_seq: dict[Any, int] = {}
        self.floor: dict[Any, int] = {}

    def __repr__(self) -> str:
        return f"<GroupBook known={len(self.known)} destroyed={len(self.destroyed)} newest={self.newest}>"

    def know(self, group: Any, members: tuple[int, ...] | None) -> None:
        """``group`` exists here with these members (global ranks; None: do not check senders)."""
        m = None if members is None else tuple(members)
        self.known[group] = m
        if m and m[0] <= m[-1] and m[-1] - m[0] == len(m) - 1:
            self.span[group] = range(m[0], m[-1] + 1)  # (a sorted distinct tuple: the ranks between its ends)
        else:
            self.span.pop(group, None)
        self.destroyed.pop(group, None)
        self.foreign.pop(group, None)
        self.note_id(group)

    def note_id(self, group: Any) -> None:
        """Group id ``group`` was allocated here: ids up to the window beyond it are possible."""
        if type(group) is int and group > self.newest:
            self.newest = group

    def forget(self, group: Any) -> None:
        """``group`` was destroyed here: its frames are dropped from now on (a group this rank is not a member
        of stays foreign: a frame for it is still impossible)."""
        self.known.pop(group, None)
        self.span.pop(group, None)
        self.top_seq.pop(group, None)
        self.floor.pop(group, None)
        if group not in self.foreign:
            self.destroyed[group] = None

    def vet_group(self, g: Any, src: int) -> str | None:
        """Why a frame from ``src`` for group ``g`` is impossible (None: it is possible)."""
        if g in self.known:
            members = self.known[g]
            if members is not None and not _is_member(members, src):
                return f"a message for group {brief(g)}, of which rank {src} is not a member (members {list(members)})"
            return None
        if g in self.destroyed:
            return None
        if g in self.foreign:
            return f"a message for group {brief(g)}, of which this rank is not a member"
        if type(g) is not int or g < 0:
            return f"a message for group id {brief(g)}, which no group has"
        if g > self.newest + self.group_window:
            return (f"a message for group {g}, more than {self.group_window} group ids beyond the newest "
                    f"one created here ({self.newest})")
        return None

    def vet_seq(self, g: Any, k: Any) -> str | None:
        """Why a keyed frame of group ``g`` with key ``k`` is impossible (None: it is possible)."""
        if not isinstance(k, (list, tuple)) or not k or type(k[0]) is not int or k[0] < 0:
            return f"a collective message of group {brief(g)} without a sequence number (key {brief(k)})"
        seq = k[0]
        top = self.top_seq.get(g, max(self.floor.get(g, 0), 0))
        if seq > top + self.seq_window:
            return (f"a message for seq {seq} of group {brief(g)}, more than {self.seq_window} beyond the newest "
                    f"this rank has reached ({top})")
        return None


class PeerBudget:
    """Frames and payload bytes one peer has buffered here."""

    __slots__ = ("frames", "nbytes")

    def __init__(self) -> None:
        self.frames = 0
        self.nbytes = 0

    def __repr__(self) -> str:
        return f"<PeerBudget frames={self.frames} nbytes={self.nbytes}>"


class Budgets:
    """What each peer has buffered here before its receives were posted, against the per-peer limits."""

    __slots__ = ("max_frames", "max_bytes", "_peers")

    def __init__(self) -> None:
        self.max_frames = MAX_EARLY_FRAMES
        self.max_bytes = MAX_EARLY_BYTES
        self._peers: dict[int, PeerBudget] = {}

    def __repr__(self) -> str:
        return f"<Budgets peers={len(self._peers)} max_frames={self.max_frames} max_bytes={self.max_bytes}>"

    def take(self, src: int, nbytes: int) -> bool:
        """Charge one more frame of ``nbytes`` to ``src`` if its budget allows it (else False, nothing charged)."""
        b = self._peers.get(src)
        if b is None:
            b = self._peers[src] = PeerBudget()
        if b.frames + 1 > self.max_frames or b.nbytes + nbytes > self.max_bytes:
            return False
        b.frames += 1
        b.nbytes += nbytes
        return True

    def charge(self, src: int, nbytes: int) -> None:
        """Count one more frame of ``nbytes`` buffered for ``src`` (whatever its budget says)."""
        b = self._peers.get(src)
        if b is None:
            b = self._peers[src] = PeerBudget()
        b.frames += 1
        b.nbytes += nbytes

    def refund(self, src: int, nbytes: int) -> None:
        """One frame of ``nbytes`` buffered for ``src`` left the tables.

        (A peer's record stays when it drops to zero: one per peer that ever sent early.)
        """
        b = self._peers.get(src)
        if b is not None:
            b.frames -= 1
            b.nbytes -= nbytes

    def of(self, src: int) -> tuple[int, int]:
        """(frames, bytes) buffered for ``src``."""
        b = self._peers.get(src)
        return (b.frames, b.nbytes) if b is not None else (0, 0)


def _is_member(members: tuple[int, ...], src: int) -> bool:
    """Is ``src`` in ``members``? O(1) for a contiguous sorted tuple (the world), O(log n) for a sorted one."""
    n = len(members)
    if n and members[0] <= src <= members[-1] and members[-1] - members[0] == n - 1:
        return True  # (groups keep their ranks sorted and distinct)
    i = bisect.bisect_left(members, src)
    if i < n and members[i] == src:
        return True
    return src in members  # a non-member (bad input: rare), or an unsorted tuple
