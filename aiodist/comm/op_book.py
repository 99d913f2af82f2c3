"""The keyed messages buffered before their receive, and what each operation has here: pure bookkeeping.

A collective's message (``"m"``) that arrives before the receive for its slot
(group, frozen key, source) waits in :attr:`OpBook.arrived`, charged to its
sender's budget (:class:`~.admission.Budgets`) for as long as it does. Each
one is filed under its *operation* (group, seq) too, in a :class:`SeqArrivals`,
and :attr:`OpBook.calls` keeps the call signature of this rank's receives at
each operation. Together they answer, without a scan, whether a rank called
something else at a sequence number (:meth:`OpBook.other_call`), and they let
what nobody took go when its operation ends (:meth:`OpBook.settle`,
:meth:`OpBook.forget_below`).

No asyncio, no clock, no receives: the :class:`~.routing.RouteTable` owns one
book, matches receives against it and drives it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .admission import Budgets
from .receives import Buffered

Slot = tuple[Any, Any, int]
"""A keyed message's (group, frozen key, global source rank)."""
Op = tuple[Any, Any]
"""A keyed operation: (group, seq)."""


class SeqArrivals:
    """What arrived for one operation (group, seq) before its receive: kept until the operation is settled.

    ``slots``: the slots buffered (those still in the book when the operation
    ends were never taken: leftovers); ``first``: per source, the slot of its
    first signed message (its header names the sender's call). Slots only: a
    message's payload goes with the message when a receive takes it.
    """

    __slots__ = ("first", "slots")

    def __init__(self) -> None:
        self.first: dict[int, Slot] = {}
        self.slots: list[Slot] = []

    def __repr__(self) -> str:
        return f"<SeqArrivals sources={sorted(self.first)} slots={len(self.slots)}>"


class OpBook:
    """The keyed messages buffered here, by slot and by operation, and this rank's call per operation.

    ``arrived``: slot -> the message waiting there (change it only through
    :meth:`put` and :meth:`pop`, which keep the budgets and ``seqs``);
    ``seqs``: operation -> :class:`SeqArrivals`; ``calls``: operation -> the
    signature of the call this rank's receives made (set by the table when a
    receive is posted). An operation stays in ``seqs`` and ``calls`` until it
    is settled or falls below its group's floor.
    """

    __slots__ = ("budgets", "arrived", "seqs", "calls")

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets
        self.arrived: dict[Slot, Buffered] = {}
        self.seqs: dict[Op, SeqArrivals] = {}
        self.calls: dict[Op, str] = {}

    def __repr__(self) -> str:
        return f"<OpBook arrived={len(self.arrived)} seqs={len(self.seqs)} calls={len(self.calls)}>"

    # ------------------------------------------------------------------ messages

    def put(self, slot: Slot, a: Buffered, *, charged: bool) -> None:
        """Buffer ``a`` at ``slot`` (``charged``: it is counted in its sender's budget already)."""
        if slot in self.arrived:  # (the table refuses a second message for a buffered slot)
            self.pop(slot)
        self.arrived[slot] = a
        if not charged:
            self.budgets.charge(slot[2], a.nbytes)
        key = slot[1]
        if key:
            op = (slot[0], key[0])
            arrivals = self.seqs.get(op)
            if arrivals is None:
                arrivals = self.seqs[op] = SeqArrivals()
            arrivals.slots.append(slot)
            if a.header.get("o") is not None and slot[2] not in arrivals.first:
                arrivals.first[slot[2]] = slot

    def pop(self, slot: Slot) -> Buffered | None:
        """Take the message buffered at ``slot`` out of the book (refunding its sender)."""
        a = self.arrived.pop(slot, None)
        if a is not None:
            self.budgets.refund(slot[2], a.nbytes)
        return a

    def buffered_from(self, src: int) -> Iterator[Buffered]:
        """The messages from ``src`` buffered here."""
        return (a for slot, a in self.arrived.items() if slot[2] == src)

    def discard_source(self, src: int) -> None:
        """Drop every message buffered from ``src``."""
        for slot in [s for s in self.arrived if s[2] == src]:
            self.pop(slot)

    # ------------------------------------------------------------------ operations

    def other_call(self, group: Any, seq: Any, sig: str, sources: Any) -> tuple[int, str] | None:
        """A message of operation (``group``, ``seq``) still buffered here from a rank whose call is not ``sig``.

        Returns (its global rank, its signature) -- the lowest such rank in
        ``sources`` (None: all; any container) -- or None. Costs O(messages
        that came early for that operation).
        """
        arrivals = self.seqs.get((group, seq))
        return self._other_call(arrivals, sig, sources) if arrivals is not None else None

    def settle(self, group: Any, seq: Any, sig: str, sources: Any) -> tuple[int, str] | None:
        """Operation (``group``, ``seq``) ended here: forget it and drop what arrived for it that nobody took.

        Returns one of those messages from a rank that called something else, as :meth:`other_call` does.
        """
        op = (group, seq)
        self.calls.pop(op, None)
        arrivals = self.seqs.pop(op, None)
        if arrivals is None:
            return None
        other = self._other_call(arrivals, sig, sources)
        self._drop_leftovers(arrivals)
        return other

    def forget_below(self, group: Any, floor: int) -> None:
        """Forget the operations of ``group`` below sequence number ``floor``, dropping their leftovers."""
        if self.seqs:
            for op in [op for op in self.seqs if op[0] == group and type(op[1]) is int and op[1] < floor]:
                self._drop_leftovers(self.seqs.pop(op))
        if self.calls:
            for op in [op for op in self.calls if op[0] == group and type(op[1]) is int and op[1] < floor]:
                del self.calls[op]

    def forget_group(self, group: Any) -> None:
        """Drop everything of a destroyed group."""
        for slot in [s for s in self.arrived if s[0] == group]:
            self.pop(slot)
        for op in [op for op in self.calls if op[0] == group]:
            del self.calls[op]
        for op in [op for op in self.seqs if op[0] == group]:
            del self.seqs[op]

    def _drop_leftovers(self, arrivals: SeqArrivals) -> None:
        """Drop the messages of a finished operation that no receive took."""
        for slot in arrivals.slots:
            if slot in self.arrived:
                self.pop(slot)

    def _other_call(self, arrivals: SeqArrivals, sig: str, sources: Any) -> tuple[int, str] | None:
        """The lowest source (in ``sources``, if given) of a message still buffered in ``arrivals`` whose call is not ``sig``."""
        other: tuple[int, str] | None = None
        for slot in arrivals.slots:
            a = self.arrived.get(slot)
            if a is None or (sources is not None and a.src not in sources):
                continue
            theirs = a.header.get("o")
            if theirs is not None and theirs != sig and (other is None or a.src < other[0]):
                other = (a.src, theirs)
        return other
