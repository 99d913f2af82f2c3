"""The groups one rank's transport serves: ids, members, what broke them, point-to-point numbers.

Every rank allocates group ids in the same order (so ids agree without
talking). A group breaks once, blaming the first failed member (or this rank,
if it was declared failed); its receives fail and sends waiting for a
connection on its behalf stop waiting (:meth:`GroupRegistry.broken`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..errors import GroupError, PeerFailureError
from .router import Receive, Router


class GroupRegistry:
    """Groups of one rank: ``error_for(rank)`` builds the error a failure of ``rank`` gives."""

    __slots__ = ("_router", "_loop", "_error_for", "_members", "_failures", "_broken", "_p2p_numbers", "_next")

    def __init__(
        self, router: Router, loop: asyncio.AbstractEventLoop, error_for: Callable[[int], PeerFailureError]
    ) -> None:
        self._router = router
        self._loop = loop
        self._error_for = error_for
        self._members: dict[Any, tuple[int, ...]] = {}
        self._failures: dict[Any, PeerFailureError] = {}
        self._broken: dict[Any, asyncio.Future[None]] = {}  # per group: resolved when it breaks
        self._p2p_numbers: dict[Any, dict[int, dict[int, int]]] = {}
        self._next = 1

    def __repr__(self) -> str:
        return f"<GroupRegistry groups={len(self._members)} broken={len(self._failures)}>"

    def __contains__(self, gid: Any) -> bool:
        return gid in self._members

    def allocate(self) -> int:
        """The next group id (every rank allocates them in the same order)."""
        gid = self._next
        self._next += 1
        self._router.note_group_id(gid)
        return gid

    def register(self, gid: Any, ranks: tuple[int, ...], failed: list[int]) -> None:
        """Group ``gid`` of ``ranks``; ``failed``: ranks already failed (the first member of them breaks it)."""
        self._members[gid] = ranks
        self._router.know_group(gid, ranks)
        # Look at the failed ranks (few), not at every member (a group of N ranks on each of N
        # ranks would cost O(N^2) in the simulator).
        if failed:
            members = frozenset(ranks)
            for rank in failed:
                if rank in members:
                    self.break_group(gid, rank)

    def members(self, gid: Any) -> tuple[int, ...] | None:
        """The global ranks of group ``gid`` (None: not a group here)."""
        return self._members.get(gid)

    def unregister(self, gid: Any) -> None:
        self._members.pop(gid, None)
        self._failures.pop(gid, None)
        self._p2p_numbers.pop(gid, None)
        self._wake(gid)
        self._router.forget_group(gid, lambda r: GroupError(f"group {gid!r} was destroyed"))

    def forget_all(self) -> None:
        """This rank closed: every group's receives fail as destroyed."""
        destroyed: Callable[[Receive], BaseException] = lambda r: GroupError("the process group was destroyed")
        for gid in list(self._members):
            self._router.forget_group(gid, destroyed)

    def failure(self, gid: Any) -> PeerFailureError | None:
        """The failure that broke group ``gid``, if one did."""
        return self._failures.get(gid)

    def culprit(self, gid: Any, default: int) -> int:
        """The rank to blame for group ``gid``'s failure (``default`` if it did not fail or blames nobody)."""
        failure = self._failures.get(gid)
        return failure.global_rank if failure is not None and failure.global_rank is not None else default

    def broken(self, gid: Any) -> asyncio.Future[None] | None:
        """A future resolved when group ``gid`` breaks (None if it is no group of ours)."""
        if gid not in self._members:
            return None
        fut = self._broken.get(gid)
        if fut is None:
            fut = self._broken[gid] = self._loop.create_future()
        return fut

    def break_group(self, gid: Any, rank: int) -> None:
        """Group ``gid`` is broken by ``rank``'s failure (unless it broke already)."""
        if gid in self._failures:
            return
        self._failures[gid] = self._error_for(rank)
        self._router.fail_group(gid, lambda r: self._error_for(rank))
        self._wake(gid)  # sends of the group still waiting for a connection stop waiting

    def break_containing(self, rank: int, *, every: bool = False) -> None:
        """Break every group ``rank`` is a member of (``every``: all of them, e.g. this rank's own)."""
        for gid, members in list(self._members.items()):
            if every or rank in members:
                self.break_group(gid, rank)

    def _wake(self, gid: Any) -> None:
        fut = self._broken.pop(gid, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def next_p2p_number(self, gid: Any, dst: int, tag: int) -> int:
        """The number of the next point-to-point message of group ``gid`` to ``dst`` with ``tag``."""
        per_dst = self._p2p_numbers.get(gid)
        if per_dst is None:
            per_dst = self._p2p_numbers[gid] = {}
        numbers = per_dst.get(dst)
        if numbers is None:  # (nested, not keyed by (dst, tag): a tag costs one small entry, ~0.1 KiB)
            numbers = per_dst[dst] = {}
        n = numbers.get(tag, 0)
        numbers[tag] = n + 1
        return n
