"""Matching incoming messages to posted receives (pure: no asyncio, no time).

Two kinds of messages travel between the ranks of a job:

* **keyed** (``"m"``): a collective's message, routed by (group, key, source).
  A (group, key, source) triple carries at most one message, so the first
  receive posted for it gets it, whether it is posted before or after the
  message arrives.
* **point-to-point** (``"p"``): routed by (group, tag); a receive names a
  source or accepts any. Receives are matched in the order they were posted,
  and messages from one source with one tag in the order they were sent (each
  carries the sender's per-(group, destination, tag) number ``"n"``, so the
  order holds even if the sender's tasks ran in another order).

Matching happens when a frame's *header* arrives (:meth:`Router.route`), so
that a receive posted in time gets the payload written straight into its
buffer; :meth:`Router.complete` finishes the frame once its payload is in.
Messages nobody waits for yet are buffered. Every receive ends exactly once,
through its ``on_done`` callback, with a :class:`Delivery` or an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CollectiveMismatchError

Header = dict[str, Any]
ErrorFactory = Callable[["Receive"], BaseException]
"""Builds the exception a failed receive ends with (called once per receive)."""


def freeze(key: Any) -> Any:
    """A hashable form of a message key (lists, as msgpack returns tuples, become tuples)."""
    t = type(key)
    if t is list:
        key = tuple(key)
        t = tuple
    if t is tuple:
        try:
            hash(key)  # the common case: flat (ints, strings), nothing to convert
            return key
        except TypeError:
            return tuple(freeze(k) for k in key)
    if isinstance(key, (list, tuple)):
        return tuple(freeze(k) for k in key)
    return key


_FLAT = (int, str, float, bool, bytes, type(None))


@dataclass(slots=True)
class Delivery:
    """A received message: who sent it, its header and its payload.

    ``payload`` is the receive's own ``out`` view for a sized receive, else the
    payload as received (``None`` when empty).
    """

    src: int
    header: Header
    payload: memoryview | None
    nbytes: int


@dataclass(slots=True, eq=False)
class Receive:
    """A posted receive.

    ``out``: the byte view to fill (its size must equal the message's) or
    ``None`` to take a message of any size. ``src``: the sender (global rank),
    ``None`` for any source (point-to-point only). ``check(header, src, nbytes)``
    may veto a message (returning the exception the receive fails with).
    """

    group: Any
    src: int | None
    out: memoryview | None
    on_done: Callable[[Delivery | BaseException], None]
    key: Any = None  # keyed receives
    tag: int | None = None  # point-to-point receives
    check: Callable[[Header, int, int], BaseException | None] | None = None
    sig: str | None = None  # keyed: the call's signature; a message of the same seq with another one is a mismatch
    done: bool = False


@dataclass(slots=True, eq=False)
class Match:
    """What :meth:`Router.route` decided for one incoming frame."""

    src: int
    header: Header
    nbytes: int
    receive: Receive | None = None
    drop: bool = False
    in_order: bool = True  # point-to-point: its number was the one expected next

    @property
    def sink(self) -> memoryview | None:
        """The buffer the payload should be written into, if any."""
        r = self.receive
        if r is None or r.out is None or r.out.nbytes != self.nbytes or self.nbytes == 0:
            return None
        return r.out


@dataclass(slots=True)
class _Arrived:
    src: int
    header: Header
    payload: memoryview | None
    nbytes: int


def size_mismatch(receive: Receive, src: int, nbytes: int) -> CollectiveMismatchError:
    what = f"key {receive.key!r}" if receive.tag is None else f"tag {receive.tag}"
    assert receive.out is not None
    return CollectiveMismatchError(
        f"message from rank {src} ({what}, group {receive.group!r}) has {nbytes} bytes "
        f"but the receive buffer has {receive.out.nbytes}: the ranks passed buffers of different sizes",
        calls={src: f"{nbytes} bytes"},
    )


@dataclass(slots=True)
class _P2PQueue:
    posted: list[Receive] = field(default_factory=list)
    arrived: list[_Arrived] = field(default_factory=list)


class Router:
    """The routing table of one rank (all its groups)."""

    def __init__(self) -> None:
        self._posted: dict[tuple[Any, Any, int], Receive] = {}
        self._arrived: dict[tuple[Any, Any, int], _Arrived] = {}
        self._abandoned: dict[tuple[Any, Any, int], None] = {}
        self._p2p: dict[tuple[Any, int], _P2PQueue] = {}
        self._next_n: dict[tuple[Any, int, int], int] = {}
        self._held: dict[tuple[Any, int, int], dict[int, _Arrived]] = {}
        self._failed_src: dict[int, ErrorFactory] = {}
        self._failed_group: dict[Any, ErrorFactory] = {}
        self._failed_seq: dict[tuple[Any, Any, int], ErrorFactory] = {}
        # (group, seq, src) -> [signature, count] of posted keyed receives / buffered messages,
        # so that "another call at the same seq" is found without scanning.
        self._posted_sigs: dict[tuple[Any, Any, int], list[Any]] = {}
        self._arrived_sigs: dict[tuple[Any, Any, int], list[Any]] = {}

    def __repr__(self) -> str:
        return f"<Router posted={len(self._posted)} arrived={len(self._arrived)} p2p={len(self._p2p)}>"

    # ------------------------------------------------------------------ posting

    def post_keyed(self, receive: Receive) -> None:
        """Post a receive for (group, key, src); completes at once if the message is here."""
        assert receive.src is not None
        receive.key = freeze(receive.key)
        slot = (receive.group, receive.key, receive.src)
        if slot in self._posted:
            self._finish(receive, RuntimeError(f"two receives posted for the same message {slot!r}"))
            return
        arrived = self._pop_arrived(slot)
        if arrived is not None:
            self._deliver(receive, arrived.src, arrived.header, arrived.payload, arrived.nbytes)
            return
        err = self._failure_for(receive)
        if err is not None:
            self._finish(receive, err(receive))
            return
        if receive.sig is not None and receive.key:
            other = self._arrived_sigs.get((receive.group, receive.key[0], receive.src))
            if other is not None and other[0] != receive.sig and receive.check is not None:
                _, _, header, nbytes = other
                self._finish(receive, receive.check(header, receive.src, nbytes) or RuntimeError("mismatch"))
                return
        self._put_posted(slot, receive)

    def post_p2p(self, receive: Receive) -> None:
        """Post a point-to-point receive for (group, tag) from ``src`` (``None``: any source)."""
        assert receive.tag is not None
        q = self._p2p.setdefault((receive.group, receive.tag), _P2PQueue())
        for i, a in enumerate(q.arrived):
            if receive.src is None or a.src == receive.src:
                del q.arrived[i]
                self._deliver(receive, a.src, a.header, a.payload, a.nbytes)
                return
        err = self._failure_for(receive)
        if err is not None:
            self._finish(receive, err(receive))
            return
        q.posted.append(receive)

    def cancel(self, receive: Receive) -> None:
        """Withdraw a receive (its waiter was cancelled). A keyed message that comes later is dropped."""
        if receive.done:
            return
        receive.done = True
        if receive.tag is None:
            slot = (receive.group, receive.key, receive.src)
            if self._posted.get(slot) is receive:
                self._pop_posted(slot)
                self._abandoned[slot] = None
            else:  # matched already: its frame is on its way and will be dropped
                pass
        else:
            q = self._p2p.get((receive.group, receive.tag))
            if q is not None and receive in q.posted:
                q.posted.remove(receive)

    # ------------------------------------------------------------------ arrivals

    def route(self, src: int, header: Header, nbytes: int) -> Match:
        """Decide, when a frame's header arrived, which receive (if any) gets it."""
        m = Match(src, header, nbytes)
        kind = header.get("t")
        if kind == "m":
            slot = (header.get("g"), freeze(header.get("k")), src)
            r = self._pop_posted(slot)
            if r is not None:
                m.receive = self._accept(r, src, header, nbytes, m)
            elif slot in self._abandoned:
                del self._abandoned[slot]
                m.drop = True
            else:
                self._fail_conflicting(src, header, nbytes)
        elif kind == "p":
            ck = (header.get("g"), src, int(header.get("tag", 0)))
            expected = self._next_n.get(ck, 0)
            if header.get("n", expected) == expected:
                self._next_n[ck] = expected + 1
                r = self._take_p2p(header.get("g"), int(header.get("tag", 0)), src)
                if r is not None:
                    m.receive = self._accept(r, src, header, nbytes, m)
            else:
                m.in_order = False
        else:
            m.drop = True
        return m

    def complete(self, m: Match, payload: memoryview | None) -> None:
        """The frame ``m`` was routed for has fully arrived with ``payload``."""
        kind = m.header.get("t")
        if kind == "m":
            if not m.drop:
                self._complete_keyed(m, payload)
            return
        if kind != "p":
            return
        ck = (m.header.get("g"), m.src, int(m.header.get("tag", 0)))
        if not m.in_order:
            self._held.setdefault(ck, {})[int(m.header["n"])] = _Arrived(m.src, m.header, payload, m.nbytes)
            return
        if not m.drop:
            self._complete_p2p(m, payload)
        self._release_held(ck)

    def _release_held(self, ck: tuple[Any, int, int]) -> None:
        """Deliver the held (early-numbered) messages of ``ck`` that are now next in line."""
        held = self._held.get(ck)
        while held:
            nxt = self._next_n.get(ck, 0)
            a = held.pop(nxt, None)
            if a is None:
                break
            self._next_n[ck] = nxt + 1
            self._complete_p2p(Match(a.src, a.header, a.nbytes), a.payload)
        if held is not None and not held:
            del self._held[ck]

    def abort(self, m: Match, exc: BaseException) -> None:
        """The frame ``m`` will never complete (its connection broke mid-payload)."""
        if m.receive is not None:
            self._finish(m.receive, exc)

    # ------------------------------------------------------------------ failures

    def fail_source(self, src: int, factory: ErrorFactory) -> None:
        """Fail every receive waiting for ``src`` now and later (buffered messages still deliver)."""
        self._failed_src[src] = factory
        for slot in [s for s, r in self._posted.items() if r.src == src]:
            r = self._pop_posted(slot)
            self._finish(r, factory(r))
        for q in self._p2p.values():
            for r in [r for r in q.posted if r.src == src]:
                q.posted.remove(r)
                self._finish(r, factory(r))

    def fail_seq(self, group: Any, seq: Any, src: int, factory: ErrorFactory) -> None:
        """Fail the keyed receives of operation ``seq`` of ``group`` from ``src``, now and later.

        Used when ``src`` reported that it called another collective at that sequence number.
        """
        self._failed_seq[(group, seq, src)] = factory
        bad = [s for s, r in self._posted.items() if r.group == group and r.src == src and r.key and r.key[0] == seq]
        for slot in bad:
            r = self._pop_posted(slot)
            self._finish(r, factory(r))

    def fail_group(self, group: Any, factory: ErrorFactory) -> None:
        """Fail every receive of ``group`` now and later (the group is broken)."""
        self._failed_group[group] = factory
        for slot in [s for s, r in self._posted.items() if r.group == group]:
            r = self._pop_posted(slot)
            self._finish(r, factory(r))
        for (g, _tag), q in self._p2p.items():
            if g == group:
                posted, q.posted = q.posted, []
                for r in posted:
                    self._finish(r, factory(r))

    def forget_group(self, group: Any, factory: ErrorFactory) -> None:
        """Drop everything of a destroyed group; its pending receives fail with ``factory``."""
        self.fail_group(group, factory)
        for slot in [s for s in self._arrived if s[0] == group]:
            self._pop_arrived(slot)
        for slot in [s for s in self._abandoned if s[0] == group]:
            del self._abandoned[slot]
        for k in [k for k in self._failed_seq if k[0] == group]:
            del self._failed_seq[k]
        for k in [k for k in self._p2p if k[0] == group]:
            del self._p2p[k]
        for k in [k for k in self._held if k[0] == group]:
            del self._held[k]
        for k in [k for k in self._next_n if k[0] == group]:
            del self._next_n[k]

    def pending(self) -> list[Receive]:
        """Receives still waiting, in posting order per kind (for diagnostics)."""
        out = list(self._posted.values())
        for q in self._p2p.values():
            out.extend(q.posted)
        return out

    # ------------------------------------------------------------------ internals

    def _failure_for(self, r: Receive) -> ErrorFactory | None:
        f = self._failed_group.get(r.group)
        if f is not None:
            return f
        if self._failed_seq and r.tag is None and r.key and r.src is not None:
            f = self._failed_seq.get((r.group, r.key[0], r.src))
            if f is not None:
                return f
        if r.src is not None:
            return self._failed_src.get(r.src)
        return None

    def _accept(self, r: Receive, src: int, header: Header, nbytes: int, m: Match) -> Receive | None:
        """Vet a receive for a frame; a vetoed receive fails and the frame is dropped."""
        err = self._veto(r, src, header, nbytes)
        if err is not None:
            self._finish(r, err)
            m.drop = True
            return None
        return r

    def _veto(self, r: Receive, src: int, header: Header, nbytes: int) -> BaseException | None:
        if r.check is not None:
            err = r.check(header, src, nbytes)
            if err is not None:
                return err
        if r.out is not None and r.out.nbytes != nbytes:
            return size_mismatch(r, src, nbytes)
        return None

    @staticmethod
    def _conflicts(r: Receive, src: int, header: Header) -> bool:
        """Is ``header`` (from ``src``) another call at the same sequence number as keyed receive ``r``?"""
        if r.sig is None or r.src != src or r.check is None or header.get("t") != "m":
            return False
        if header.get("g") != r.group or header.get("o") == r.sig:
            return False
        k = header.get("k")
        return bool(k) and bool(r.key) and freeze(k[0]) == r.key[0]

    def _fail_conflicting(self, src: int, header: Header, nbytes: int) -> None:
        """A message no receive waits for: fail the receives of its seq that expect another call."""
        k = header.get("k")
        sig = header.get("o")
        if not k or sig is None:
            return
        posted = self._posted_sigs.get((header.get("g"), freeze(k[0]), src))
        if posted is None or posted[0] == sig:
            return
        bad = [s for s, r in self._posted.items() if self._conflicts(r, src, header)]
        for slot in bad:
            r = self._pop_posted(slot)
            assert r.check is not None
            self._finish(r, r.check(header, src, nbytes) or RuntimeError("mismatch"))

    def _put_posted(self, slot: tuple[Any, Any, int], r: Receive) -> None:
        self._posted[slot] = r
        if r.sig is not None and r.key:
            entry = self._posted_sigs.setdefault((slot[0], r.key[0], slot[2]), [r.sig, 0])
            entry[1] += 1

    def _pop_posted(self, slot: tuple[Any, Any, int]) -> Receive | None:
        r = self._posted.pop(slot, None)
        if r is not None and r.sig is not None and r.key:
            idx = (slot[0], r.key[0], slot[2])
            entry = self._posted_sigs.get(idx)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._posted_sigs[idx]
        return r

    def _put_arrived(self, slot: tuple[Any, Any, int], a: _Arrived) -> None:
        self._arrived[slot] = a
        sig = a.header.get("o")
        if sig is not None and slot[1]:
            entry = self._arrived_sigs.setdefault((slot[0], slot[1][0], slot[2]), [sig, 0, a.header, a.nbytes])
            entry[1] += 1

    def _pop_arrived(self, slot: tuple[Any, Any, int]) -> _Arrived | None:
        a = self._arrived.pop(slot, None)
        if a is not None and a.header.get("o") is not None and slot[1]:
            idx = (slot[0], slot[1][0], slot[2])
            entry = self._arrived_sigs.get(idx)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._arrived_sigs[idx]
        return a

    def _take_p2p(self, group: Any, tag: int, src: int) -> Receive | None:
        q = self._p2p.get((group, tag))
        if q is None:
            return None
        for i, r in enumerate(q.posted):
            if r.src is None or r.src == src:
                del q.posted[i]
                return r
        return None

    def _complete_keyed(self, m: Match, payload: memoryview | None) -> None:
        r = m.receive
        if r is None:
            slot = (m.header.get("g"), freeze(m.header.get("k")), m.src)
            r = self._pop_posted(slot)
            if r is None:
                if slot in self._abandoned:
                    del self._abandoned[slot]
                else:
                    self._put_arrived(slot, _Arrived(m.src, m.header, payload, m.nbytes))
                return
            self._deliver(r, m.src, m.header, payload, m.nbytes)
            return
        if not r.done:
            self._fill(r, m.src, m.header, payload, m.nbytes)

    def _complete_p2p(self, m: Match, payload: memoryview | None) -> None:
        r = m.receive
        if r is not None:
            if not r.done:
                self._fill(r, m.src, m.header, payload, m.nbytes)
            return
        g, tag = m.header.get("g"), int(m.header.get("tag", 0))
        r = self._take_p2p(g, tag, m.src)
        if r is None:
            self._p2p.setdefault((g, tag), _P2PQueue()).arrived.append(_Arrived(m.src, m.header, payload, m.nbytes))
            return
        self._deliver(r, m.src, m.header, payload, m.nbytes)

    def _deliver(self, r: Receive, src: int, header: Header, payload: memoryview | None, nbytes: int) -> None:
        """Hand a complete message to a receive that did not vet it yet."""
        err = self._veto(r, src, header, nbytes)
        if err is not None:
            self._finish(r, err)
            return
        self._fill(r, src, header, payload, nbytes)

    def _fill(self, r: Receive, src: int, header: Header, payload: memoryview | None, nbytes: int) -> None:
        if r.out is not None:
            if nbytes and payload is not r.out:  # early arrival, or a network that ignored the sink
                assert payload is not None
                r.out[:] = payload
            self._finish(r, Delivery(src, header, r.out, nbytes))
        else:
            self._finish(r, Delivery(src, header, payload, nbytes))

    @staticmethod
    def _finish(r: Receive, result: Delivery | BaseException) -> None:
        if r.done:
            return
        r.done = True
        r.on_done(result)
