"""Shared memory pieces without sockets: ring bookkeeping, segments, shared arrays, peer watch, host and mode choice."""

from __future__ import annotations

import contextvars
import gc
import os
from typing import Any

import numpy as np
import pytest

import aiodist
from aiodist.context import new_rank_scope, set_rank_environ
from aiodist.net.base import Network
from aiodist.net.shmnet import HostNetwork
from aiodist.net.shmhost import choose_network, host_id, is_real_network, transport_mode, uses_shared_memory
from aiodist.net.shmring import RingSpace
from aiodist.net.shmseg import PeerWatch, Segment, SegmentRef, SharedMemoryError
from aiodist.net.tcp import TCPNetwork
from aiodist.shared import locate


def in_env(env: dict[str, str], fn: Any) -> Any:
    ctx = contextvars.copy_context()

    def go() -> Any:
        set_rank_environ(env)
        new_rank_scope()
        return fn()

    return ctx.run(go)


# ------------------------------------------------------------------ ring


def test_pieces_never_wrap_and_never_exceed_the_free_space() -> None:
    ring = RingSpace(100, 40)
    assert ring.place(30) == (0, 30)
    assert ring.place(100) == (30, 40)  # capped by the piece size
    assert ring.place(100) == (70, 30)  # cut at the end of the ring, not wrapped
    assert ring.place(5) == (0, 0)  # full
    ring.release(30)
    assert ring.free == 30
    assert ring.place(50) == (0, 30)  # the freed space at the front
    assert ring.place(1)[1] == 0
    ring.release(40)
    assert ring.place(50) == (30, 40)  # behind the newest piece: never overtaking the oldest
    for n in (30, 30, 40):
        ring.release(n)
    assert ring.in_flight == 0 and ring.free == 100


def test_an_empty_ring_starts_again_at_its_beginning() -> None:
    ring = RingSpace(1000, 1000)
    for _ in range(5):  # a request and its reply, again and again: always the same pages
        assert ring.place(300) == (0, 300)
        ring.release(300)
    ring.place(300)
    assert ring.place(300) == (300, 300)


def test_an_acknowledgement_that_is_not_the_oldest_piece_is_refused() -> None:
    ring = RingSpace(64, 64)
    ring.place(10)
    ring.place(20)
    with pytest.raises(ValueError):
        ring.release(20)
    ring.release(10)
    with pytest.raises(ValueError):
        ring.release(0)
    ring.release(20)
    with pytest.raises(ValueError):
        ring.release(1)  # nothing in flight
    with pytest.raises(ValueError):
        RingSpace(10, 20)


# ------------------------------------------------------------------ segments


def test_a_segment_attached_through_its_ref_shares_memory_and_is_named_in_the_maps() -> None:
    seg = Segment.create(10_000, name="aiodist-test")
    assert seg.ref.size % os.sysconf("SC_PAGE_SIZE") == 0 and seg.ref.size >= 10_000
    other = Segment.attach(SegmentRef.unpack(seg.ref.pack()))
    try:
        a = seg.array(np.float64, 8, 10)
        b = other.array(np.float64, 8, 10)
        a[:] = np.arange(10)
        assert b.tolist() == list(range(10))
        with open("/proc/self/maps") as f:
            assert sum("aiodist-test" in line for line in f) == 2
    finally:
        del a, b
        seg.close()
        other.close()
    with open("/proc/self/maps") as f:
        assert not any("aiodist-test" in line for line in f)


def test_attaching_a_reused_descriptor_number_or_a_dead_process_fails_cleanly() -> None:
    seg = Segment.create(4096)
    ref = seg.ref
    seg.close()
    other = Segment.create(4096)  # may well reuse the descriptor number
    try:
        with pytest.raises(SharedMemoryError) as info:
            Segment.attach(SegmentRef(ref.pid, other.ref.fd, ref.ino, ref.size))
        assert info.value.reason == "stale"
    finally:
        other.close()
    with pytest.raises(SharedMemoryError):
        Segment.attach(SegmentRef(2**22 + 12345, 3, 1, 4096))  # no such process
    with pytest.raises(SharedMemoryError):
        SegmentRef.unpack([1, 2, "x", 4])


