"""The point-to-point half of the routing tables, pure: receives and frames in, completions out.

A point-to-point message (``"p"``) is routed by (group, tag); a receive names
a source or accepts any. Receives are matched in the order they were posted,
and messages from one source with one tag in the order they were sent: each
carries the sender's per-(group, destination, tag) number ``"n"``, so the
order holds even if the sender's tasks ran in another order. A message whose
number is ahead of the next one expected is *held* until the ones before it
came. A *skip* frame for a number (its send gave up, perhaps before the
message was queued: :func:`.frames.p2p_skip`) stands in for that message if
the message did not come before it, and delivers nothing.

Like :mod:`.routing`, of which it is a part, it never resolves a receive: it
marks them done and hands them back as :class:`~.receives.Completion`
records. Group ids are vetted and budgets checked by :class:`~.routing.RouteTable`
before a frame gets here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .admission import Budgets
from .failures import Failures
from .frames import SKIP
from .receives import (
    Buffered,
    Completion,
    ErrorFactory,
    Match,
    Receive,
    Result,
    deliver,
    delivery,
    end,
    ended,
    refused,
    veto,
    violate,
)

Stream = tuple[Any, int, int]
"""(group, global source rank, tag): one ordered stream of point-to-point messages."""


class P2PQueue:
    """The point-to-point receives posted and messages arrived for one (group, tag), oldest first."""

    __slots__ = ("posted", "arrived")

    def __init__(self) -> None:
        self.posted: list[Receive] = []
        self.arrived: list[Buffered] = []

    def __repr__(self) -> str:
        return f"<P2PQueue posted={len(self.posted)} arrived={len(self.arrived)}>"


class P2PTable:
    """Point-to-point receives and messages of one rank, per (group, tag) (see the module doc).

    ``budgets``: charged for every message held or buffered here;
    ``failures``: what ends a receive posted for a failed source or group.
    """

    __slots__ = ("budgets", "failures", "_queues", "_next_n", "_held")

    def __init__(self, budgets: Budgets, failures: Failures) -> None:
        self.budgets = budgets
        self.failures = failures
        self._queues: dict[tuple[Any, int], P2PQueue] = {}
        # (group, source) -> tag -> the next number expected: nested, so that a tag costs one small entry
        # (~0.1 KiB; a program may use a new tag per message), not a tuple key of its own
        self._next_n: dict[tuple[Any, int], dict[int, int]] = {}
        self._held: dict[Stream, dict[int, Buffered]] = {}

    def __repr__(self) -> str:
        return f"<P2PTable queues={len(self._queues)} held={len(self._held)}>"

    def _queue(self, group: Any, tag: int) -> P2PQueue:
        q = self._queues.get((group, tag))
        if q is None:
            q = self._queues[(group, tag)] = P2PQueue()
        return q

    def post(self, r: Receive) -> Result | None:
        """Post a receive for (group, tag) from ``src`` (None: any): its result if it ends at once."""
        assert r.tag is not None
        q = self._queue(r.group, r.tag)
        for i, a in enumerate(q.arrived):
            if r.src is None or a.src == r.src:
                del q.arrived[i]
                self._drop_if_empty(q, r.group, r.tag)
                self.budgets.refund(a.src, a.nbytes)
                return end(r, deliver(r, a.src, a.header, a.payload, a.nbytes))
        f = self.failures.factory_for(r) if self.failures.active else None
        if f is not None:
            self._drop_if_empty(q, r.group, r.tag)
            return end(r, f(r))
        q.posted.append(r)
        return None

    def _drop_if_empty(self, q: P2PQueue, group: Any, tag: int) -> None:
        """Forget the queue of (group, tag) once nothing waits on it: a program that uses a new tag per
        message (a request id, a microbatch) must not keep one queue per tag it ever used."""
        if not q.posted and not q.arrived:
            del self._queues[(group, tag)]

    def cancel(self, r: Receive) -> None:
        """Take a withdrawn receive off its queue; one whose message is arriving leaves the message to the next."""
        q = self._queues.get((r.group, r.tag))  # type: ignore[arg-type]
        if q is not None and r in q.posted:
            q.posted.remove(r)
            self._drop_if_empty(q, r.group, r.tag)  # type: ignore[arg-type]
        else:  # (matched: its message is on its way into its buffer; see _complete)
            r.withdrawn = True

    def arriving(self, r: Receive) -> bool:
        """Is ``r`` matched to a message whose payload is still arriving?"""
        if r.done:
            return False
        q = self._queues.get((r.group, r.tag))  # type: ignore[arg-type]
        return q is None or r not in q.posted

    def give_back(self, r: Receive, src: int, header: Any, payload: memoryview | None, nbytes: int,
                  out: list[Completion]) -> None:
        """Receive ``r`` got this message, but its waiter went away before taking it: the message is not lost.

        It goes to the next receive that takes it, else it waits first in line for
        one. Its payload is copied (it sits in ``r``'s buffer, which its owner may reuse).
        """
        assert r.tag is not None
        payload = None if payload is None else memoryview(bytearray(payload))
        nxt = self._take(r.group, r.tag, src)
        if nxt is not None:
            ended(nxt, deliver(nxt, src, header, payload, nbytes), out)
            return
        self._queue(r.group, r.tag).arrived.insert(0, Buffered(src, header, payload, nbytes))
        self.budgets.charge(src, nbytes)

    def route(self, m: Match, window: int) -> Match:
        """Decide for a point-to-point frame (its group vetted): its receive, or held, or to be buffered.

        An impossible number (a duplicate, or more than ``window`` ahead of the next
        one expected) is a violation. A frame without a receive is for the caller to
        admit (budgets).
        """
        header, src = m.header, m.src
        g = header.get("g")
        tag, n = header.get("tag", 0), header.get("n", None)
        if type(tag) is not int or (n is not None and type(n) is not int):
            return violate(m, f"a point-to-point message of group {g!r} with tag {tag!r}, number {n!r}")
        stream = (g, src, tag)
        expected = self._expected(stream)
        if n is None:
            n = expected
        if n < expected or n in self._held.get(stream, ()):
            if header.get(SKIP):  # its message came (the skip follows it on the same link): nothing to skip
                m.drop = True
                return m
            return violate(m, f"a duplicate point-to-point message (group {g!r}, tag {tag}, number {n})")
        if n > expected + window:
            return violate(
                m, f"point-to-point number {n} (group {g!r}, tag {tag}) is more than {window} "
                f"ahead of the next one expected ({expected})")
        if n != expected:
            m.in_order = False  # (held; a skip held stands in for its number: see _release_held)
            return m
        if not self._turn(stream, expected, header):  # a skip: the message of this number will not come
            m.drop = True
            return m
        r = self._take(g, tag, src)
        if r is not None:
            err = veto(r, src, header, m.nbytes)
            if err is None:
                m.receive = r
            else:
                refused(m, r, err)
        return m

    def complete(self, m: Match, payload: memoryview | None, out: list[Completion]) -> None:
        """The frame ``m`` has fully arrived (no longer charged): deliver, hold or buffer it; release what it unblocks."""
        stream = (m.header.get("g"), m.src, int(m.header.get("tag", 0)))
        if not m.in_order:
            if m.drop:
                return
            n = int(m.header["n"])
            if n != self._expected(stream):
                self._held.setdefault(stream, {})[n] = Buffered(m.src, m.header, payload, m.nbytes)
                self.budgets.charge(m.src, m.nbytes)
                return
            # Its turn came while its payload arrived: a frame before it in the same read without a
            # payload (routed only when complete, as this one's header was routed at once) was next.
            m.in_order = True
            if not self._turn(stream, n, m.header):
                m.drop = True
        if not m.drop:
            self._complete(m, payload, out)
        self._release_held(stream, out)

    def _complete(self, m: Match, payload: memoryview | None, out: list[Completion]) -> None:
        r = m.receive
        if r is not None:  # (vetted when routed)
            if not r.withdrawn and not _abandoned(r):
                ended(r, delivery(r, m.src, m.header, payload, m.nbytes), out)
                return
            # Withdrawn while it arrived: the next receive gets it (a copy: it is in the withdrawn one's buffer).
            r.done = True
            payload = None if payload is None else memoryview(bytearray(payload))
        g, tag = m.header.get("g"), int(m.header.get("tag", 0))
        r = self._take(g, tag, m.src)
        if r is not None:
            ended(r, deliver(r, m.src, m.header, payload, m.nbytes), out)
            return
        self._queue(g, tag).arrived.append(Buffered(m.src, m.header, payload, m.nbytes))
        self.budgets.charge(m.src, m.nbytes)

    def _release_held(self, stream: Stream, out: list[Completion]) -> None:
        """Deliver the held (early-numbered) messages of ``stream`` that are now next in line."""
        held = self._held.get(stream)
        while held:
            nxt = self._expected(stream)
            a = held.pop(nxt, None)
            if a is None:
                break
            self.budgets.refund(a.src, a.nbytes)
            if self._turn(stream, nxt, a.header):
                self._complete(Match(a.src, a.header, a.nbytes), a.payload, out)
        if held is not None and not held:
            del self._held[stream]

    def _expected(self, stream: Stream) -> int:
        """The number of the next message of ``stream`` to be delivered."""
        numbers = self._next_n.get(stream[:2])
        return 0 if numbers is None else numbers.get(stream[2], 0)

    def _turn(self, stream: Stream, n: int, header: Any) -> bool:
        """Number ``n`` of ``stream`` has its turn (the next one is expected now): False if it is a skip, which
        delivers nothing."""
        numbers = self._next_n.get(stream[:2])
        if numbers is None:
            numbers = self._next_n[stream[:2]] = {}
        numbers[stream[2]] = n + 1
        return not header.get(SKIP)

    def take(self, m: Match) -> Receive | None:
        """The oldest receive posted for in-order frame ``m`` (routed without one), off its queue."""
        return self._take(m.header.get("g"), m.header.get("tag", 0), m.src)

    def _take(self, group: Any, tag: int, src: int) -> Receive | None:
        """The oldest receive of (group, tag) that takes a message from ``src``, off its queue."""
        q = self._queues.get((group, tag))
        if q is None:
            return None
        posted = q.posted
        i = 0
        while i < len(posted):
            r = posted[i]
            if _abandoned(r):
                del posted[i]
                r.done = True
                continue
            if r.src is None or r.src == src:
                del posted[i]
                self._drop_if_empty(q, group, tag)
                return r
            i += 1
        self._drop_if_empty(q, group, tag)  # (abandoned receives may have been all it held)
        return None

    def fail(self, which: Callable[[Receive], bool], factory: ErrorFactory, out: list[Completion]) -> None:
        """End the posted receives ``which`` selects with ``factory``'s error."""
        for q in self._queues.values():
            if any(which(r) for r in q.posted):
                failing = [r for r in q.posted if which(r)]
                q.posted = [r for r in q.posted if not which(r)]
                for r in failing:
                    ended(r, factory(r), out)

    def forget_group(self, group: Any) -> None:
        """Drop everything of a destroyed group (its posted receives were failed already)."""
        for q in [q for q in self._queues if q[0] == group]:
            for a in self._queues.pop(q).arrived:
                self.budgets.refund(a.src, a.nbytes)
        for s in [s for s in self._held if s[0] == group]:
            for a in self._held.pop(s).values():
                self.budgets.refund(a.src, a.nbytes)
        for gs in [gs for gs in self._next_n if gs[0] == group]:
            del self._next_n[gs]

    def discard_source(self, src: int) -> None:
        """Drop every message buffered or held from ``src``."""
        for q in self._queues.values():
            for a in q.arrived:
                if a.src == src:
                    self.budgets.refund(a.src, a.nbytes)
            q.arrived = [a for a in q.arrived if a.src != src]
        for stream in [s for s in self._held if s[1] == src]:
            for a in self._held.pop(stream).values():
                self.budgets.refund(a.src, a.nbytes)

    def pending(self) -> Iterator[Receive]:
        """The receives still waiting, per (group, tag) in posting order."""
        for q in self._queues.values():
            yield from q.posted

    def unmatched(self, group: Any, src: int | None, tag: int, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` (global source, tag) pairs of messages of ``group`` waiting here that a receive from
        ``src`` (None: any) with ``tag`` does not take but nearly would: another tag from that source (any source
        for None), or the same tag from another source. Each pair once, sorted (the first ``limit`` found, those
        that arrived first on each queue; then the held ones).

        For an error message only (a receive that timed out): it looks at every queue of the rank.
        """
        found: list[tuple[int, int]] = []

        def near(a_src: int, a_tag: int) -> bool:
            if a_tag == tag:
                return src is not None and a_src != src
            return src is None or a_src == src

        for (g, t), q in self._queues.items():
            if g != group:
                continue
            for a in q.arrived:
                if near(a.src, t) and (a.src, t) not in found:
                    found.append((a.src, t))
                    if len(found) >= limit:
                        return sorted(found)
        for (g, a_src, t), held in self._held.items():
            if g == group and held and near(a_src, t) and (a_src, t) not in found:
                found.append((a_src, t))
                if len(found) >= limit:
                    break
        return sorted(found)

    def buffered_from(self, src: int) -> Iterator[Buffered]:
        """The messages from ``src`` buffered or held here."""
        for q in self._queues.values():
            yield from (a for a in q.arrived if a.src == src)
        for stream, held in self._held.items():
            if stream[1] == src:
                yield from held.values()


def _abandoned(r: Receive) -> bool:
    """Was the waiter of ``r`` cancelled? (asyncio cancels the future a cancelled task waits on at once; the
    task withdraws the receive only at its next step, and a message must not go to it meanwhile.)"""
    return r.fut is not None and r.fut.cancelled()
