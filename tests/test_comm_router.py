"""The pure router: matching messages to receives, synchronously (no network, no loop)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.comm.router import Delivery, Receive, Router
from aiodist.errors import CollectiveMismatchError, PeerFailureError


class Sink:
    def __init__(self) -> None:
        self.results: list[Delivery | BaseException] = []

    def __call__(self, result: Delivery | BaseException) -> None:
        self.results.append(result)


def keyed(src: int, key: Any, out: memoryview | None, group: Any = 0, sig: str | None = None) -> tuple[Receive, Sink]:
    s = Sink()
    check = None
    if sig is not None:

        def check(h: dict[str, Any], src: int, n: int) -> BaseException | None:
            return None if h.get("o") == sig else CollectiveMismatchError(f"{sig} vs {h.get('o')}")

    return Receive(group=group, src=src, out=out, on_done=s, key=key, check=check, sig=sig), s


def msg(key: Any, group: Any = 0, sig: str | None = None) -> dict[str, Any]:
    h: dict[str, Any] = {"t": "m", "g": group, "k": list(key)}
    if sig is not None:
        h["o"] = sig
    return h


def arrive(router: Router, src: int, header: dict[str, Any], data: bytes) -> memoryview | None:
    """Feed one frame as a connection would: route at header time, write into the sink, complete."""
    m = router.route(src, header, len(data))
    target = m.sink
    if target is None:
        target = memoryview(bytearray(data))
    else:
        target[:] = data
    router.complete(m, target if data else None)
    return m.sink


def test_receive_posted_first_gets_the_payload_in_place() -> None:
    router = Router()
    buf = bytearray(4)
    out = memoryview(buf)
    r, s = keyed(1, (0, "a"), out)
    router.post_keyed(r)
    sink = arrive(router, 1, msg((0, "a")), b"abcd")
    assert sink is out  # the connection is told to write straight into the caller's buffer
    assert buf == b"abcd"
    assert isinstance(s.results[0], Delivery) and s.results[0].src == 1


def test_early_arrival_is_buffered_until_its_receive() -> None:
    router = Router()
    assert arrive(router, 2, msg((5, 1)), b"xy") is None
    out = memoryview(bytearray(2))
    r, s = keyed(2, (5, 1), out)
    router.post_keyed(r)
    assert bytes(out) == b"xy" and len(s.results) == 1


def test_keys_groups_and_sources_are_separate() -> None:
    router = Router()
    outs = {k: memoryview(bytearray(1)) for k in ("a", "b", "c")}
    ra, sa = keyed(1, (0,), outs["a"], group=0)
    rb, sb = keyed(1, (0,), outs["b"], group=1)
    rc, sc = keyed(2, (0,), outs["c"], group=0)
    for r in (ra, rb, rc):
        router.post_keyed(r)
    arrive(router, 2, msg((0,), group=0), b"C")
    arrive(router, 1, msg((0,), group=1), b"B")
    arrive(router, 1, msg((0,), group=0), b"A")
    assert [bytes(outs[k]) for k in "abc"] == [b"A", b"B", b"C"]


@pytest.mark.parametrize("receive_first", [True, False])
def test_size_mismatch_fails_without_writing(receive_first: bool) -> None:
    router = Router()
    buf = bytearray(b"....")
    r, s = keyed(1, (0,), memoryview(buf))
    if receive_first:
        router.post_keyed(r)
        assert arrive(router, 1, msg((0,)), b"123456") is None
    else:
        arrive(router, 1, msg((0,)), b"123456")
        router.post_keyed(r)
    assert isinstance(s.results[0], CollectiveMismatchError) and "6 bytes" in str(s.results[0])
    assert buf == b"...."


def test_another_call_at_the_same_seq_is_a_mismatch_either_order() -> None:
    router = Router()
    r, s = keyed(1, (3, "rd", 0), memoryview(bytearray(1)), sig="all_reduce")
    router.post_keyed(r)
    arrive(router, 1, msg((3, "bcast", 0), sig="broadcast"), b"z")  # other key, same seq
    assert isinstance(s.results[0], CollectiveMismatchError)

    router2 = Router()
    arrive(router2, 1, msg((3, "bcast", 0), sig="broadcast"), b"z")
    r2, s2 = keyed(1, (3, "rd", 0), memoryview(bytearray(1)), sig="all_reduce")
    router2.post_keyed(r2)
    assert isinstance(s2.results[0], CollectiveMismatchError)


def test_cancelled_receive_drops_its_late_message() -> None:
    router = Router()
    r, s = keyed(1, (0,), memoryview(bytearray(1)))
    router.post_keyed(r)
    router.cancel(r)
    arrive(router, 1, msg((0,)), b"x")
    r2, s2 = keyed(1, (0,), memoryview(bytearray(1)))
    router.post_keyed(r2)
    assert s.results == [] and s2.results == []  # neither got the abandoned message
    assert router.pending() == [r2]


def test_failed_source_fails_waiters_but_delivers_what_arrived() -> None:
    router = Router()
    arrive(router, 1, msg((0,)), b"k")
    waiting, sw = keyed(1, (1,), memoryview(bytearray(1)))
    router.post_keyed(waiting)
    router.fail_source(1, lambda r: PeerFailureError("gone", rank=1))
    assert isinstance(sw.results[0], PeerFailureError)
    buffered, sb = keyed(1, (0,), memoryview(bytearray(1)))
    router.post_keyed(buffered)
    assert isinstance(sb.results[0], Delivery)
    later, sl = keyed(1, (2,), memoryview(bytearray(1)))
    router.post_keyed(later)
    assert isinstance(sl.results[0], PeerFailureError)


def test_another_call_from_a_source_that_left_since_is_a_mismatch_not_its_departure() -> None:
    # Ranks 0, 2 reduce(dst=1) and leave; rank 1 calls barrier. Before: rank 1 blamed "rank 0 left the
    # job" when the departure was known before its barrier posted (half the runs); the frame rank 0 sent
    # first shows the real cause.
    router = Router()
    arrive(router, 0, msg((0, 0, 1), sig="reduce dst=1"), b"x")
    router.fail_source(0, lambda r: PeerFailureError("left the job", rank=0))
    r, s = keyed(0, (0, 1, 0), memoryview(bytearray(1)), sig="barrier")
    router.post_keyed(r)
    assert isinstance(s.results[0], CollectiveMismatchError), s.results
    other, so = keyed(0, (1, 0), memoryview(bytearray(1)), sig="barrier")  # nothing of seq 1 came: its departure
    router.post_keyed(other)
    assert isinstance(so.results[0], PeerFailureError)


def test_failed_group_fails_receives_from_every_source() -> None:
    router = Router()
    r, s = keyed(3, (0,), memoryview(bytearray(1)), group=7)
    other, so = keyed(3, (0,), memoryview(bytearray(1)), group=8)
    router.post_keyed(r)
    router.post_keyed(other)
    router.fail_group(7, lambda r: PeerFailureError("rank 2 died", rank=2))
    assert isinstance(s.results[0], PeerFailureError) and so.results == []


def p2p(src: int | None, tag: int, out: memoryview | None, group: Any = 0) -> tuple[Receive, Sink]:
    s = Sink()
    return Receive(group=group, src=src, out=out, on_done=s, tag=tag), s


def pmsg(tag: int, n: int, group: Any = 0) -> dict[str, Any]:
    return {"t": "p", "g": group, "tag": tag, "n": n}


def test_p2p_reorders_by_sender_number_and_matches_in_posting_order() -> None:
    router = Router()
    outs = [memoryview(bytearray(1)) for _ in range(3)]
    sinks = []
    for o in outs:
        r, s = p2p(1, 0, o)
        router.post_p2p(r)
        sinks.append(s)
    # the sender's tasks ran out of order: numbers 2, 0, 1 arrive
    arrive(router, 1, pmsg(0, 2), b"c")
    arrive(router, 1, pmsg(0, 0), b"a")
    arrive(router, 1, pmsg(0, 1), b"b")
    assert [bytes(o) for o in outs] == [b"a", b"b", b"c"]


def test_any_source_takes_the_first_arrival_and_names_its_sender() -> None:
    router = Router()
    arrive(router, 3, pmsg(5, 0), b"3")
    arrive(router, 1, pmsg(5, 0), b"1")
    arrive(router, 1, pmsg(6, 0), b"T")  # another tag is not taken
    got = []
    for _ in range(2):
        r, s = p2p(None, 5, memoryview(bytearray(1)))
        router.post_p2p(r)
        d = s.results[0]
        assert isinstance(d, Delivery)
        got.append((d.src, bytes(d.payload or b"")))
    assert got == [(3, b"3"), (1, b"1")]
    r, s = p2p(None, 5, memoryview(bytearray(1)))
    router.post_p2p(r)
    assert s.results == []


def test_specific_source_receive_skips_other_sources() -> None:
    router = Router()
    any_r, sa = p2p(None, 0, memoryview(bytearray(1)))
    from2, s2 = p2p(2, 0, memoryview(bytearray(1)))
    router.post_p2p(from2)
    router.post_p2p(any_r)
    arrive(router, 1, pmsg(0, 0), b"1")
    assert s2.results == [] and isinstance(sa.results[0], Delivery) and sa.results[0].src == 1
    arrive(router, 2, pmsg(0, 0), b"2")
    assert isinstance(s2.results[0], Delivery) and s2.results[0].src == 2


# ---------------------------------------------------------------------- properties



@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_interleaving_of_posts_and_arrivals_delivers_each_message_once(data: st.DataObject) -> None:
    """Keyed messages: whatever the order of receives and (header, payload) events, each receive gets its message."""
    n = data.draw(st.integers(1, 12))
    slots = [(data.draw(st.integers(0, 2)), data.draw(st.integers(0, 3)), i) for i in range(n)]  # (group, src, key)
    events = [("post", i) for i in range(n)] + [("head", i) for i in range(n)] + [("done", i) for i in range(n)]
    order = list(data.draw(st.permutations(events)))
    for i in range(n):  # a frame's payload completes after its header arrived
        h, d = order.index(("head", i)), order.index(("done", i))
        if d < h:
            order[h], order[d] = order[d], order[h]
    router = Router()
    outs = [bytearray(3) for _ in range(n)]
    sinks = [Sink() for _ in range(n)]
    matches: dict[int, Any] = {}
    for kind, i in order:
        g, src, key = slots[i]
        if kind == "post":
            r, _ = keyed(src, (g, key), memoryview(outs[i]), group=g, sig=f"op{g}")
            r.on_done = sinks[i]
            router.post_keyed(r)
        elif kind == "head":
            matches[i] = router.route(src, msg((g, key), group=g, sig=f"op{g}"), 3)
        else:
            m = matches.pop(i)
            target = m.sink if m.sink is not None else memoryview(bytearray(3))
            target[:] = bytes([i, i, i])
            router.complete(m, target)
    for i in range(n):
        assert len(sinks[i].results) == 1 and isinstance(sinks[i].results[0], Delivery)
        assert outs[i] == bytes([i, i, i])
    assert router.pending() == []
    for g in {g for g, _, _ in slots}:  # (the key's first element, its "seq", is g here)
        assert router.settle(g, g, f"op{g}", None, 0) is None  # every message was taken: no leftovers
    t = router.table
    assert not t.ops.calls and not t.ops.seqs and not t.ops.arrived  # the mismatch index does not leak
    assert all(router.buffered(src) == (0, 0) for src in range(4))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_p2p_keeps_per_source_order_whatever_the_sending_order(data: st.DataObject) -> None:
    sources = data.draw(st.integers(1, 3))
    per_src = data.draw(st.integers(1, 5))
    # each source's messages leave in a random order of their numbers (its tasks raced)
    streams = {s: data.draw(st.permutations(range(per_src))) for s in range(sources)}
    frames = [(s, k) for s in range(sources) for k in streams[s]]
    # sources interleave arbitrarily, but each source's frames stay in its stream order
    interleaved: list[tuple[int, int]] = []
    cursors = {s: 0 for s in range(sources)}
    while len(interleaved) < len(frames):
        s = data.draw(st.sampled_from([s for s in range(sources) if cursors[s] < per_src]))
        interleaved.append((s, streams[s][cursors[s]]))
        cursors[s] += 1
    router = Router()
    specific = data.draw(st.booleans())
    got: list[tuple[int, int]] = []
    posted_before = data.draw(st.integers(0, len(frames)))
    receives = []

    def post() -> None:
        src = len(receives) % sources if specific else None
        sink = Sink()
        router.post_p2p(Receive(group=0, src=src, out=memoryview(bytearray(1)), on_done=sink, tag=0))
        receives.append(sink)

    for _ in range(posted_before):
        post()
    for s, k in interleaved:
        arrive(router, s, pmsg(0, k), bytes([k]))
    while len(receives) < len(frames):
        post()
    for sink in receives:
        d = sink.results[0]
        assert isinstance(d, Delivery)
        got.append((d.src, d.header["n"]))
    for s in range(sources):
        assert [k for src, k in got if src == s] == list(range(per_src))


def test_a_vetoed_p2p_message_does_not_hold_up_the_ones_after_it() -> None:
    router = Router()
    small, s_small = p2p(1, 0, memoryview(bytearray(1)))
    router.post_p2p(small)
    arrive(router, 1, pmsg(0, 1), b"B")  # number 1 overtook number 0
    arrive(router, 1, pmsg(0, 0), b"AA")  # number 0 does not fit the posted receive
    assert isinstance(s_small.results[0], CollectiveMismatchError)
    nxt, s_next = p2p(1, 0, memoryview(bytearray(1)))
    router.post_p2p(nxt)
    d = s_next.results[0]
    assert isinstance(d, Delivery) and d.header["n"] == 1


def skip(tag: int, n: int, group: Any = 0) -> dict[str, Any]:
    return {"t": "p", "g": group, "tag": tag, "n": n, "skip": 1}


def test_a_skipped_number_does_not_hold_up_the_messages_after_it() -> None:
    """A send that gave up before its frame was queued: its skip frame stands in for it (either order)."""
    router = Router()
    arrive(router, 1, pmsg(0, 0), b"A")
    arrive(router, 1, pmsg(0, 2), b"C")  # number 1 never left: C is held ...
    got = []
    for _ in range(2):
        r, s = p2p(1, 0, memoryview(bytearray(1)))
        router.post_p2p(r)
        got.append(s)
    assert [type(s.results[0]).__name__ for s in got[:1]] == ["Delivery"] and got[1].results == []
    arrive(router, 1, skip(0, 1), b"")  # ... until number 1's skip comes
    d = got[1].results[0]
    assert isinstance(d, Delivery) and bytes(d.payload or b"") == b"C" and d.header["n"] == 2
    assert router.buffered(1) == (0, 0)


def test_a_skip_that_comes_before_the_next_message_is_held_like_a_message() -> None:
    router = Router()
    r, s = p2p(1, 0, memoryview(bytearray(1)))
    router.post_p2p(r)
    arrive(router, 1, skip(0, 1), b"")  # ahead of number 0: held
    arrive(router, 1, pmsg(0, 0), b"A")
    arrive(router, 1, pmsg(0, 2), b"C")  # 1 was skipped: C is next
    r2, s2 = p2p(1, 0, memoryview(bytearray(1)))
    router.post_p2p(r2)
    assert [bytes(x.payload or b"") for x in (s.results[0], s2.results[0])] == [b"A", b"C"]  # type: ignore[union-attr]
    r3, s3 = p2p(1, 0, memoryview(bytearray(1)))
    router.post_p2p(r3)
    assert s3.results == []  # a skip delivers nothing


def test_the_skip_of_a_message_that_came_is_ignored_and_is_no_violation() -> None:
    """The send gave up after its frame was queued: the message came first (same link), the skip is stale."""
    router = Router()
    arrive(router, 1, pmsg(0, 0), b"A")
    m = router.route(1, skip(0, 0), 0)
    assert m.violation is None and m.drop
    router.complete(m, None)
    arrive(router, 1, pmsg(0, 1), b"B")
    got = []
    for _ in range(3):
        r, s = p2p(1, 0, memoryview(bytearray(1)))
        router.post_p2p(r)
        got.append(s)
    assert [bytes(s.results[0].payload or b"") for s in got[:2]] == [b"A", b"B"]  # type: ignore[union-attr]
    assert got[2].results == []
    assert router.route(1, pmsg(0, 1), 1).violation is not None  # a duplicate message is still bad input


@pytest.mark.parametrize("before", ["empty message", "skip"])
def test_a_frame_routed_early_whose_turn_comes_while_its_payload_arrives_is_delivered(before: str) -> None:
    """A connection routes a frame with a payload when its header arrives, and a frame without one when it is
    complete: in one read, number 1's header is routed before number 0 (no payload) is. When number 1
    completes, number 0 has come: number 1 is next, not held for ever."""
    router = Router()
    r, s = p2p(1, 0, memoryview(bytearray(0 if before == "empty message" else 4)))
    router.post_p2p(r)
    late = router.route(1, pmsg(0, 1), 4)  # its header: number 0 did not come yet
    assert late.violation is None and not late.in_order
    arrive(router, 1, pmsg(0, 0) if before == "empty message" else skip(0, 0), b"")
    router.complete(late, memoryview(bytearray(b"BBBB")))
    got = [s.results[0]] if s.results else []
    if before == "empty message":  # the first receive took the empty message; the next one takes number 1
        assert isinstance(got[0], Delivery) and got[0].header["n"] == 0
        r, s = p2p(1, 0, memoryview(bytearray(4)))
        router.post_p2p(r)
        got = [s.results[0]] if s.results else []
    assert got and isinstance(got[0], Delivery) and got[0].header["n"] == 1 and bytes(got[0].payload or b"") == b"BBBB"
    assert router.buffered(1) == (0, 0)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_whatever_numbers_are_skipped_the_rest_arrive_once_in_order(data: st.DataObject) -> None:
    """Each number is sent or skipped (a given-up send: its message may still have gone first); any link order
    that keeps each message before its own skip delivers exactly the messages sent, in number order."""
    count = data.draw(st.integers(1, 8))
    fate = [data.draw(st.sampled_from(["sent", "skipped", "both"])) for _ in range(count)]
    frames: list[tuple[str, int]] = []
    for n, f in enumerate(fate):
        if f != "skipped":
            frames.append(("msg", n))
        if f != "sent":
            frames.append(("skip", n))
    order = list(data.draw(st.permutations(frames)))
    for n, f in enumerate(fate):  # (a skip follows its own message on the link)
        if f == "both" and order.index(("skip", n)) < order.index(("msg", n)):
            i, j = order.index(("skip", n)), order.index(("msg", n))
            order[i], order[j] = order[j], order[i]
    router = Router()
    for kind, n in order:
        m = router.route(1, pmsg(0, n) if kind == "msg" else skip(0, n), 1 if kind == "msg" else 0)
        assert m.violation is None
        target = m.sink if m.sink is not None else memoryview(bytearray(1))
        if kind == "msg":
            target[:] = bytes([n])
        router.complete(m, target if kind == "msg" else None)
    got = []
    for _ in range(count + 1):
        r, s = p2p(1, 0, memoryview(bytearray(1)))
        router.post_p2p(r)
        if s.results:
            got.append(bytes(s.results[0].payload or b"")[0])  # type: ignore[union-attr]
    assert got == [n for n, f in enumerate(fate) if f != "skipped"]
    assert router.buffered(1) == (0, 0)


# ---------------------------------------------------------------------- completions


def test_a_waiter_that_posts_from_its_callback_finds_the_tables_consistent() -> None:
    """fail_group ends receives whose callbacks post into the point-to-point tables it walks.

    Each end is resolved only once the tables are consistent: the new receive fails at once
    (its group is broken), nothing raises "dictionary changed size during iteration".
    """
    router = Router()
    later: list[Sink] = []

    def repost(result: Delivery | BaseException) -> None:
        first.results.append(result)
        for tag in (7, 8):  # new (group, tag) queues
            r, s = p2p(1, tag, memoryview(bytearray(1)), group=5)
            router.post_p2p(r)
            later.append(s)

    first = Sink()
    router.post_p2p(Receive(group=5, src=1, out=memoryview(bytearray(1)), on_done=repost, tag=0))
    other, so = p2p(1, 0, memoryview(bytearray(1)), group=5)
    router.post_p2p(other)
    router.fail_group(5, lambda r: PeerFailureError("rank 1 died", rank=1))
    assert isinstance(first.results[0], PeerFailureError) and isinstance(so.results[0], PeerFailureError)
    assert [type(s.results[0]) for s in later] == [PeerFailureError, PeerFailureError]
    assert router.pending() == []


def test_the_table_returns_what_it_ended_and_resolves_nothing() -> None:
    table = Router().table
    r, s = keyed(1, (0, "a"), memoryview(bytearray(2)))
    assert table.post_keyed(r) is None
    done = table.fail_source(1, lambda rc: PeerFailureError("gone", rank=1))
    assert [c.receive for c in done] == [r] and isinstance(done[0].result, PeerFailureError)
    assert r.done and s.results == []  # marked ended; the driver resolves it


def test_withdrawn_slots_are_forgotten_once_their_operation_is_settled() -> None:
    """A receive cancelled (its operation timed out) whose message never comes is not kept forever."""
    router = Router()
    for seq in range(100):
        r, _ = keyed(1, (seq, "x"), memoryview(bytearray(1)), sig="all_reduce")
        router.post_keyed(r)
        router.cancel(r)
        router.settle(0, seq, "all_reduce", None, seq + 1)
    assert len(router.table._abandoned) == 0 and not router.table.ops.calls
    # the message of a settled operation that comes after all is dropped, not buffered
    m = router.route(1, msg((5, "x"), sig="all_reduce"), 1)
    assert m.drop and m.late and router.buffered(1) == (0, 0)
    assert router.late_count(1) == 1


def test_withdrawn_slots_below_the_floor_go_when_it_rises() -> None:
    router = Router()
    for seq in range(10):
        r, _ = keyed(1, (seq, "x"), memoryview(bytearray(1)))
        router.post_keyed(r)
        router.cancel(r)
    assert len(router.table._abandoned) == 10
    router.retire(0, 6)
    assert sorted(s[1][0] for s in router.table._abandoned) == [6, 7, 8, 9]


def test_what_nobody_took_is_dropped_when_its_operation_ends() -> None:
    router = Router()
    r, _ = keyed(1, (3, "a"), memoryview(bytearray(1)), sig="all_reduce")
    router.post_keyed(r)
    arrive(router, 1, msg((3, "a"), sig="all_reduce"), b"x")
    arrive(router, 2, msg((3, "b"), sig="broadcast"), b"yy")  # rank 2 called something else
    assert router.buffered(2) == (1, 2)
    assert router.settle(0, 3, "all_reduce", {1: 0, 2: 1}, 4) == (2, "broadcast")
    assert router.buffered(2) == (0, 0) and not router.table.ops.arrived and not router.table.ops.seqs


def test_a_nested_tuple_key_is_frozen_on_both_sides() -> None:
    router = Router()
    out = memoryview(bytearray(1))
    r, s = keyed(1, (0, ["a", 1]), out)  # a tuple with a list inside
    router.post_keyed(r)
    arrive(router, 1, msg((0, ["a", 1])), b"z")
    assert isinstance(s.results[0], Delivery) and bytes(out) == b"z"


# ------------------------------------------------------------------ claim: a receive posted while its payload arrives


def test_a_receive_posted_while_its_payload_arrives_claims_it_and_nothing_stays_charged() -> None:
    router = Router()
    router.max_early_bytes = 10
    m = router.route(1, msg((0, "a")), 8)  # no receive yet: to be buffered, charged
    assert m.sink is None and router.buffered(1) == (1, 8)
    assert not router.claim(m)  # nothing posted yet
    out = memoryview(bytearray(8))
    r, s = keyed(1, (0, "a"), out)
    router.post_keyed(r)
    assert router.claim(m) and m.sink is out and m.receive is r
    assert router.buffered(1) == (0, 0)  # no longer charged: its bytes go to the receive
    assert not router.claim(m)  # (once)
    out[:] = b"abcdefgh"  # the connection moved what it had and writes the rest there
    router.complete(m, out)
    assert len(s.results) == 1 and s.results[0].payload is out and bytes(out) == b"abcdefgh"  # type: ignore[union-attr]
    assert router.pending() == [] and router.buffered(1) == (0, 0)
    m2 = router.route(1, msg((0, "b")), 8)  # the budget is whole again
    assert m2.violation is None


def test_a_receive_that_refuses_the_frame_it_claims_ends_with_its_error_and_the_frame_is_dropped() -> None:
    router = Router()
    m = router.route(1, msg((0, "a")), 8)
    r, s = keyed(1, (0, "a"), memoryview(bytearray(4)))  # another size
    router.post_keyed(r)
    assert not router.claim(m)
    assert len(s.results) == 1 and isinstance(s.results[0], CollectiveMismatchError)
    assert m.drop and router.buffered(1) == (0, 0)
    router.complete(m, memoryview(bytearray(8)))  # dropped when it completes
    assert router.pending() == [] and len(s.results) == 1


def test_a_p2p_receive_claims_the_next_message_in_order_only() -> None:
    router = Router()
    held = router.route(1, pmsg(5, 1), 4)  # number 1 before number 0: held for its turn
    assert not router.claim(held)
    router.complete(held, memoryview(bytearray(b"one!")))
    first = router.route(1, pmsg(5, 0), 4)
    out0, out1 = memoryview(bytearray(4)), memoryview(bytearray(4))
    assert not router.claim(first)  # nothing posted yet
    r0, s0 = p2p(1, 5, out0)
    router.post_p2p(r0)
    r1, s1 = p2p(1, 5, out1)
    router.post_p2p(r1)
    assert router.claim(first) and first.sink is out0
    out0[:] = b"zero"
    router.complete(first, out0)
    assert [bytes(d.payload) for d in s0.results + s1.results] == [b"zero", b"one!"]  # type: ignore[union-attr,arg-type]
