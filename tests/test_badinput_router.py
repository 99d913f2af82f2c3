"""Bad input at the router (pure): bounded buffering, impossible groups and sequence numbers."""

from __future__ import annotations

from typing import Any

from aiodist.comm.router import Receive, Router
from aiodist.errors import CollectiveMismatchError


class Sink:
    def __init__(self) -> None:
        self.results: list[Any] = []

    def __call__(self, result: Any) -> None:
        self.results.append(result)


def keyed(src: int, key: Any, group: Any = 0, sig: str | None = None) -> tuple[Receive, Sink]:
    s = Sink()
    check = None
    if sig is not None:

        def check(h: dict[str, Any], src: int, n: int) -> BaseException | None:
            return None if h.get("o") == sig else CollectiveMismatchError(f"{sig} vs {h.get('o')}")

    return Receive(group=group, src=src, out=None, on_done=s, key=key, check=check, sig=sig), s


def feed(router: Router, src: int, header: dict[str, Any], data: bytes = b"") -> Any:
    m = router.route(src, header, len(data))
    if m.violation is None:
        router.complete(m, memoryview(bytearray(data)) if data else None)
    return m


def m(seq: Any, step: Any = 0, group: Any = 0, sig: str | None = None) -> dict[str, Any]:
    h: dict[str, Any] = {"t": "m", "g": group, "k": [seq, step]}
    if sig is not None:
        h["o"] = sig
    return h


def strict(members: tuple[int, ...] = (0, 1, 2)) -> Router:
    r = Router()
    r.check_groups = True
    r.know_group(0, members)
    return r


def test_buffered_frames_are_bounded_per_peer_by_count() -> None:
    r = strict()
    r.max_early_frames = 10
    for i in range(10):
        assert feed(r, 1, m(i)).violation is None
    assert r.buffered(1) == (10, 0)
    bad = feed(r, 1, m(10))
    assert bad.violation is not None and "too many messages nobody waits for" in bad.violation
    assert "group 0: 10 frames" in bad.violation
    assert r.buffered(1) == (10, 0)  # the offending frame was not buffered
    assert feed(r, 2, m(0)).violation is None  # another peer has its own budget
    # receiving releases budget
    rc, s = keyed(1, (0, 0))
    r.post_keyed(rc)
    assert len(s.results) == 1 and r.buffered(1) == (9, 0)


def test_buffered_frames_are_bounded_per_peer_by_bytes() -> None:
    r = strict()
    r.max_early_bytes = 1000
    assert feed(r, 1, m(0), b"x" * 600).violation is None
    bad = feed(r, 1, m(1), b"x" * 600)
    assert bad.violation is not None and "600 bytes buffered" in bad.violation
    assert r.buffered(1) == (1, 600)


def test_point_to_point_frames_count_against_the_budget_too() -> None:
    r = strict()
    r.max_early_frames = 3
    for n in (0, 2, 3):  # one in order (queued), two early (held)
        assert feed(r, 1, {"t": "p", "g": 0, "tag": 0, "n": n}, b"ab").violation is None
    assert r.buffered(1) == (3, 6)
    assert feed(r, 1, {"t": "p", "g": 0, "tag": 0, "n": 4}).violation is not None
    assert feed(r, 1, {"t": "p", "g": 0, "tag": 0, "n": 1}, b"ab").violation is not None  # over budget too
    r.discard_source(1)
    assert r.buffered(1) == (0, 0)


def test_unknown_groups_are_recognised() -> None:
    r = strict()
    r.newest_group = 3
    r.group_window = 10
    assert "no group has" in feed(r, 1, m(0, group="zz")).violation
    assert "no group has" in feed(r, 1, m(0, group=-1)).violation
    assert "beyond the newest" in feed(r, 1, m(0, group=14)).violation
    assert feed(r, 1, m(0, group=13)).violation is None  # a group this rank may create soon: buffered
    r.foreign_group(2)
    assert "not a member" in feed(r, 1, m(0, group=2)).violation
    assert "rank 5 is not a member" in feed(r, 5, m(0, group=0)).violation
    r.forget_group(2, lambda rc: RuntimeError("gone"))  # (a mesh destroys the slices without this rank at once)
    assert "not a member" in feed(r, 1, m(0, group=2)).violation  # still impossible, not a late frame


def test_frames_of_a_destroyed_group_are_dropped_without_blame_and_never_buffered() -> None:
    r = strict()
    feed(r, 1, m(0))
    r.forget_group(0, lambda rc: RuntimeError("gone"))
    assert r.buffered(1) == (0, 0)
    for i in range(100):
        res = feed(r, 1, m(i), b"abc")
        assert res.violation is None and res.drop
    assert r.buffered(1) == (0, 0) and r.dropped_destroyed == 100
    r.know_group(0, (0, 1, 2))  # a group id known again (a new world in the same router) works again
    assert not feed(r, 1, m(0)).drop


def test_impossible_sequence_numbers() -> None:
    r = strict()
    r.seq_window = 100
    assert "without a sequence number" in feed(r, 1, {"t": "m", "g": 0, "k": ["a"]}).violation
    assert "without a sequence number" in feed(r, 1, {"t": "m", "g": 0, "k": [-3]}).violation
    assert "without a sequence number" in feed(r, 1, {"t": "m", "g": 0}).violation
    assert "more than 100 beyond" in feed(r, 1, m(101)).violation
    assert feed(r, 1, m(100)).violation is None
    rc, _ = keyed(1, (500, 0))
    r.post_keyed(rc)  # this rank reached seq 500: the window moves
    assert feed(r, 1, m(600)).violation is None
    # a duplicate of a buffered message
    assert "a second message" in feed(r, 1, m(100)).violation
    # a seq retired here: dropped, counted, not buffered, nobody blamed
    r.retire(0, 50)
    before = r.buffered(1)
    late = feed(r, 1, m(49), b"abc")
    assert late.violation is None and late.drop and late.late and r.late_from == {1: 1}
    assert r.buffered(1) == before
    assert feed(r, 1, m(50)).violation is None and r.late_from == {1: 1}


