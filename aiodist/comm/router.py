"""Matching incoming messages to posted receives: the :class:`Router` of one rank.

The router is the driver of the pure routing tables (:mod:`.routing`): every
method passes its input to the tables, which return the receives it ended
(completions), and resolves them -- sets each receive's future, or calls its
``on_done`` -- only once the tables are consistent again. No asyncio, no
clock. Every receive ends exactly once, with a :class:`Delivery` or an
exception. What the tables match, and how, is in :mod:`.routing`; the records
are in :mod:`.receives`.

Bad input. What one peer may make this rank buffer is bounded: at most
``max_early_frames`` frames and ``max_early_bytes`` payload bytes waiting for
a receive (keyed, point-to-point and out-of-order ones together), per peer
(:meth:`Router.configure`). A frame that is impossible sets
:attr:`Match.violation` (and is dropped, never buffered), so that the
transport can close that peer's connection with the reason:

* a malformed header (no group, a keyed message without an integer sequence
  number first in its key, a point-to-point message without an integer number);
* a group id this rank will never know: not a non-negative int, more than
  :data:`~.admission.GROUP_WINDOW` ids beyond the newest group this rank
  allocated, a group this rank is not a member of (:meth:`Router.foreign_group`),
  or a known group the sender is not a member of (checked once
  ``check_groups`` is on);
* an impossible sequence number: a keyed message whose slot already holds a
  buffered message (a slot carries one message: a duplicate), one more than
  :data:`~.admission.SEQ_WINDOW` numbers beyond the newest sequence number
  this rank posted a receive for in that group, a point-to-point message
  whose number was already delivered (a duplicate) or is more than the window
  ahead of the next one expected;
* more than the per-peer budget of buffered frames or bytes.

Frames for a group destroyed here (:meth:`Router.forget_group`) are dropped
without blame: a peer may still be sending the rest of an operation that timed
out or was cancelled here. So are frames for a sequence number retired here
(:meth:`Router.retire`: every operation below it completed), counted per peer
(:meth:`Router.late_count`): a duplicate cannot be told from the leftover of a
mismatched or failed call. Neither is ever buffered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .admission import GROUP_WINDOW, MAX_EARLY_BYTES, MAX_EARLY_FRAMES, SEQ_WINDOW
from .receives import (
    Buffered,
    Completion,
    Delivery,
    ErrorFactory,
    Header,
    Match,
    Receive,
    delivery,
    freeze,
    resolve,
    resolve_all,
    size_mismatch,
)
from .routing import RouteTable

__all__ = [
    "GROUP_WINDOW",
    "MAX_EARLY_BYTES",
    "MAX_EARLY_FRAMES",
    "SEQ_WINDOW",
    "Buffered",
    "Completion",
    "Delivery",
    "ErrorFactory",
    "Header",
    "Match",
    "Receive",
    "Router",
    "freeze",
    "resolve",
    "size_mismatch",
]


class Router:
    """The routing tables of one rank (all its groups) and what resolves what they end.

    ``table`` is the :class:`~.routing.RouteTable` itself (read it in tests and
    diagnostics; change it only through this class). :meth:`settle
    <.routing.RouteTable.settle>` is the table's own: an operation ended here
    (what arrived for it that no receive took is dropped; one of those from a
    rank that called something else is returned: a mismatch).
    """

    __slots__ = ("table", "settle")

    def __init__(self) -> None:
        self.table = RouteTable()
        # (the table's own method: it ends no receive, so there is nothing to resolve; once per operation)
        self.settle: Callable[[Any, int, str, Any, int], tuple[int, str] | None] = self.table.settle

    def __repr__(self) -> str:
        return f"<Router {self.table!r}>"

    # ------------------------------------------------------------------ settings

    def configure(self, *, check_groups: bool, max_early_frames: int, max_early_bytes: int) -> None:
        """Vet group ids (``check_groups``) and bound what each peer may have buffered here."""
        self.table.check_groups = check_groups
        self.table.budgets.max_frames = max_early_frames
        self.table.budgets.max_bytes = max_early_bytes

    def note_group_id(self, gid: int) -> None:
        """Group id ``gid`` was allocated here (frames for ids up to the window beyond the newest are possible)."""
        self.table.groups.note_id(gid)

    def late_count(self, src: int) -> int:
        """How many frames of ``src`` were dropped for operations retired here."""
        return self.table.late_from.get(src, 0)

    # The settings as attributes too (what the transport and some tests set directly; configure(),
    # note_group_id() and late_count() are the interface).

    @property
    def check_groups(self) -> bool:
        return self.table.check_groups

    @check_groups.setter
    def check_groups(self, on: bool) -> None:
        self.table.check_groups = on

    @property
    def max_early_frames(self) -> int:
        return self.table.budgets.max_frames

    @max_early_frames.setter
    def max_early_frames(self, n: int) -> None:
        self.table.budgets.max_frames = n

    @property
    def max_early_bytes(self) -> int:
        return self.table.budgets.max_bytes

    @max_early_bytes.setter
    def max_early_bytes(self, n: int) -> None:
        self.table.budgets.max_bytes = n

    @property
    def newest_group(self) -> int:
        return self.table.groups.newest

    @newest_group.setter
    def newest_group(self, gid: int) -> None:
        self.table.groups.newest = gid

    @property
    def late_from(self) -> dict[int, int]:
        return self.table.late_from

    @property
    def dropped_destroyed(self) -> int:
        """Frames dropped because their group was destroyed here."""
        return self.table.dropped_destroyed

    @property
    def seq_window(self) -> int:
        return self.table.groups.seq_window

    @seq_window.setter
    def seq_window(self, n: int) -> None:
        self.table.groups.seq_window = n

    @property
    def group_window(self) -> int:
        return self.table.groups.group_window

    @group_window.setter
    def group_window(self, n: int) -> None:
        self.table.groups.group_window = n

    @property
    def known_groups(self) -> dict[Any, tuple[int, ...] | None]:
        return self.table.groups.known

    # ------------------------------------------------------------------ posting

    def post_keyed(self, receive: Receive) -> None:
        """Post a receive for (group, key, src); it ends at once if its message is here."""
        result = self.table.post_keyed(receive)
        if result is not None:
            resolve(receive, result)

    def post_p2p(self, receive: Receive) -> None:
        """Post a point-to-point receive for (group, tag) from ``src`` (``None``: any source)."""
        result = self.table.post_p2p(receive)
        if result is not None:
            resolve(receive, result)

    def unmatched_p2p(self, group: Any, src: int | None, tag: int, limit: int = 3) -> list[tuple[int, int]]:
        """Up to ``limit`` (global source, tag) of point-to-point messages of ``group`` waiting here that a receive
        from ``src`` (a global rank; None: any) with ``tag`` does not match: another tag, or another source with
        that tag (what a receive that timed out names; see :meth:`.p2p_routing.P2PTable.unmatched`)."""
        return self.table.unmatched_p2p(group, src, tag, limit)

    def cancel(self, receive: Receive) -> None:
        """Withdraw a receive (its waiter was cancelled). A keyed message that comes later is dropped; a
        point-to-point message arriving into it goes to the next receive once complete."""
        self.table.cancel(receive)
        if receive.withdrawn:
            _elsewhere(receive)

    def arriving(self, receive: Receive) -> bool:
        """Is point-to-point ``receive`` matched to a message whose payload is still arriving?"""
        return self.table.arriving(receive)

    def withdraw(self, receive: Receive) -> bool:
        """The waiter of point-to-point ``receive`` went away without its result: withdraw it. A message it
        got already (its future holds it) goes to the next receive instead, as does one still arriving
        into its buffer once complete: nothing is lost. Idempotent. True if it gave a message back."""
        if receive.withdrawn:
            return False
        self.cancel(receive)
        fut = receive.fut
        if (not receive.withdrawn and fut is not None and fut.done() and not fut.cancelled()
                and isinstance(fut.result(), Delivery)):
            receive.withdrawn = True
            resolve_all(self.table.give_back(receive, fut.result()))
            return True
        return False

    # ------------------------------------------------------------------ arrivals

    def route(self, src: int, header: Header, nbytes: int) -> Match:
        """Decide, when a frame's header arrived, which receive (if any) gets it."""
        m = self.table.route(src, header, nbytes)
        ended = m.ended
        if ended is not None:
            m.ended = None
            resolve_all(ended)
        return m

    def complete(self, m: Match, payload: memoryview | None) -> None:
        """The frame ``m`` was routed for has fully arrived with ``payload``."""
        r = m.receive
        if r is not None and not m.charged and m.header.get("t") == "m":
            # the usual case: routing took its receive off the tables already; nothing there changes
            if not r.done:
                r.done = True
                resolve(r, delivery(r, m.src, m.header, payload, m.nbytes))
            return
        resolve_all(self.table.complete(m, payload))

    def release(self, m: Match) -> None:
        """Forget that ``m`` was to be buffered (it is about to be routed again)."""
        self.table.release(m)

    def claim(self, m: Match) -> bool:
        """A receive posted since ``m`` was routed to be buffered takes it (its payload still arriving): True.

        Then ``m.receive`` is that receive and :attr:`Match.sink` its buffer
        (the rest of the payload can land there). A receive that refuses the
        frame ends now with its error.
        """
        took = self.table.claim(m)
        ended = m.ended
        if ended is not None:
            m.ended = None
            resolve_all(ended)
        return took

    def abort(self, m: Match, exc: BaseException) -> None:
        """The frame ``m`` will never complete (its connection broke mid-payload)."""
        result = self.table.abort(m, exc)
        if result is not None:
            assert m.receive is not None
            resolve(m.receive, result)

    # ------------------------------------------------------------------ failures and groups

    def fail_source(self, src: int, factory: ErrorFactory) -> None:
        """Fail every receive waiting for ``src`` now and later (buffered messages still deliver)."""
        resolve_all(self.table.fail_source(src, factory))

    def fail_seq(self, group: Any, seq: Any, src: int | None, factory: ErrorFactory, *, void: bool = False) -> None:
        """Fail the keyed receives of operation ``seq`` of ``group`` from ``src`` (None: from every source), now and later.

        Used when a rank reported that the call at that sequence number does not match, or failed
        there: the whole operation is void, so receives from every source fail at once. ``void``:
        even a receive whose message is here already (a member timed out of the operation).
        """
        resolve_all(self.table.fail_seq(group, seq, src, factory, void=void))

    def fail_from(self, group: Any, seq: int, error: Callable[[], BaseException]) -> None:
        """Fail the keyed receives of every operation of ``group`` at ``seq`` or later, from every source, now and later.

        Used when a rank reported a mismatch at ``seq``: the group is unusable from there on, so an
        operation this rank started after ``seq`` (its own part of ``seq`` may have completed
        without noticing, e.g. a broadcast root) fails at once instead of waiting for ranks that gave up.
        ``error`` makes a fresh exception for each receive.
        """
        resolve_all(self.table.fail_from(group, seq, error))

    def voided(self, group: Any, seq: int) -> BaseException | None:
        """Why operation ``seq`` of ``group`` is void (a :meth:`fail_from` at ``seq`` or before), or None.

        For an operation that failed otherwise first (a send to a peer that left
        after the mismatch): the mismatch is the cause to report.
        """
        ff = self.table.failures.void_since(group, seq)
        return None if ff is None else ff.error()

    @property
    def voids(self) -> dict[tuple[Any, Any], Any]:
        """The operations (group, seq) void here even where every message they need came (a member timed
        out of it, or failed it on a peer's failure and said so): the table itself, for a hot path to test
        for emptiness; read it with :meth:`void_error`."""
        return self.table.failures.void

    def void_error(self, group: Any, seq: int) -> BaseException | None:
        """Why operation ``seq`` of ``group`` is void here (see :attr:`voids`), or None: a fresh error."""
        factory = self.table.failures.void.get((group, seq))
        return None if factory is None else factory(None)  # type: ignore[arg-type]  # (they ignore the receive)

    def waiting_ops(self, member: Callable[[Any], bool]) -> list[tuple[Any, int]]:
        """The collectives (group, seq) with a receive waiting here, in the groups for which ``member(group)``
        is true, oldest first (breaking those groups fails every one of them)."""
        ops: dict[tuple[Any, int], None] = {}
        for r in self.table.pending():
            if r.tag is None and r.key and type(r.key[0]) is int and (r.group, r.key[0]) not in ops and member(r.group):
                ops[(r.group, r.key[0])] = None
        return list(ops)

    def reported(self, group: Any, seq: int) -> BaseException | None:
        """What another member reported about operation ``seq`` of ``group`` (its call failed there, or did not
        match), if one did: a fresh error, or None. (Only reports void an operation from every source.)"""
        factory = self.table.failures.seq.get((group, seq, None))
        return None if factory is None else factory(None)  # type: ignore[arg-type]  # (reports ignore the receive)

    def fail_group(self, group: Any, factory: ErrorFactory) -> None:
        """Fail every receive of ``group`` now and later (the group is broken)."""
        resolve_all(self.table.fail_group(group, factory))

    def forget_group(self, group: Any, factory: ErrorFactory) -> None:
        """Drop everything of a destroyed group; its pending receives fail with ``factory``."""
        resolve_all(self.table.forget_group(group, factory))

    def know_group(self, group: Any, members: tuple[int, ...] | None) -> None:
        """``group`` exists here with these members (global ranks; None: do not check senders)."""
        self.table.know_group(group, members)

    def foreign_group(self, group: Any) -> None:
        """This rank is not a member of ``group``: a message for it is bad input."""
        self.table.groups.foreign[group] = None

    def retire(self, group: Any, floor: int) -> None:
        """Every operation of ``group`` below sequence number ``floor`` completed here.

        A later message for one of them is dropped (never buffered) and counted (see
        :meth:`late_count`): it is a duplicate, or the leftover of a peer that called
        another collective at that seq (a mismatch, reported by other means) or of an
        operation that failed here; the cases cannot be told apart here, so nobody is
        blamed for it. What the tables kept for those operations is dropped.
        """
        self.table.retire(group, floor)

    def discard_source(self, src: int) -> None:
        """Drop every message buffered from ``src`` (it sent bad input: nothing of it is trusted)."""
        self.table.discard_source(src)

    # ------------------------------------------------------------------ queries

    def vet(self, src: int, group: Any, seq: Any) -> str | None:
        """Why a message from ``src`` for ``seq`` of ``group`` is impossible (None: it is possible)."""
        t = self.table
        bad = t.groups.vet_group(group, src) if t.check_groups else None
        return bad if bad is not None else t.groups.vet_seq(group, (seq,))

    def knows(self, group: Any) -> bool:
        """Is ``group`` one of this rank's groups (created here, not destroyed)?"""
        return group in self.table.groups.known

    def destroyed(self, group: Any) -> bool:
        """Was ``group`` destroyed here (:meth:`forget_group`)?"""
        return group in self.table.groups.destroyed

    def pending(self) -> list[Receive]:
        """Receives still waiting, in posting order per kind (for diagnostics)."""
        return self.table.pending()

    def buffered(self, src: int) -> tuple[int, int]:
        """(frames, bytes) buffered from ``src`` that no receive took yet."""
        return self.table.budgets.of(src)

    def conflicting_arrival(self, group: Any, seq: Any, sig: str, sources: Any = None) -> tuple[int, str] | None:
        """A message of ``group`` at ``seq`` buffered here (no receive took it), from a rank that called something else.

        Returns (its global rank, its signature), or None; the lowest such rank in
        ``sources`` (default: all; any container: a dict or a range for a large group).
        Costs O(messages that came early for that seq), never O(group size).
        """
        return self.table.conflicting_arrival(group, seq, sig, sources)


def _elsewhere(r: Receive) -> None:
    """``r`` was withdrawn while its message arrived into its buffer: the rest of that message goes into the
    connection's own memory, with what arrived copied there (its buffer is the caller's again, and the next
    receive gets the message as sent, not whatever the caller wrote into the buffer meanwhile)."""
    arriving, r.arriving = r.arriving, None
    if arriving is not None:
        conn, header = arriving
        conn.redirect_payload(header)
