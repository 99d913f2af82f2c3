"""The mismatch checker of a process group: fingerprints in the store, and what a mismatch leaves behind.

Every frame of a collective carries its call's signature (operation, dtype,
element count, root), and a receive that gets a frame of another call fails
at once (see :mod:`aiodist.comm.channel`): most mismatches are caught that way,
for free. Some are not (two calls whose frames never cross, e.g. ranks
waiting on each other in opposite directions). So a collective still running
:data:`MISMATCH_CHECK_AFTER` seconds after its start (the group's monitor
starts the check, see :mod:`aiodist.op_runner`) appends its fingerprint to a
key of the store (``fp/<group>/<seq>``) and polls the others' there
(:class:`FingerprintCheck`); any disagreement, or a member that already found
one, fails it with CollectiveMismatchError listing what each rank called.

Once a collective of a group mismatched, the group is unusable
(:class:`MismatchChecker`): every later operation fails at once; every other
member is told (a report frame to each, so that its operation at that seq
fails at once instead of waiting for one that will never come); and the store is marked (``fp/<group>/bad``) for members that
check their fingerprints later -- a rank whose part of the call completed
without noticing (e.g. a broadcast root) learns it at its next collective.

Cancellation: :meth:`MismatchChecker.close` cancels the store notes still on
their way (a group being destroyed gives them a moment first,
:meth:`MismatchChecker.wait_notes`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from .comm import GroupComm
from .eager import start_eager
from .comm import Transport
from .errors import AiodistError, CollectiveMismatchError

log = logging.getLogger(__name__)

MISMATCH_CHECK_AFTER = 0.3
"""Seconds a collective may wait before its fingerprint is compared with the other ranks' (0: never)."""
MISMATCH_RECHECK = 0.3
"""Seconds between two reads of the others' fingerprints."""
HELPERS_GRACE = 1.0
"""Seconds a group being destroyed waits for its mismatch notes to reach the store."""


class MismatchChecker:
    """A group's fingerprint checks and its first mismatch (see the module doc).

    ``first``: the group's first mismatch (None: none so far); the group is
    unusable since. ``check_after``: :data:`MISMATCH_CHECK_AFTER` unless changed.
    """

    __slots__ = ("comm", "store", "timeout", "check_after", "first", "_told", "_helpers")

    def __init__(self, comm: GroupComm, *, store: Any, timeout: float) -> None:
        self.comm = comm
        self.store = store
        self.timeout = timeout  # of each store read
        self.check_after = MISMATCH_CHECK_AFTER
        self.first: CollectiveMismatchError | None = None
        self._told: set[int] = set()
        self._helpers: dict[asyncio.Task[Any], None] = {}

    def __repr__(self) -> str:
        state = f"mismatch at seq {self.first.seq}" if self.first is not None else "no mismatch"
        return f"<MismatchChecker {self.comm.name} {state}>"

    def unusable(self, op: str, seq: int) -> CollectiveMismatchError:
        """What operation ``seq`` fails with because an earlier one mismatched (:attr:`first`)."""
        first = self.first
        assert first is not None
        return CollectiveMismatchError(
            f"{op} (seq {seq}) of {self.comm.name}: the group is unusable after a collective mismatch "
            f"at seq {first.seq}: {first}",
            calls=first.calls,
            seq=seq,
            found_by=first.found_by,
            finding=first.finding,
        )

    def check(self, op: str, seq: int, sig: str, task: asyncio.Task[Any]) -> FingerprintCheck:
        """Start comparing the fingerprint of operation ``seq`` (running as ``task``) with the others'."""
        c = FingerprintCheck(self, op, seq, sig, task)
        c.begin()
        return c

    def leftover(self, seq: int, sig: str, hit: tuple[int, str]) -> CollectiveMismatchError:
        """A frame of ``seq`` that no receive took, from a peer (global rank, its signature) that called something else.

        (A call whose part completes without hearing from the mismatched peers, e.g. a broadcast
        whose roots differ, would otherwise leave them behind silently.)
        """
        src, other = hit
        peer = self.comm.group_rank(src)
        me = self.comm.rank
        return CollectiveMismatchError(
            f"collective mismatch in {self.comm.name} at seq {seq}: rank {me} called {sig!r} "
            f"but rank {peer} called {other!r}",
            calls={me: sig, peer: other},
            seq=seq,
            group=self.comm.name,
            ranks=self.comm.ranks,
        )

    def note(self, e: CollectiveMismatchError, seq: int) -> None:
        """Collective ``seq`` mismatched (``e``): the group is unusable; make sure every member learns it.

        Tells every other member (not only the peers it exchanged frames with);
        when a peer's report is how this rank learnt it (``e.found_by``), relays
        that report as it came (the finder's words, naming the finder) to the
        members it is connected to (the finder may leave before its own reports
        reach them all); and marks the store for members that check their
        fingerprints later.
        """
        if self.first is None:
            self.first = e
        if seq in self._told:
            return
        self._told.add(seq)
        comm = self.comm
        transport = comm.transport
        calls = {comm.ranks[k]: v for k, v in e.calls.items() if isinstance(k, int) and 0 <= k < comm.size}
        if e.found_by is None:
            for r in comm.ranks:
                if r != transport.rank:
                    transport.report_mismatch(r, comm.gid, seq, str(e), calls)  # connects if needed
        else:  # relayed to the members this rank is connected to: the finder may leave before its reports get out
            members = set(comm.ranks)
            text = e.finding if e.finding is not None else str(e)
            for r in transport.connected_peers():
                if r in members and r != transport.rank and r != e.found_by:
                    transport.report_mismatch(r, comm.gid, seq, text, calls, found=e.found_by)
        if self.check_after:
            self._spawn(self._mark(seq, e.calls))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        # Started eagerly: the note is on its way before the caller sees the error (and perhaps exits).
        task, _ = start_eager(coro, asyncio.get_running_loop())
        self._helpers[task] = None
        task.add_done_callback(self._helpers.pop)
        task.add_done_callback(_report)

    async def _mark(self, seq: int, calls: dict[int, Any]) -> None:
        """Mark ``seq`` mismatched in the store (its fingerprint key, and the group's first bad seq)."""
        try:
            await self.store.append(fingerprint_key(self.comm, seq), b"!\n")
            listing = "".join(f"{r}={c}\n" for r, c in sorted(calls.items()))
            await self.store.compare_set(bad_key(self.comm), b"", f"{seq}\n{listing}".encode())
        except Exception as e:  # the store is gone: the members that check later learn nothing from it
            log.debug("rank %d: could not mark the mismatch of %s at seq %d in the store: %r",
                      self.comm.transport.rank, self.comm.name, seq, e)

    async def wait_notes(self) -> None:
        """Give the store notes on their way :data:`HELPERS_GRACE` seconds to get there."""
        if self._helpers:
            await asyncio.wait(list(self._helpers), timeout=HELPERS_GRACE)

    async def close(self) -> None:
        """Cancel the store notes still on their way, and await them."""
        helpers = list(self._helpers)
        for t in helpers:
            t.cancel()
        if helpers:
            await asyncio.gather(*helpers, return_exceptions=True)


