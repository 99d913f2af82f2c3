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

Bad input. What one peer may make this rank buffer is bounded: at most
:attr:`Router.max_early_frames` frames and :attr:`Router.max_early_bytes`
payload bytes waiting for a receive (keyed, point-to-point and out-of-order
ones together), per peer. A frame that is impossible sets
:attr:`Match.violation` (and is dropped, never buffered), so that the transport
can close that peer's connection with the reason:

* a malformed header (no group, a keyed message without an integer sequence
  number first in its key, a point-to-point message without an integer number);
* a group id this rank will never know: not a non-negative int, more than
  :attr:`Router.group_window` ids beyond the newest group this rank allocated,
  a group this rank is not a member of (:meth:`Router.foreign_group`), or a
  known group the sender is not a member of;
* an impossible sequence number: a keyed message whose slot already holds a
  buffered message (a slot carries one message: a duplicate), one more than :attr:`Router.seq_window` numbers
  beyond the newest sequence number this rank posted a receive for in that
  group, a point-to-point message whose number was already delivered (a
  duplicate) or is more than the window ahead of the next one expected;
* more than the per-peer budget of buffered frames or bytes.

Frames for a group destroyed here (:meth:`Router.forget_group`) are dropped
without blame: a peer may still be sending the rest of an operation that timed
out or was cancelled here. So are frames for a sequence number retired here
(:meth:`Router.retire`: every operation below it completed), counted per peer
in :attr:`Router.late_from`: a duplicate cannot be told from the leftover of a
mismatched call. Neither is ever buffered.
"""

from __future__ import annotations

import bisect
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
    on_done: Callable[[Delivery | BaseException], None] | None
    key: Any = None  # keyed receives
    tag: int | None = None  # point-to-point receives
    check: Callable[[Header, int, int], BaseException | None] | None = None
    sig: str | None = None  # keyed: the call's signature; a message of the same seq with another one is a mismatch
    done: bool = False
    fut: Any = None  # instead of ``on_done``: an asyncio future set to the result, unless it is done already


def resolve(r: Receive, result: Delivery | BaseException) -> None:
    """Hand ``result`` to the receive's future, or to its ``on_done`` (the receive has ended)."""
    fut = r.fut
    if fut is None:
        r.on_done(result)  # type: ignore[misc]
    elif not fut.done():
        fut.set_result(result)


@dataclass(slots=True, eq=False)
class Match:
    """What :meth:`Router.route` decided for one incoming frame."""

    src: int
    header: Header
    nbytes: int
    receive: Receive | None = None
    drop: bool = False
    in_order: bool = True  # point-to-point: its number was the one expected next
    violation: str | None = None  # the frame is impossible (bad input): why; it is dropped
    charged: bool = False  # counted in its sender's budget from routing until it completes
    late: bool = False  # for an operation retired here: dropped (see Router.retire)
    slot: Any = None  # keyed: (group, frozen key, src), once route() computed it

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


MAX_EARLY_FRAMES = 65536
"""Default per-peer bound on frames buffered before their receive is posted."""
MAX_EARLY_BYTES = 1 << 30
"""Default per-peer bound on payload bytes buffered before their receive is posted (1 GiB)."""
SEQ_WINDOW = 1 << 16
"""Default: how many sequence numbers a keyed message may be ahead of the newest one this rank
posted a receive for in its group (and a point-to-point number ahead of the next one expected)."""
GROUP_WINDOW = 1024
"""Default: how many group ids a message's group may be ahead of the newest one allocated here."""