def test_duplicate_and_far_ahead_point_to_point_numbers() -> None:
    r = strict()
    r.seq_window = 10
    p = lambda n: {"t": "p", "g": 0, "tag": 7, "n": n}  # noqa: E731
    assert feed(r, 1, p(0)).violation is None
    assert "duplicate" in feed(r, 1, p(0)).violation
    assert feed(r, 1, p(3)).violation is None
    assert "duplicate" in feed(r, 1, p(3)).violation  # held already
    assert "ahead of the next one expected" in feed(r, 1, p(12)).violation
    assert "number 'x'" in feed(r, 1, p("x")).violation


def test_skip_frames_are_vetted_like_the_messages_they_stand_for() -> None:
    """A peer's skip frames touch only its own stream, within the window; one with a payload buffers nothing."""
    r = strict()
    r.seq_window = 10
    skip = lambda n, src_tag=7: {"t": "p", "g": 0, "tag": src_tag, "n": n, "skip": 1}  # noqa: E731
    assert "ahead of the next one expected" in feed(r, 1, skip(12)).violation
    assert "number 'x'" in feed(r, 1, skip("x")).violation
    assert feed(r, 1, skip(0), b"junk").violation is None  # (a payload on a skip: dropped with it)
    assert feed(r, 1, skip(0)).drop  # stale: number 0 is behind us now, and that is no offence
    held = feed(r, 1, skip(2), b"junk")
    assert held.violation is None and r.buffered(1) == (1, 4)  # held ahead, charged like any early frame
    assert feed(r, 1, skip(1)).violation is None  # 1 and the held 2 are passed over ...
    assert r.buffered(1) == (0, 0)
    assert feed(r, 1, {"t": "p", "g": 0, "tag": 7, "n": 3}, b"m").violation is None  # ... 3 is next: queued
    assert r.buffered(1) == (1, 1)
    assert feed(r, 2, {"t": "p", "g": 0, "tag": 7, "n": 0}, b"o").violation is None  # rank 2's stream untouched
    assert feed(r, 1, skip(0, src_tag=8)).violation is None  # another tag's stream: its own numbers
    assert feed(r, 1, {"t": "p", "g": 0, "tag": 8, "n": 1}).violation is None


def test_conflicting_arrival_is_the_public_form_of_arrived_sigs() -> None:
    r = Router()
    feed(r, 1, m(4, sig="all_reduce"))
    feed(r, 2, m(4, sig="broadcast"))
    assert r.conflicting_arrival(0, 4, "all_reduce") == (2, "broadcast")
    assert r.conflicting_arrival(0, 4, "all_reduce", sources=[0, 1]) is None
    assert r.conflicting_arrival(0, 4, "broadcast", sources=[0, 1, 2]) == (1, "all_reduce")
    assert r.conflicting_arrival(0, 5, "x") is None
    t = r.table
    assert t.ops.arrived[t.ops.seqs[(0, 4)].first[2]].header["o"] == "broadcast"  # the private table still works
    assert r.conflicting_arrival(0, 4, "all_reduce", sources={2: 0}) == (2, "broadcast")  # any container


def test_conflicting_arrival_costs_what_is_buffered_not_the_group_size() -> None:
    # A group's check after each collective passes its members: with 10**12 of them a scan
    # over the sources (what it did, O(N) per collective, O(N^2) per step at N ranks) never ends.
    r = Router()
    feed(r, 7, m(4, sig="broadcast"))
    everyone = range(10**12)
    assert r.conflicting_arrival(0, 4, "all_reduce", sources=everyone) == (7, "broadcast")
    assert r.conflicting_arrival(0, 4, "broadcast", sources=everyone) is None
    assert r.conflicting_arrival(0, 3, "all_reduce", sources=everyone) is None


def test_a_mismatch_report_fails_the_seq_from_every_source() -> None:
    r = Router()
    sinks = []
    for src in (1, 2, 3):
        rc, s = keyed(src, (7, 0))
        r.post_keyed(rc)
        sinks.append(s)
    other, so = keyed(1, (8, 0))
    r.post_keyed(other)
    r.fail_seq(0, 7, None, lambda rc: CollectiveMismatchError("reported by rank 1"))
    assert all(isinstance(s.results[0], CollectiveMismatchError) for s in sinks)
    assert so.results == []  # another seq is not affected
    later, sl = keyed(3, (7, 1))
    r.post_keyed(later)
    assert isinstance(sl.results[0], CollectiveMismatchError)


def test_a_mismatch_report_fails_the_later_operations_of_the_group_too() -> None:
    r = Router()
    before, sb = keyed(1, (6, 0))
    after, sa = keyed(2, (8, 0))
    r.post_keyed(before)
    r.post_keyed(after)
    r.fail_from(0, 7, lambda: CollectiveMismatchError("reported"))
    assert sb.results == [] and isinstance(sa.results[0], CollectiveMismatchError)
    later, sl = keyed(3, (9, 2))
    r.post_keyed(later)
    assert isinstance(sl.results[0], CollectiveMismatchError)
    other_group, so = keyed(1, (9, 0), group=5)
    r.post_keyed(other_group)
    assert so.results == []
