"""What ends a receive at once, now and later: a failed source, a broken group, a void operation.

Pure bookkeeping for the routing tables (:mod:`.routing`): when a peer fails,
a group breaks or a rank reports a mismatch, the receives waiting for it end
at once, and so does every receive posted for it later. Each failure is an
:data:`~.receives.ErrorFactory` that builds the exception a receive ends with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .receives import ErrorFactory, Receive


class FailedFrom:
    """Every keyed receive of a group at ``seq`` or later fails with ``error()`` (a fresh exception each call)."""

    __slots__ = ("seq", "error", "factory")

    def __init__(self, seq: int, error: Callable[[], BaseException]) -> None:
        self.seq = seq
        self.error = error
        self.factory: ErrorFactory = lambda r: error()


class Failures:
    """What ends a receive at once, now and later: a failed source, group, operation, or group from a seq on."""

    __slots__ = ("source", "group", "seq", "void", "since", "active")

    def __init__(self) -> None:
        self.source: dict[int, ErrorFactory] = {}
        self.group: dict[Any, ErrorFactory] = {}
        self.seq: dict[tuple[Any, Any, int | None], ErrorFactory] = {}  # (group, seq, src or None: any)
        self.void: dict[tuple[Any, Any], ErrorFactory] = {}  # (group, seq): even messages already here do not count
        self.since: dict[Any, FailedFrom] = {}
        self.active = False  # any of them is set (what a receive posted checks first)

    def __repr__(self) -> str:
        return f"<Failures sources={list(self.source)} groups={list(self.group)} since={list(self.since)}>"

    def add_source(self, src: int, factory: ErrorFactory) -> None:
        """Source ``src`` failed: every receive from it fails."""
        self.source[src] = factory
        self.active = True

    def add_group(self, group: Any, factory: ErrorFactory) -> None:
        """``group`` broke: every receive of it fails."""
        self.group[group] = factory
        self.active = True

    def add_seq(self, group: Any, seq: Any, src: int | None, factory: ErrorFactory, *, void: bool = False) -> None:
        """Operation ``seq`` of ``group`` is void: its keyed receives from ``src`` (None: any) fail (``void``:
        even those whose message is here already)."""
        self.seq[(group, seq, src)] = factory
        if void:
            self.void[(group, seq)] = factory
        self.active = True

    def add_since(self, group: Any, seq: int, error: Callable[[], BaseException]) -> FailedFrom | None:
        """Fail ``group`` from ``seq`` on; None if it failed from an earlier one already."""
        cur = self.since.get(group)
        if cur is not None and cur.seq <= seq:
            return None
        ff = self.since[group] = FailedFrom(seq, error)
        self.active = True
        return ff

    def void_since(self, group: Any, seq: int) -> FailedFrom | None:
        """What voids operation ``seq`` of ``group`` (:meth:`add_since` at ``seq`` or before), or None."""
        ff = self.since.get(group) if self.since else None
        return ff if ff is not None and seq >= ff.seq else None

    def factory_for(self, r: Receive) -> ErrorFactory | None:
        """How ``r`` fails at once, or None if nothing failed that it depends on."""
        f = self.group.get(r.group)
        if f is not None:
            return f
        if r.tag is None and r.key:
            seq = r.key[0]
            ff = self.since.get(r.group) if self.since else None
            if ff is not None and type(seq) is int and seq >= ff.seq:
                return ff.factory
            if self.seq and r.src is not None:
                f = self.seq.get((r.group, seq, r.src)) or self.seq.get((r.group, seq, None))
                if f is not None:
                    return f
        if r.src is not None:
            return self.source.get(r.src)
        return None

    def forget_group(self, group: Any) -> None:
        """``group`` was destroyed: forget its failures, its own included (nothing of it can post a receive any
        more: its operations were cancelled and awaited first, and it refuses new ones; frames that still come
        for it are the admission's to refuse). Kept, a destroyed group's entry stayed for the rank's life."""
        self.forget_seqs(group, None)
        self.since.pop(group, None)
        self.group.pop(group, None)
        self.active = bool(self.source or self.group or self.seq or self.since)

    def forget_seqs(self, group: Any, below: int | None) -> None:
        """Forget the failures of ``group``'s operations below ``below`` (None: all of them)."""
        def gone(k: tuple[Any, ...]) -> bool:
            return k[0] == group and (below is None or (type(k[1]) is int and k[1] < below))

        tables: tuple[dict[Any, ErrorFactory], ...] = (self.seq, self.void)
        for table in tables:
            for k in [k for k in table if gone(k)]:
                del table[k]