def test_closing_a_segment_with_live_arrays_keeps_them_valid_and_closes_the_descriptor() -> None:
    seg = Segment.create(4096)
    fd = seg.ref.fd
    arr = seg.array(np.int32, 0, 4)
    arr[:] = 7
    seg.close()
    assert arr.tolist() == [7] * 4
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(SharedMemoryError):
        seg.array(np.int32, 0, 4)


# ------------------------------------------------------------------ shared arrays


def test_shared_arrays_are_plain_arrays_that_locate_and_free_their_memory() -> None:
    x = aiodist.empty((3, 5), np.float32)
    assert type(x) is np.ndarray and x.shape == (3, 5) and x.dtype == np.float32
    assert not x.any()
    assert aiodist.is_shared(x) and aiodist.is_shared(x[1:]) and not aiodist.is_shared(np.zeros(3))
    ref, offset = locate(x[1])  # type: ignore[misc]
    assert offset == 5 * 4
    y = aiodist.shared_array(np.arange(6).reshape(2, 3))
    assert y.tolist() == [[0, 1, 2], [3, 4, 5]] and aiodist.is_shared(y)
    z = aiodist.zeros(0, np.int64)
    assert z.size == 0 and aiodist.is_shared(z)
    seen = Segment.attach(ref).array(np.float32, offset, 5)
    x[1] = 9
    assert seen.tolist() == [9.0] * 5
    fd = ref.fd
    del x, seen
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # the last view went: so did the descriptor
    with pytest.raises(ValueError):
        aiodist.empty((-1,))


# ------------------------------------------------------------------ peer watch


class _Watcher:
    def __init__(self) -> None:
        self.gone: list[int] = []

    def cb(self, pid: int) -> None:
        self.gone.append(pid)


def test_the_watch_fires_once_the_last_connection_to_a_pid_closes() -> None:
    peers = PeerWatch()
    w = _Watcher()
    peers.opened(11)
    peers.opened(11)  # a duplicate connection, dropped later
    peers.watch(11, w.cb)
    peers.closed(11)
    assert w.gone == []
    peers.closed(11)
    assert w.gone == [11]
    peers.opened(11)
    peers.closed(11)
    assert w.gone == [11]  # once


def test_the_watch_holds_its_callbacks_weakly() -> None:
    peers = PeerWatch()
    w = _Watcher()
    peers.opened(5)
    peers.watch(5, w.cb)
    del w
    gc.collect()
    peers.closed(5)  # nothing to call, nothing raised


# ------------------------------------------------------------------ host and mode


def test_host_id_is_stable_and_overridable_per_rank() -> None:
    assert host_id() == host_id() and len(host_id()) == 16
    assert in_env({"AIODIST_HOST_ID": "node-a"}, host_id) == "node-a"
    assert in_env({"AIODIST_HOST_ID": "a/b"}, host_id) == "a_b"  # (part of a socket name)


def test_the_mode_comes_from_the_argument_then_the_environment() -> None:
    assert in_env({}, transport_mode) == "auto"
    assert in_env({"AIODIST_TRANSPORT": "TCP"}, transport_mode) == "tcp"
    assert in_env({"AIODIST_TRANSPORT": "tcp"}, lambda: transport_mode("auto")) == "auto"
    with pytest.raises(ValueError, match="AIODIST_TRANSPORT='infiniband'"):
        in_env({"AIODIST_TRANSPORT": "infiniband"}, transport_mode)
    with pytest.raises(ValueError, match="transport='shm!'"):
        transport_mode("shm!")


def test_real_tcp_gains_shared_memory_unless_told_otherwise_and_the_simulator_never() -> None:
    tcp = TCPNetwork()
    net = in_env({"AIODIST_HOST_ID": "h1"}, lambda: choose_network(tcp))
    assert isinstance(net, HostNetwork) and net.tcp is tcp and net.host_id == "h1"
    assert uses_shared_memory(net) and is_real_network(net) and is_real_network(tcp)
    assert in_env({"AIODIST_TRANSPORT": "tcp"}, lambda: choose_network(tcp)) is tcp
    assert choose_network(tcp, mode="tcp") is tcp


    class Simulated(Network):  # what the simulator's network is to the runtime: another Network
        async def connect(self, address: Any, *, timeout: float | None = None) -> Any: ...
        async def listen(self, address: Any, handler: Any, **kw: Any) -> Any: ...
        def default_host(self) -> str:
            return "sim"

    other = Simulated()
    assert choose_network(other) is other and not is_real_network(other)