class Router:
    """The routing table of one rank (all its groups)."""

    def __init__(self) -> None:
        self.max_early_frames = MAX_EARLY_FRAMES
        self.max_early_bytes = MAX_EARLY_BYTES
        self.seq_window = SEQ_WINDOW
        self.group_window = GROUP_WINDOW
        self.check_groups = False  # the transport turns this on: group ids are then vetted (see the module doc)
        # Group ids: members lists of the groups known here (None: no check), foreign (not a
        # member), destroyed, the newest allocated; the newest seq posted and the retired floor.
        self.known_groups: dict[Any, tuple[int, ...] | None] = {}
        self.newest_group: int = 0
        self._foreign: dict[Any, None] = {}
        self._span: dict[Any, tuple[int, int]] = {}  # known contiguous groups: (first, last) member
        self._destroyed: dict[Any, None] = {}
        self._top_seq: dict[Any, int] = {}
        self._floor: dict[Any, int] = {}
        # per peer: [frames, bytes] buffered for it (which groups they are for: _buffered_groups)
        self._early: dict[int, list[int]] = {}
        self._incoming: dict[tuple[Any, Any, int], None] = {}  # keyed slots routed to be buffered, payload on its way
        self.dropped_destroyed = 0  # frames dropped because their group was destroyed here
        self.late_from: dict[int, int] = {}  # per peer: frames dropped for operations retired here
        self._posted: dict[tuple[Any, Any, int], Receive] = {}
        self._arrived: dict[tuple[Any, Any, int], _Arrived] = {}
        self._abandoned: dict[tuple[Any, Any, int], None] = {}
        self._p2p: dict[tuple[Any, int], _P2PQueue] = {}
        self._next_n: dict[tuple[Any, int, int], int] = {}
        self._held: dict[tuple[Any, int, int], dict[int, _Arrived]] = {}
        self._failed_src: dict[int, ErrorFactory] = {}
        self._failed_group: dict[Any, ErrorFactory] = {}
        self._failed_seq: dict[tuple[Any, Any, int | None], ErrorFactory] = {}
        self._failed_from: dict[Any, tuple[int, ErrorFactory]] = {}
        # (group, seq, src) -> [signature, count] of posted keyed receives / buffered messages,
        # so that "another call at the same seq" is found without scanning.
        self._posted_sigs: dict[tuple[Any, Any, int], list[Any]] = {}
        self._arrived_sigs: dict[tuple[Any, Any, int], list[Any]] = {}
        self._arrived_srcs: dict[tuple[Any, Any], dict[int, None]] = {}  # (group, seq) -> sources in _arrived_sigs

    def __repr__(self) -> str:
        return f"<Router posted={len(self._posted)} arrived={len(self._arrived)} p2p={len(self._p2p)}>"

    # ------------------------------------------------------------------ posting

    def post_keyed(self, receive: Receive) -> None:
        """Post a receive for (group, key, src); completes at once if the message is here."""
        assert receive.src is not None
        key = receive.key = freeze(receive.key)
        group = receive.group
        slot = (group, key, receive.src)
        seq = key[0] if key else None
        if type(seq) is int and seq > self._top_seq.get(group, -1):
            self._top_seq[group] = seq
        if slot in self._posted:
            self._finish(receive, RuntimeError(f"two receives posted for the same message {slot!r}"))
            return
        if self._arrived:  # (nothing buffered: the usual case, no lookups)
            arrived = self._pop_arrived(slot)
            if arrived is not None:
                self._deliver(receive, arrived.src, arrived.header, arrived.payload, arrived.nbytes)
                return
        if self._failed_group or self._failed_from or self._failed_seq or self._failed_src:
            err = self._failure_for(receive)
            if err is not None:
                self._finish(receive, err(receive))
                return
        if receive.sig is not None and key and self._arrived_sigs:
            other = self._arrived_sigs.get((group, seq, slot[2]))
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
                self._charge(a.src, a.nbytes, -1)
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
            g = header.get("g")
            k = header.get("k")
            # fast path (a known contiguous group, a sane seq within the window); else the full vetting
            span = self._span.get(g)
            if (
                span is None
                or not span[0] <= src <= span[1]
                or type(k) not in (tuple, list)
                or not k
                or type(k[0]) is not int
                or not 0 <= k[0] <= self._top_seq.get(g, 0) + self.seq_window
            ):
                bad = self._vet_group(g, src) if self.check_groups else None
                if bad is None:
                    bad = self._vet_keyed(g, k)
                if bad is not None:
                    return self._violate(m, bad)
                if g in self._destroyed:
                    self.dropped_destroyed += 1
                    m.drop = True
                    return m
            if self._floor and k[0] < self._floor.get(g, 0):
                self.late_from[src] = self.late_from.get(src, 0) + 1
                m.drop = m.late = True
                return m
            fk = tuple(k) if type(k) is list else k  # (freeze, inlined for a flat key)
            try:
                r = self._posted.pop((g, fk, src), None)
            except TypeError:
                fk = freeze(k)
                r = self._posted.pop((g, fk, src), None)
            slot = m.slot = (g, fk, src)
            if r is not None:
                sig = r.sig
                if sig is not None and fk:  # (_pop_posted's bookkeeping, inlined)
                    idx = (g, fk[0], src)
                    entry = self._posted_sigs.get(idx)
                    if entry is not None:
                        entry[1] -= 1
                        if entry[1] <= 0:
                            del self._posted_sigs[idx]
                # (_accept and _veto, inlined)
                check = r.check
                err = check(header, src, nbytes) if check is not None else None
                if err is None and r.out is not None and r.out.nbytes != nbytes:
                    err = size_mismatch(r, src, nbytes)
                if err is None:
                    m.receive = r
                else:
                    self._finish(r, err)
                    m.drop = True
            elif slot in self._abandoned:
                del self._abandoned[slot]
                m.drop = True
            elif slot in self._arrived or slot in self._incoming:
                return self._violate(m, f"a second message for {_describe(slot)} (a slot carries one message)")
            else:
                self._fail_conflicting(src, header, nbytes)
                if not m.drop:
                    self._check_budget(m)
                    if m.charged:
                        self._incoming[slot] = None
        elif kind == "p":
            g = header.get("g")
            bad = self._vet_group(g, src) if self.check_groups else None
            if bad is not None:
                return self._violate(m, bad)
            tag, n = header.get("tag", 0), header.get("n", None)
            if not _is_int(tag) or (n is not None and not _is_int(n)):
                return self._violate(m, f"a point-to-point message of group {g!r} with tag {tag!r}, number {n!r}")
            if g in self._destroyed:
                self.dropped_destroyed += 1
                m.drop = True
                return m
            ck = (g, src, int(tag))
            expected = self._next_n.get(ck, 0)
            if n is None:
                n = expected
            if n < expected or n in self._held.get(ck, ()):
                return self._violate(m, f"a duplicate point-to-point message (group {g!r}, tag {tag}, number {n})")
            if n > expected + self.seq_window:
                return self._violate(
                    m, f"point-to-point number {n} (group {g!r}, tag {tag}) is more than {self.seq_window} "
                    f"ahead of the next one expected ({expected})")
            if n == expected:
                self._next_n[ck] = expected + 1
                r = self._take_p2p(g, int(tag), src)
                if r is not None:
                    m.receive = self._accept(r, src, header, nbytes, m)
                else:
                    self._check_budget(m)
            else:
                m.in_order = False
                self._check_budget(m)
        else:
            m.drop = True
        return m

    # ------------------------------------------------------------------ bad input

    def _violate(self, m: Match, why: str) -> Match:
        m.violation = why
        m.drop = True
        m.receive = None
        return m

    def _vet_group(self, g: Any, src: int) -> str | None:
        if g in self.known_groups:
            members = self.known_groups[g]
            if members is not None and not _is_member(members, src):
                return f"a message for group {g!r}, of which rank {src} is not a member (members {list(members)})"
            return None
        if g in self._destroyed:
            return None
        if g in self._foreign:
            return f"a message for group {g!r}, of which this rank is not a member"
        if not _is_int(g) or g < 0:
            return f"a message for group id {g!r}, which no group has"
        if g > self.newest_group + self.group_window:
            return (f"a message for group {g}, more than {self.group_window} group ids beyond the newest "
                    f"one created here ({self.newest_group})")
        return None

    def _vet_keyed(self, g: Any, k: Any, *, retired_ok: bool = False) -> str | None:
        if not isinstance(k, (list, tuple)) or not k or not _is_int(k[0]) or k[0] < 0:
            return f"a collective message of group {g!r} without a sequence number (key {k!r})"
        seq = k[0]
        floor = self._floor.get(g)
        top = self._top_seq.get(g, max(floor or 0, 0))
        if seq > top + self.seq_window:
            return (f"a message for seq {seq} of group {g!r}, more than {self.seq_window} beyond the newest "
                    f"this rank has reached ({top})")
        return None

    def _check_budget(self, m: Match) -> None:
        """``m`` will probably be buffered: count it now (its payload is on its way), or refuse it."""
        frames, nbytes = self._early.get(m.src, (0, 0))
        if frames + 1 <= self.max_early_frames and nbytes + m.nbytes <= self.max_early_bytes:
            m.charged = True
            self._charge(m.src, m.nbytes, 1)
        else:
            groups = self._buffered_groups(m.src)
            where = ", ".join(f"group {g!r}: {f} frames, {b} bytes" for g, (f, b) in groups) or "none yet"
            self._violate(
                m, f"too many messages nobody waits for: {frames} frames and {nbytes} bytes buffered "
                f"(limits {self.max_early_frames} frames, {self.max_early_bytes} bytes per peer; {where})")

    def _buffered_groups(self, src: int) -> list[tuple[Any, tuple[int, int]]]:
        """The groups of the messages from ``src`` buffered here: [(group, (frames, bytes))] (for errors only)."""
        acc: dict[Any, list[int]] = {}
        every = [a for slot, a in self._arrived.items() if slot[2] == src]
        every += [a for q in self._p2p.values() for a in q.arrived if a.src == src]
        every += [a for ck, held in self._held.items() if ck[1] == src for a in held.values()]
        for a in every:
            c = acc.setdefault(a.header.get("g"), [0, 0])
            c[0] += 1
            c[1] += a.nbytes
        return sorted(((g, (c[0], c[1])) for g, c in acc.items()), key=repr)

    def release(self, m: Match) -> None:
        """Forget that ``m`` was to be buffered (it is about to be routed again)."""
        if m.charged:
            self._uncharge(m)

    def _uncharge(self, m: Match) -> None:
        m.charged = False
        self._charge(m.src, m.nbytes, -1)
        if self._incoming and m.header.get("t") == "m":
            slot = m.slot if m.slot is not None else (m.header.get("g"), freeze(m.header.get("k")), m.src)
            self._incoming.pop(slot, None)

    def _charge(self, src: int, nbytes: int, sign: int) -> None:
        """Add (``sign``: +1 or -1) one frame of ``nbytes`` to what ``src`` has buffered here."""
        c = self._early.get(src)
        if c is None:
            c = self._early[src] = [0, 0]
        c[0] += sign
        c[1] += sign * nbytes
        if c[0] <= 0:
            del self._early[src]

    def configure(self, *, check_groups: bool, max_early_frames: int, max_early_bytes: int) -> None:
        """Vet group ids (see the module doc) or not, and set the per-peer budget of early frames and bytes."""
        self.check_groups = check_groups
        self.max_early_frames = max_early_frames
        self.max_early_bytes = max_early_bytes

    def note_group_id(self, gid: int) -> None:
        """Group id ``gid`` was allocated here (ids up to :attr:`group_window` beyond the newest are plausible)."""
        if gid > self.newest_group:
            self.newest_group = gid

    def late_count(self, src: int) -> int:
        """How many frames of ``src`` were dropped as late (for operations retired here)."""
        return self.late_from.get(src, 0)

    def buffered(self, src: int) -> tuple[int, int]:
        """(frames, bytes) buffered from ``src`` that no receive took yet."""
        c = self._early.get(src)
        return (c[0], c[1]) if c else (0, 0)

    def vet(self, src: int, group: Any, seq: Any) -> str | None:
        """Why a message from ``src`` for ``seq`` of ``group`` is impossible (None: it is possible)."""
        bad = self._vet_group(group, src) if self.check_groups else None
        return bad if bad is not None else self._vet_keyed(group, (seq,), retired_ok=True)

    def destroyed(self, group: Any) -> bool:
        """Was ``group`` destroyed here (:meth:`forget_group`)?"""
        return group in self._destroyed

    def foreign_group(self, group: Any) -> None:
        """This rank is not a member of ``group``: a message for it is bad input."""
        self._foreign[group] = None

    def retire(self, group: Any, floor: int) -> None:
        """Every operation of ``group`` below sequence number ``floor`` completed here.

        A later message for one of them is dropped (never buffered) and counted in
        :attr:`late_from`: it is a duplicate, or the leftover of a peer that called
        another collective at that seq (a mismatch, reported by other means); the two
        cannot be told apart here, so nobody is blamed for it.
        """
        if floor > self._floor.get(group, 0):
            self._floor[group] = floor

    def discard_source(self, src: int) -> None:
        """Drop every message buffered from ``src`` (it sent bad input: nothing of it is trusted)."""
        for slot in [s for s in self._arrived if s[2] == src]:
            self._pop_arrived(slot)
        for q in self._p2p.values():
            kept = [a for a in q.arrived if a.src != src]
            for a in q.arrived:
                if a.src == src:
                    self._charge(a.src, a.nbytes, -1)
            q.arrived = kept
        for ck in [ck for ck in self._held if ck[1] == src]:
            for a in self._held.pop(ck).values():
                self._charge(a.src, a.nbytes, -1)

    def conflicting_arrival(self, group: Any, seq: Any, sig: str, sources: Any = None) -> tuple[int, str] | None:
        """A buffered message of ``group`` at ``seq`` from a rank that called something else than ``sig``.

        Returns (its global rank, its signature), or None; the lowest such rank if several.
        ``sources``: the ranks to look at (default: all), any container (``in`` is all it
        needs: pass a dict or a range for a large group). The public form of what
        ``_arrived_sigs`` holds. Costs O(messages buffered for that seq), never O(group size).
        """
        srcs = self._arrived_srcs.get((group, seq))
        if not srcs:
            return None
        for src in sorted(srcs):
            if sources is not None and src not in sources:
                continue
            entry = self._arrived_sigs[(group, seq, src)]
            if entry[0] != sig:
                return src, entry[0]
        return None

    def complete(self, m: Match, payload: memoryview | None) -> None:
        """The frame ``m`` was routed for has fully arrived with ``payload``."""
        r = m.receive
        if r is not None and not m.charged and m.header.get("t") == "m":  # the usual case, _fill inlined
            if r.done:
                return
            out = r.out
            if out is not None:
                if m.nbytes and payload is not out:  # a network that ignored the sink
                    out[:] = payload  # type: ignore[index]
                payload = out
            r.done = True
            resolve(r, Delivery(m.src, m.header, payload, m.nbytes))
            return
        kind = m.header.get("t")
        if kind == "m":
            if not m.drop:
                self._complete_keyed(m, payload)  # (keeps its charge if it is buffered)
            elif m.charged:
                self._uncharge(m)
            return
        if m.charged:  # counted again below if it is buffered after all
            self._uncharge(m)
        if kind != "p":
            return
        ck = (m.header.get("g"), m.src, int(m.header.get("tag", 0)))
        if not m.in_order:
            if not m.drop:
                self._held.setdefault(ck, {})[int(m.header["n"])] = _Arrived(m.src, m.header, payload, m.nbytes)
                self._charge(m.src, m.nbytes, 1)
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
            self._charge(a.src, a.nbytes, -1)
            self._next_n[ck] = nxt + 1
            self._complete_p2p(Match(a.src, a.header, a.nbytes), a.payload)
        if held is not None and not held:
            del self._held[ck]

    def abort(self, m: Match, exc: BaseException) -> None:
        """The frame ``m`` will never complete (its connection broke mid-payload)."""
        if m.charged:
            self._uncharge(m)
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

    def fail_seq(self, group: Any, seq: Any, src: int | None, factory: ErrorFactory) -> None:
        """Fail the keyed receives of operation ``seq`` of ``group`` from ``src`` (None: from every source), now and later.

        Used when a rank reported that the call at that sequence number does not match:
        the whole operation is void, so receives from every source fail at once.
        """
        self._failed_seq[(group, seq, src)] = factory
        bad = [
            s
            for s, r in self._posted.items()
            if r.group == group and (src is None or r.src == src) and r.key and r.key[0] == seq
        ]
        for slot in bad:
            r = self._pop_posted(slot)
            self._finish(r, factory(r))

    def fail_from(self, group: Any, seq: int, factory: ErrorFactory) -> None:
        """Fail the keyed receives of every operation of ``group`` at ``seq`` or later, from every source, now and later.

        Used when a rank reported a mismatch at ``seq``: the group is unusable from there on, so an
        operation this rank started after ``seq`` (its own part of ``seq`` may have completed
        without noticing, e.g. a broadcast root) fails at once instead of waiting for ranks that gave up.
        """
        cur = self._failed_from.get(group)
        if cur is not None and cur[0] <= seq:
            return
        self._failed_from[group] = (seq, factory)
        bad = [
            s
            for s, r in self._posted.items()
            if r.group == group and r.key and type(r.key[0]) is int and r.key[0] >= seq
        ]
        for slot in bad:
            r = self._pop_posted(slot)
            self._finish(r, factory(r))

    def know_group(self, group: Any, members: tuple[int, ...] | None) -> None:
        """``group`` exists here with these members (global ranks; None: do not check senders)."""
        self.known_groups[group] = None if members is None else tuple(members)
        m = self.known_groups[group]
        if m and m[-1] - m[0] == len(m) - 1 and m[0] <= m[-1]:
            self._span[group] = (m[0], m[-1])  # (a sorted distinct tuple: the ranks between its ends)
        else:
            self._span.pop(group, None)
        self._destroyed.pop(group, None)
        self._foreign.pop(group, None)
        if _is_int(group) and group > self.newest_group:
            self.newest_group = group

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
        self._failed_from.pop(group, None)
        for k in [k for k in self._p2p if k[0] == group]:
            for a in self._p2p.pop(k).arrived:
                self._charge(a.src, a.nbytes, -1)
        for k in [k for k in self._held if k[0] == group]:
            for a in self._held.pop(k).values():
                self._charge(a.src, a.nbytes, -1)
        for k in [k for k in self._next_n if k[0] == group]:
            del self._next_n[k]
        self.known_groups.pop(group, None)
        self._span.pop(group, None)
        self._top_seq.pop(group, None)
        self._floor.pop(group, None)
        self._destroyed[group] = None

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
        if self._failed_from and r.tag is None and r.key:
            ff = self._failed_from.get(r.group)
            if ff is not None and type(r.key[0]) is int and r.key[0] >= ff[0]:
                return ff[1]
        if self._failed_seq and r.tag is None and r.key and r.src is not None:
            f = self._failed_seq.get((r.group, r.key[0], r.src)) or self._failed_seq.get((r.group, r.key[0], None))
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
        if not self._posted_sigs:
            return
        seq = k[0]
        posted = self._posted_sigs.get((header.get("g"), seq if type(seq) is int else freeze(seq), src))
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

    def _put_arrived(self, slot: tuple[Any, Any, int], a: _Arrived, *, charged: bool = False) -> None:
        """Buffer ``a`` (``charged``: it is counted in its sender's budget already)."""
        if slot in self._arrived:  # (route() refuses a second message for a buffered slot)
            self._pop_arrived(slot)
        self._arrived[slot] = a
        if not charged:
            self._charge(slot[2], a.nbytes, 1)
        sig = a.header.get("o")
        if sig is not None and slot[1]:
            idx = (slot[0], slot[1][0], slot[2])
            entry = self._arrived_sigs.get(idx)
            if entry is None:
                entry = self._arrived_sigs[idx] = [sig, 0, a.header, a.nbytes]
                self._arrived_srcs.setdefault((slot[0], slot[1][0]), {})[slot[2]] = None
            entry[1] += 1

    def _pop_arrived(self, slot: tuple[Any, Any, int]) -> _Arrived | None:
        a = self._arrived.pop(slot, None)
        if a is not None:
            self._charge(slot[2], a.nbytes, -1)
        if a is not None and a.header.get("o") is not None and slot[1]:
            idx = (slot[0], slot[1][0], slot[2])
            entry = self._arrived_sigs.get(idx)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._arrived_sigs[idx]
                    srcs = self._arrived_srcs[idx[:2]]
                    del srcs[idx[2]]
                    if not srcs:
                        del self._arrived_srcs[idx[:2]]
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
            slot = m.slot if m.slot is not None else (m.header.get("g"), freeze(m.header.get("k")), m.src)
            r = self._pop_posted(slot)
            if r is None and slot not in self._abandoned:
                # buffered: its charge (taken when routed) now counts the buffered message
                charged, m.charged = m.charged, False
                if charged and self._incoming:
                    self._incoming.pop(slot, None)
                self._put_arrived(slot, _Arrived(m.src, m.header, payload, m.nbytes), charged=charged)
                return
            if m.charged:
                self._uncharge(m)
            if r is None:
                del self._abandoned[slot]
                return
            self._deliver(r, m.src, m.header, payload, m.nbytes)
            return
        if m.charged:
            self._uncharge(m)
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
            self._charge(m.src, m.nbytes, 1)
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
        resolve(r, result)


def _is_member(members: tuple[int, ...], src: int) -> bool:
    """Is ``src`` in ``members``? O(1) for a contiguous sorted tuple (the world), O(log n) for a sorted one."""
    n = len(members)
    if n and members[0] <= src <= members[-1] and members[-1] - members[0] == n - 1:
        return True  # (groups keep their ranks sorted and distinct)
    i = bisect.bisect_left(members, src)
    if i < n and members[i] == src:
        return True
    return src in members  # a non-member (bad input: rare), or an unsorted tuple


def _is_int(x: Any) -> bool:
    return type(x) is int


def _describe(slot: tuple[Any, Any, int]) -> str:
    g, k, src = slot
    return f"group {g!r}, key {k!r} from rank {src}"
