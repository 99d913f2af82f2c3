"""The routing tables of one rank, pure: receives and frames in, completions out.

No asyncio, no clock, no callbacks: a method that ends receives marks them
done and *returns* them as :class:`~.receives.Completion` records (or, for a
single receive, its result); the :class:`~.router.Router` resolves them once
the method has returned and the tables are consistent again. So a waiter
that posts or cancels a receive from its callback never finds the tables
half-changed.

Two kinds of messages travel between the ranks of a job:

* **keyed** (``"m"``): a collective's message, routed by its *slot* (group,
  key, source). A slot carries at most one message, so the first receive
  posted for it gets it, whether it is posted before or after the message
  arrives. The key starts with the operation's sequence number.
* **point-to-point** (``"p"``): routed by (group, tag), in the order they
  were sent per source (:mod:`.p2p_routing`, which this table drives).

Matching happens when a frame's *header* arrives (:meth:`RouteTable.route`),
so that a receive posted in time gets the payload written straight into its
buffer; :meth:`RouteTable.complete` finishes the frame once its payload is in.
Messages nobody waits for yet are buffered, within per-peer budgets, and a
frame that is impossible is refused (see :mod:`.router` for the rules and
:mod:`.admission` for the bookkeeping).

The tables, and what ties them together:

* ``_posted``: the keyed receives waiting, by slot;
* ``ops``: the keyed messages waiting, by slot and by operation, and this
  rank's call at each operation until it is settled (:meth:`RouteTable.settle`)
  or retired (:class:`~.op_book.OpBook`, which keeps their budgets);
* ``_incoming``: keyed frames routed to be buffered whose payload is on its
  way, and ``_abandoned``: slots whose receive was withdrawn (their message
  is dropped when it comes, or when the floor passes its operation);
* ``p2p``: the point-to-point receives and messages (:class:`~.p2p_routing.P2PTable`);
* ``failures``, what ends receives at once (:class:`~.failures.Failures`), and
  ``budgets`` (:class:`~.admission.Budgets`): every buffered frame is charged
  to its sender while it is buffered or on its way to be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .admission import Budgets, GroupBook
from .failures import Failures
from .op_book import OpBook, Slot
from .p2p_routing import P2PTable
from .receives import (
    Buffered,
    Completion,
    Delivery,
    ErrorFactory,
    Header,
    Match,
    Receive,
    Result,
    deliver,
    delivery,
    end,
    ended,
    freeze,
    refused,
    veto,
    violate,
)

_SEQUENCES = (tuple, list)


class RouteTable:
    """The routing tables of one rank, all its groups (see the module doc)."""

    __slots__ = ("groups", "budgets", "failures", "check_groups", "dropped_destroyed", "late_from", "_posted",
                 "_incoming", "_abandoned", "ops", "p2p")

    def __init__(self) -> None:
        self.groups = GroupBook()
        self.budgets = Budgets()
        self.failures = Failures()
        self.check_groups = False  # the transport turns this on: group ids are then vetted
        self.dropped_destroyed = 0  # frames dropped because their group was destroyed here
        self.late_from: dict[int, int] = {}  # per peer: frames dropped for operations retired here
        self._posted: dict[Slot, Receive] = {}
        self._incoming: dict[Slot, None] = {}
        self._abandoned: dict[Slot, None] = {}
        self.ops = OpBook(self.budgets)
        self.p2p = P2PTable(self.budgets, self.failures)

    def __repr__(self) -> str:
        return f"<RouteTable posted={len(self._posted)} arrived={len(self.ops.arrived)} {self.p2p!r}>"

    # ------------------------------------------------------------------ posting

    def post_keyed(self, r: Receive) -> Result | None:
        """Post a receive for (group, key, src): its result if it ends at once (its message is here), else None."""
        assert r.src is not None
        key = r.key
        if type(key) is not tuple:
            key = r.key = freeze(key)
        group = r.group
        slot = (group, key, r.src)
        try:
            posted_twice = slot in self._posted
        except TypeError:  # a tuple key with something unhashable inside
            key = r.key = freeze(key)
            slot = (group, key, r.src)
            posted_twice = slot in self._posted
        seq = key[0] if key else None
        top = self.groups.top_seq
        if type(seq) is int and seq > top.get(group, -1):  # this rank reached ``seq``: the window moves
            top[group] = seq
        if posted_twice:
            return end(r, RuntimeError(f"two receives posted for the same message {slot!r}"))
        ops = self.ops
        if ops.arrived:  # (nothing buffered: the usual case, no lookups)
            void = self.failures.void and self.failures.void.get((group, seq))
            if void:  # a member timed out of this operation: it is void, though messages of it came
                return end(r, void(r))  # before the news (they are left to settle)
            a = ops.pop(slot)
            if a is not None:
                return end(r, deliver(r, a.src, a.header, a.payload, a.nbytes))
        sig = r.sig
        if self.failures.active:
            f = self.failures.factory_for(r)
            if f is not None:
                # A message of this operation here from a rank that called something else: the mismatch,
                # not a failure or departure it caused (the rank sent it, then left), is what to report.
                hit = ops.other_call(group, seq, sig, None) if sig is not None and key and r.check else None
                if hit is not None and r.check is not None:
                    return end(r, r.check({"o": hit[1]}, hit[0], 0) or RuntimeError("mismatch"))
                return end(r, f(r))
        if sig is not None and key:
            if ops.seqs:
                arrivals = ops.seqs.get((group, seq))
                first = arrivals.first.get(r.src) if arrivals is not None else None
                # (taken already: by a receive of the same call, or one that failed on it)
                other = ops.arrived.get(first) if first is not None else None
                if other is not None and other.header.get("o") != sig and r.check is not None:
                    return end(r, r.check(other.header, r.src, other.nbytes) or RuntimeError("mismatch"))
            ops.calls.setdefault((group, seq), sig)
        self._posted[slot] = r
        return None

    def post_p2p(self, r: Receive) -> Result | None:
        """Post a point-to-point receive for (group, tag) from ``src`` (None: any): its result if it ends at once."""
        return self.p2p.post(r)

    def unmatched_p2p(self, group: Any, src: int | None, tag: int, limit: int) -> list[tuple[int, int]]:
        """See :meth:`.p2p_routing.P2PTable.unmatched`."""
        return self.p2p.unmatched(group, src, tag, limit)

    def cancel(self, r: Receive) -> None:
        """Withdraw a receive (its waiter gave up). A keyed message that comes later is dropped."""
        if r.done:
            return
        r.done = True
        if r.tag is None:
            assert r.src is not None
            slot = (r.group, r.key, r.src)
            if self._posted.get(slot) is r:
                del self._posted[slot]
                self._abandoned[slot] = None
            # else: matched already; its frame is on its way and is dropped when it completes
        else:
            self.p2p.cancel(r)

    def arriving(self, r: Receive) -> bool:
        """Is point-to-point receive ``r`` matched to a message whose payload is still arriving?"""
        return r.tag is not None and self.p2p.arriving(r)

    def give_back(self, r: Receive, d: Delivery) -> list[Completion]:
        """Point-to-point receive ``r`` got ``d`` but its waiter went away first: the next receive gets it."""
        out: list[Completion] = []
        self.p2p.give_back(r, d.src, d.header, d.payload, d.nbytes, out)
        return out

    # ------------------------------------------------------------------ arrivals

    def route(self, src: int, header: Header, nbytes: int) -> Match:
        """Decide, when a frame's header arrived, which receive (if any) gets it.

        Receives this frame ends at once (it is another call than they expect) are in ``Match.ended``.
        """
        m = Match(src, header, nbytes)
        kind = header.get("t")
        if kind == "p":
            return self._route_p2p(m, header.get("g"))
        if kind != "m":
            m.drop = True
            return m
        g = header.get("g")
        k: Any = header.get("k")
        book = self.groups
        span = book.span.get(g)
        if (
            span is None
            or src not in span
            or type(k) not in _SEQUENCES
            or not k
            or type(k[0]) is not int
            or not 0 <= k[0] <= book.top_seq.get(g, 0) + book.seq_window
        ):  # not a known contiguous group with a sane seq within the window: the full vetting
            bad = book.vet_group(g, src) if self.check_groups else None
            if bad is None:
                bad = book.vet_seq(g, k)
            if bad is not None:
                return violate(m, bad)
            if g in book.destroyed:
                return self._drop_destroyed(m)
        if book.floor and k[0] < book.floor.get(g, 0):
            self.late_from[src] = self.late_from.get(src, 0) + 1
            m.drop = m.late = True
            return m
        slot = m.slot = (g, tuple(k) if type(k) is list else k, src)  # (freeze's common case: a flat key)
        try:
            r = self._posted.pop(slot, None)
        except TypeError:  # a nested key
            slot = m.slot = (g, freeze(k), src)
            r = self._posted.pop(slot, None)
        if r is not None:
            err = veto(r, src, header, nbytes)
            if err is None:
                m.receive = r
            else:
                refused(m, r, err)
        elif slot in self._abandoned:
            del self._abandoned[slot]
            m.drop = True
        else:
            ops = self.ops
            if slot in ops.arrived or slot in self._incoming:
                return violate(m, f"a second message for {_describe(slot)} (a slot carries one message)")
            if ops.calls:
                m.ended = self._fail_conflicting(src, header, nbytes) or None
            if self._admit(m):
                self._incoming[slot] = None
        return m

    def _route_p2p(self, m: Match, g: Any) -> Match:
        bad = self.groups.vet_group(g, m.src) if self.check_groups else None
        if bad is not None:
            return violate(m, bad)
        if g in self.groups.destroyed:
            return self._drop_destroyed(m)
        self.p2p.route(m, self.groups.seq_window)
        if m.receive is None and not m.drop:
            self._admit(m)
        return m

    def complete(self, m: Match, payload: memoryview | None) -> list[Completion]:
        """The frame ``m`` was routed for has fully arrived with ``payload``: the receives it ends."""
        out: list[Completion] = []
        kind = m.header.get("t")
        if kind == "m":
            if m.drop:
                self._uncharge(m)
            else:
                self._complete_keyed(m, payload, out)
            return out
        self._uncharge(m)  # (charged again if it is buffered after all)
        if kind == "p":
            self.p2p.complete(m, payload, out)
        return out

    def release(self, m: Match) -> None:
        """Forget that ``m`` was to be buffered (it is about to be routed again)."""
        self._uncharge(m)

    def claim(self, m: Match) -> bool:
        """``m`` was routed to be buffered and its payload is still arriving: does a receive posted since take it?

        True: ``m.receive`` is that receive (taken off the tables, ``m`` no longer
        charged). A receive that refuses it (another call, another size) ends
        with its error in ``m.ended`` and the frame is dropped. Point-to-point:
        only a frame next in its stream's order.
        """
        if m.receive is not None or m.drop:
            return False
        kind = m.header.get("t")
        if kind == "m":
            r = self._posted.pop(m.slot, None) if self._posted else None
        elif kind == "p" and m.in_order:
            r = self.p2p.take(m)
        else:
            return False
        if r is None:
            return False
        self._uncharge(m)
        err = veto(r, m.src, m.header, m.nbytes)
        if err is not None:
            refused(m, r, err)
            return False
        m.receive = r
        return True

    def abort(self, m: Match, exc: BaseException) -> Result | None:
        """The frame ``m`` will never complete (its connection broke mid-payload): its receive's result, if any."""
        self._uncharge(m)
        return end(m.receive, exc) if m.receive is not None else None

    def _complete_keyed(self, m: Match, payload: memoryview | None, out: list[Completion]) -> None:
        r = m.receive
        if r is not None:
            self._uncharge(m)
            ended(r, delivery(r, m.src, m.header, payload, m.nbytes), out)
            return
        slot = m.slot if m.slot is not None else _slot_of(m)
        r = self._posted.pop(slot, None)  # (posted while the payload was on its way)
        if r is not None:
            self._uncharge(m)
            ended(r, deliver(r, m.src, m.header, payload, m.nbytes), out)
        elif slot in self._abandoned:
            self._uncharge(m)
            del self._abandoned[slot]
        elif self.groups.floor and slot[1][0] < self.groups.floor.get(slot[0], 0):
            self._uncharge(m)  # its operation completed here meanwhile (see retire)
        else:  # buffered: its charge (taken when routed) now counts the buffered message
            charged, m.charged = m.charged, False
            if charged:
                self._incoming.pop(slot, None)
            self.ops.put(slot, Buffered(m.src, m.header, payload, m.nbytes), charged=charged)

    # ------------------------------------------------------------------ failures

    def fail_source(self, src: int, factory: ErrorFactory) -> list[Completion]:
        """Fail every receive waiting for ``src`` now and later (buffered messages still deliver)."""
        self.failures.add_source(src, factory)
        out = self._fail_posted(lambda r: r.src == src, factory)
        self.p2p.fail(lambda r: r.src == src, factory, out)
        return out

    def fail_seq(self, group: Any, seq: Any, src: int | None, factory: ErrorFactory, *,
                 void: bool = False) -> list[Completion]:
        """Fail the keyed receives of operation ``seq`` of ``group`` from ``src`` (None: every source), now and later
        (``void``: even those whose message is here already)."""
        self.failures.add_seq(group, seq, src, factory, void=void)
        return self._fail_posted(
            lambda r: r.group == group and (src is None or r.src == src) and bool(r.key) and r.key[0] == seq, factory
        )

    def fail_from(self, group: Any, seq: int, error: Callable[[], BaseException]) -> list[Completion]:
        """Fail the keyed receives of every operation of ``group`` at ``seq`` or later, from every source, now and later."""
        ff = self.failures.add_since(group, seq, error)
        if ff is None:
            return []
        return self._fail_posted(
            lambda r: r.group == group and bool(r.key) and type(r.key[0]) is int and r.key[0] >= seq, ff.factory
        )

    def fail_group(self, group: Any, factory: ErrorFactory) -> list[Completion]:
        """Fail every receive of ``group`` now and later (the group is broken)."""
        self.failures.add_group(group, factory)
        out = self._fail_posted(lambda r: r.group == group, factory)
        self.p2p.fail(lambda r: r.group == group, factory, out)
        return out

    def _fail_posted(self, which: Callable[[Receive], bool], factory: ErrorFactory) -> list[Completion]:
        """End the posted keyed receives ``which`` selects with ``factory``'s error."""
        out: list[Completion] = []
        for slot in [s for s, r in self._posted.items() if which(r)]:
            r = self._posted.pop(slot)
            ended(r, factory(r), out)
        return out

    def _fail_conflicting(self, src: int, header: Header, nbytes: int) -> list[Completion]:
        """A message no receive waits for: fail the receives of its seq that expect another call."""
        k = header.get("k")
        sig = header.get("o")
        if not k or sig is None:
            return []
        seq = k[0]
        mine = self.ops.calls.get((header.get("g"), seq if type(seq) is int else freeze(seq)))
        if mine is None or mine == sig:
            return []
        out: list[Completion] = []
        for slot in [s for s, r in self._posted.items() if _conflicts(r, src, header)]:
            r = self._posted.pop(slot)
            assert r.check is not None
            ended(r, r.check(header, src, nbytes) or RuntimeError("mismatch"), out)
        return out

    # ------------------------------------------------------------------ groups

    def know_group(self, group: Any, members: tuple[int, ...] | None) -> None:
        """``group`` exists here with these members (global ranks; None: do not check senders)."""
        self.groups.know(group, members)

    def forget_group(self, group: Any, factory: ErrorFactory) -> list[Completion]:
        """Drop everything of a destroyed group; its pending receives fail with ``factory``."""
        out = self.fail_group(group, factory)
        self.ops.forget_group(group)
        for slot in [s for s in self._abandoned if s[0] == group]:
            del self._abandoned[slot]
        self.failures.forget_group(group)
        self.p2p.forget_group(group)
        self.groups.forget(group)
        return out

    def settle(self, group: Any, seq: int, sig: str, sources: Any, floor: int) -> tuple[int, str] | None:
        """Operation ``seq`` of ``group`` (this rank called ``sig``) ended here, and so did every one below ``floor``.

        Forgets the operation and drops what arrived for it that no receive took
        (see :meth:`retire` for the floor). Returns one of those messages that
        came from a rank that called something else -- (its global rank, its
        signature), the lowest such rank in ``sources`` (any container) -- or
        None: a mismatch this rank's part of the call completed without.
        """
        ops = self.ops
        other = ops.settle(group, seq, sig, sources)
        floors = self.groups.floor
        if floor > floors.get(group, 0):  # (retire(), without a call when there is nothing to forget)
            floors[group] = floor
            if self._abandoned or ops.seqs or ops.calls or self.failures.seq:
                self._forget_below(group, floor)
        return other

    def retire(self, group: Any, floor: int) -> None:
        """Every operation of ``group`` below sequence number ``floor`` completed here.

        A later message for one of them is dropped (never buffered) and counted in
        ``late_from``. What the tables still keep for them goes: withdrawn slots
        whose message never came, messages nobody took, failures of those seqs.
        """
        floors = self.groups.floor
        if floor > floors.get(group, 0):
            floors[group] = floor
            self._forget_below(group, floor)

    def _forget_below(self, group: Any, floor: int) -> None:
        """Forget what the tables keep for the operations of ``group`` below ``floor`` (see :meth:`retire`)."""
        if self._abandoned:
            for slot in [s for s in self._abandoned if s[0] == group and type(s[1][0]) is int and s[1][0] < floor]:
                del self._abandoned[slot]
        self.ops.forget_below(group, floor)
        if self.failures.seq:
            self.failures.forget_seqs(group, floor)

    def discard_source(self, src: int) -> None:
        """Drop every message buffered from ``src`` (it sent bad input: nothing of it is trusted)."""
        self.ops.discard_source(src)
        self.p2p.discard_source(src)

    # ------------------------------------------------------------------ queries

    def pending(self) -> list[Receive]:
        """Receives still waiting, in posting order per kind (for diagnostics)."""
        return [*self._posted.values(), *self.p2p.pending()]

    def conflicting_arrival(self, group: Any, seq: Any, sig: str, sources: Any = None) -> tuple[int, str] | None:
        """A message of ``group`` at ``seq`` buffered here from a rank that called something else (:meth:`.OpBook.other_call`)."""
        return self.ops.other_call(group, seq, sig, sources)

    def buffered_groups(self, src: int) -> list[tuple[Any, tuple[int, int]]]:
        """The groups of the messages from ``src`` buffered here: [(group, (frames, bytes))] (for errors only)."""
        acc: dict[Any, list[int]] = {}
        for a in [*self.ops.buffered_from(src), *self.p2p.buffered_from(src)]:
            c = acc.setdefault(a.header.get("g"), [0, 0])
            c[0] += 1
            c[1] += a.nbytes
        return sorted(((g, (c[0], c[1])) for g, c in acc.items()), key=repr)

    # ------------------------------------------------------------------ invariants

    def _admit(self, m: Match) -> bool:
        """``m`` will probably be buffered: charge it to its sender now (its payload is on its way), or refuse it."""
        if self.budgets.take(m.src, m.nbytes):
            m.charged = True
            return True
        frames, nbytes = self.budgets.of(m.src)
        where = ", ".join(f"group {g!r}: {f} frames, {b} bytes" for g, (f, b) in self.buffered_groups(m.src))
        violate(
            m, f"too many messages nobody waits for: {frames} frames and {nbytes} bytes buffered "
            f"(limits {self.budgets.max_frames} frames, {self.budgets.max_bytes} bytes per peer; {where or 'none yet'})")
        return False

    def _uncharge(self, m: Match) -> None:
        """``m`` no longer counts in its sender's budget (if it did)."""
        if not m.charged:
            return
        m.charged = False
        self.budgets.refund(m.src, m.nbytes)
        if self._incoming and m.header.get("t") == "m":
            self._incoming.pop(m.slot if m.slot is not None else _slot_of(m), None)

    def _drop_destroyed(self, m: Match) -> Match:
        self.dropped_destroyed += 1
        m.drop = True
        return m


def _conflicts(r: Receive, src: int, header: Header) -> bool:
    """Is ``header`` (from ``src``) another call at the same sequence number as keyed receive ``r``?"""
    if r.sig is None or r.src != src or r.check is None or header.get("t") != "m":
        return False
    if header.get("g") != r.group or header.get("o") == r.sig:
        return False
    k: Any = header.get("k")
    return bool(k) and bool(r.key) and freeze(k[0]) == r.key[0]


def _slot_of(m: Match) -> Slot:
    return (m.header.get("g"), freeze(m.header.get("k")), m.src)


def _describe(slot: Slot) -> str:
    g, k, src = slot
    return f"group {g!r}, key {k!r} from rank {src}"
