"""The failure detector without a clock: missed intervals, signs of life, a late check, slow frames."""

from __future__ import annotations

import pytest

from aiodist.comm.detector import FailureDetector, Watch


def run(det: FailureDetector, start: float, checks: int) -> list[tuple[float, list[tuple[int, str]]]]:
    """``checks`` on-time checks every interval from ``start``: (time, declared) of each."""
    out = []
    for i in range(1, checks + 1):
        now = start + i * det.interval
        out.append((now, det.check(now, now)[1]))
    return out


def test_a_silent_peer_is_declared_after_misses_intervals_and_not_before() -> None:
    det = FailureDetector(0.5, 6)
    w = Watch(3)
    det.watch(w)
    results = run(det, 0.0, 7)
    declared = [(t, d) for t, d in results if d]
    assert len(declared) == 1
    when, [(rank, how)] = declared[0]
    assert rank == 3 and when == pytest.approx(3.5)  # the first check finds the watch's start, then 6 misses
    assert "heard nothing for 3.0s" in how and "6 missed" in how
    assert det.watching() == [] and det.check(10.0, 10.0) == ([], [])


def test_any_sign_of_life_starts_the_count_again_and_heartbeats_go_to_every_watched_peer() -> None:
    det = FailureDetector(1.0, 3)
    a, b = Watch(1), Watch(2)
    det.watch(a)
    det.watch(b)
    for i in range(1, 20):
        a.alive = True  # rank 1 keeps talking
        beats, declared = det.check(float(i), float(i))
        if i < 4:
            assert beats == [1, 2] and declared == []
    assert det.watching() == [1] and a.missed == 0


def test_a_late_check_blames_nobody_for_what_this_rank_did_not_hear() -> None:
    det = FailureDetector(0.5, 2)
    w = Watch(1)
    det.watch(w)
    det.check(0.5, 0.5)
    det.check(1.0, 1.0)
    assert w.missed == 1
    beats, declared = det.check(9.0, 1.5)  # our loop was blocked for 7.5 s
    assert declared == [] and w.missed == 0 and beats == [1]
    assert det.check(9.5, 9.5)[1] == []
    assert det.check(10.0, 10.0)[1] and det.watching() == []


def test_a_large_frame_buys_its_sender_the_time_it_needs() -> None:
    det = FailureDetector(0.5, 2)
    w = Watch(1)
    det.watch(w)
    w.slow_frame(0.1, 5.0)  # a frame that needs 5 s at the minimum bandwidth started at 0.1
    for t in (0.5, 1.0, 2.0, 3.0, 4.0, 5.0):
        assert det.check(t, t)[1] == [], t
    assert det.check(5.5, 5.5)[1] == []
    [(rank, how)] = det.check(6.0, 6.0)[1]
    assert rank == 1 and "heard nothing for 1.0s" in how


def test_unwatch_and_bad_settings() -> None:
    det = FailureDetector(0.2, 1)
    det.watch(Watch(4))
    det.unwatch(4)
    det.unwatch(4)
    assert det.check(5.0, 5.0) == ([], [])
    assert "every 0.2s" in repr(det) and repr(Watch(1)) == "<Watch 1 alive>"
    with pytest.raises(ValueError):
        FailureDetector(0, 3)
    with pytest.raises(ValueError):
        FailureDetector(1.0, 0)


def test_where_the_connection_counts_bytes_a_large_frame_buys_time_only_while_they_come() -> None:
    """Before, the header's length alone bought its sender the frame's time at the minimum bandwidth, even
    once its bytes had stopped (a peer stopped mid-frame, or one announcing more than it sends)."""
    det = FailureDetector(0.5, 2)
    w = Watch(1)
    det.watch(w)
    w.slow_frame(0.1, 1000.0)  # a header announcing a frame of 1000 s at the minimum bandwidth
    counts = {1: 10}
    for t in (0.5, 1.0, 1.5, 2.0):  # bytes keep coming
        counts[1] += 65536
        assert det.check(t, t, counts.get)[1] == [], t
    assert det.check(2.5, 2.5, counts.get)[1] == []  # they stopped: one interval missed
    [(rank, how)] = det.check(3.0, 3.0, counts.get)[1]
    assert rank == 1 and "heard nothing for 1.0s" in how


def test_where_nothing_is_counted_the_large_frame_rule_holds() -> None:
    det = FailureDetector(0.5, 2)
    w = Watch(1)
    det.watch(w)
    w.slow_frame(0.1, 5.0)
    nothing: dict[int, int | None] = {1: None}
    for t in (0.5, 1.0, 3.0, 5.0, 5.5):
        assert det.check(t, t, nothing.get)[1] == [], t
    assert det.check(6.0, 6.0, nothing.get)[1]