class FingerprintCheck:
    """Compare a stalled collective's fingerprint with the other members' through the store.

    ``found``: the mismatch, once found (the operation's ``task`` is then
    cancelled, and its runner fails it with ``found``). :meth:`stop` cancels
    the check (the operation ended).
    """

    __slots__ = ("checker", "op", "seq", "sig", "task", "poller", "found", "posted")

    def __init__(self, checker: MismatchChecker, op: str, seq: int, sig: str, task: asyncio.Task[Any]) -> None:
        self.checker = checker
        self.op = op
        self.seq = seq
        self.sig = sig
        self.task = task
        self.found: CollectiveMismatchError | None = None
        self.poller: asyncio.Task[None] | None = None
        self.posted: dict[int, str] | None = None  # the members' calls the store showed last (group ranks)

    def __repr__(self) -> str:
        return f"<FingerprintCheck {self.op} seq={self.seq}{' mismatch' if self.found is not None else ''}>"

    def absent(self) -> list[int]:
        """The members (group ranks) whose fingerprint the store did not show at the last look (none looked:
        empty): they had not reached this call -- or their part of it had ended (they write none then)."""
        posted = self.posted
        if posted is None:
            return []
        return [r for r in range(self.checker.comm.size) if r not in posted]

    def begin(self) -> None:
        self.poller = asyncio.get_running_loop().create_task(self._run())
        self.poller.add_done_callback(_report)

    def stop(self) -> None:
        if self.poller is not None and not self.poller.done():
            self.poller.cancel()

    async def _run(self) -> None:
        checker = self.checker
        comm, store = checker.comm, checker.store
        key = fingerprint_key(comm, self.seq)
        try:
            await store.append(key, f"{comm.rank}={self.sig}\n".encode())
            bad = bad_key(comm)
            while True:
                # A frame of this seq that came from a member that called something else (and that no receive
                # of ours takes: we wait for another rank, e.g. ranks that disagree on a broadcast's src).
                # The members whose part completed write no fingerprint: this is how we learn of them.
                hit = comm.transport.router.conflicting_arrival(comm.gid, self.seq, self.sig, comm.members)
                if hit is not None:
                    self.found = checker.leftover(self.seq, self.sig, hit)
                    break
                calls, marked = parse_fingerprints(bytes(await store.get(key, timeout=checker.timeout)))
                calls[comm.rank] = self.sig
                self.posted = calls
                if marked or len(set(calls.values())) > 1:
                    self.found = self._listed(calls, marked, None)
                    break
                if await store.check([bad]):
                    head, _, rest = bytes(await store.get(bad, timeout=checker.timeout)).partition(b"\n")
                    if head == NEW_GROUP_NOTE.encode():  # a member disagreed on the ranks: the group is not there
                        self.found = self._never_created(parse_fingerprints(rest)[0])
                        break
                    earlier = int(head)
                    if earlier < self.seq:  # we got through a call the others found mismatched
                        self.found = self._listed(parse_fingerprints(rest)[0], marked, earlier)
                        break
                await asyncio.sleep(MISMATCH_RECHECK)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the store is gone: no verdict (a failure of the store host is reported elsewhere)
            log.debug("rank %d: the fingerprint check of %s (seq %d) of %s gave up: %r",
                      comm.transport.rank, self.op, self.seq, comm.name, e)
            return
        if not self.task.done():
            self.task.cancel()

    def _listed(self, calls: dict[int, str], marked: bool, earlier: int | None) -> CollectiveMismatchError:
        """The mismatch the store shows: ``calls`` (group rank -> call), ``marked`` by another member, or found
        ``earlier`` (a seq before this one, whose part this rank completed without noticing)."""
        listing = "; ".join(f"rank {r} called {c!r}" for r, c in sorted(calls.items()))
        why = "another member found a mismatch; " if marked and len(set(calls.values())) <= 1 else ""
        if earlier is not None:
            why = (
                f"the group is unusable: its members found a mismatch at seq {earlier} "
                f"(this rank's part of that call completed without noticing) where "
            )
        return CollectiveMismatchError(
            f"collective mismatch in {self.checker.comm.name} at seq {self.seq}: {why}{listing}",
            calls=calls,
            seq=self.seq,
            group=self.checker.comm.name,
            ranks=self.checker.comm.ranks,
        )

    def _never_created(self, calls: dict[int, str]) -> CollectiveMismatchError:
        """The note of a new_group whose members disagreed (``calls``: global rank -> the ranks it passed)."""
        comm = self.checker.comm
        listing = "; ".join(f"global rank {r} passed {c.removeprefix('new_group ranks ')}"
                            for r, c in sorted(calls.items()))
        return CollectiveMismatchError(
            f"{self.op} (seq {self.seq}) of {comm.name}: the group does not exist on every member: new_group was "
            f"called with other ranks there ({listing}; this rank passed {list(comm.ranks)}); every rank must call "
            "new_group with the same ranks in the same order",
            calls={comm.rank: self.sig},
            seq=self.seq,
        )


def _report(task: asyncio.Task[Any]) -> None:
    """Log what a checker's task raised (its expected failures are handled inside it)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("mismatch checker task %r failed", task, exc_info=task.exception())


def parse_fingerprints(raw: bytes) -> tuple[dict[int, str], bool]:
    """The calls listed in a fingerprint key (group rank -> signature), and whether it is marked mismatched."""
    calls: dict[int, str] = {}
    marked = False
    for line in raw.decode(errors="replace").splitlines():
        rank, sep, call = line.partition("=")
        if line == "!":
            marked = True
        elif sep and rank.isdigit():
            calls[int(rank)] = call
    return calls, marked


def fingerprint_key(comm: GroupComm, seq: int) -> str:
    return f"{comm.transport.key_prefix}fp/{comm.gid}/{seq}"


def bad_key(comm: GroupComm) -> str:
    return _bad_key(comm.transport, comm.gid)


def _bad_key(transport: Transport, gid: Any) -> str:
    return f"{transport.key_prefix}fp/{gid}/bad"


NEW_GROUP_NOTE = "new_group"
"""Head of the note a member that disagreed on new_group's ranks leaves as the group's mismatch mark."""


async def note_disagreement(store: Any, transport: Transport, gid: Any, ranks: str) -> None:
    """This rank passed ``ranks`` to new_group #``gid`` where the others agreed on other ranks: mark the group,
    so that the fingerprint check of a member that has it fails its first collective (see :class:`FingerprintCheck`)."""
    note = f"{NEW_GROUP_NOTE}\n{transport.rank}=new_group ranks [{ranks}]\n".encode()
    await store.compare_set(_bad_key(transport, gid), b"", note)
