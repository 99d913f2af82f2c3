"""The peer transport over real TCP: lazy connections, one per pair, hello checks, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from aiodist.comm import GroupComm, OpChannel, Transport
from aiodist.errors import PeerFailureError, PeerRefusedError
from aiodist.store import MemoryStore


async def start(
    n: int, store: Any, *, job: str = "job", ranks: range | None = None, timeout: float = 5.0, mode: str | None = None
) -> list[Transport]:
    return [
        await Transport.start(rank=r, world_size=n, job_id=job, store=store, key_prefix="t/", timeout=timeout, mode=mode)
        for r in (ranks if ranks is not None else range(n))
    ]


@pytest.fixture
async def closing() -> AsyncIterator[list[Transport]]:
    made: list[Transport] = []
    yield made
    for t in made:
        await t.close()


def channel(t: Transport, n: int, seq: int = 0, gid: int = 0) -> OpChannel:
    t.register_group(gid, tuple(range(n)))
    return OpChannel(GroupComm(t, gid, tuple(range(n)), name="test"), op="test", seq=seq, sig="test")


async def test_connections_are_lazy_only_where_messages_flow(closing: list[Transport]) -> None:
    n = 6
    ts = await start(n, MemoryStore())
    closing.extend(ts)
    chans = [channel(t, n) for t in ts]

    async def ring(r: int) -> int:
        out = np.empty(1, np.int64)
        await asyncio.gather(
            chans[r].send((r + 1) % n, ("ring",), np.array([r], np.int64)),
            chans[r].recv_into((r - 1) % n, ("ring",), memoryview(out).cast("B")),
        )
        return int(out[0])

    assert await asyncio.gather(*(ring(r) for r in range(n))) == [(r - 1) % n for r in range(n)]
    for r, t in enumerate(ts):
        assert t.connected_peers() == sorted({(r - 1) % n, (r + 1) % n})  # not a full mesh


async def test_simultaneous_dials_leave_exactly_one_connection_per_pair(closing: list[Transport]) -> None:
    for attempt in range(5):
        ts = await start(2, MemoryStore(), job=f"j{attempt}", mode="tcp")  # (looks at the TCP sockets)
        closing.extend(ts)
        a, b = (channel(t, 2) for t in ts)
        bufs = [np.empty(8, np.uint8) for _ in range(2)]
        await asyncio.gather(
            a.send(1, ("x",), np.full(8, 1, np.uint8)),
            b.send(0, ("x",), np.full(8, 2, np.uint8)),
            a.recv_into(1, ("x",), memoryview(bufs[0])),
            b.recv_into(0, ("x",), memoryview(bufs[1])),
        )
        assert bufs[0].tolist() == [2] * 8 and bufs[1].tolist() == [1] * 8
        conn_a, conn_b = ts[0]._peers[1].conn, ts[1]._peers[0].conn
        assert conn_a is not None and conn_b is not None
        # the same TCP connection seen from both ends: each end's peer is the other's local address
        sock_a = conn_a._transport.get_extra_info("sockname")  # type: ignore[attr-defined]
        sock_b = conn_b._transport.get_extra_info("sockname")  # type: ignore[attr-defined]
        assert conn_a.peer == f"{sock_b[0]}:{sock_b[1]}" and conn_b.peer == f"{sock_a[0]}:{sock_a[1]}"


async def test_a_connection_of_another_job_is_refused(closing: list[Transport]) -> None:
    store = MemoryStore()
    (current,) = await start(2, store, job="job-2", ranks=range(0, 1))
    (stale,) = await start(2, store, job="job-1", ranks=range(1, 2))
    closing.extend([current, stale])
    ch = channel(stale, 2)
    with pytest.raises(PeerRefusedError) as ei:
        await ch.send(0, ("x",), b"hi")
    assert ei.value.rank == 0 and "wrong job" in ei.value.reason and "job-1" in ei.value.reason
    assert current.connected_peers() == []


async def test_payload_of_a_posted_receive_lands_in_the_callers_buffer(closing: list[Transport]) -> None:
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    a, b = (channel(t, 2) for t in ts)
    await a.send(1, ("warm",), b"")  # connect first
    await b.recv_into(0, ("warm",), memoryview(bytearray()))
    sinks: list[Any] = []
    router = ts[1].router
    original = router.route

    def spy(src: int, header: dict[str, Any], nbytes: int) -> Any:
        m = original(src, header, nbytes)
        sinks.append(m.sink)
        return m

    router.route = spy  # type: ignore[method-assign]
    out = np.zeros(100_000, np.float64)
    view = memoryview(out).cast("B")
    recv = asyncio.ensure_future(b.recv_into(0, ("big",), view))
    await asyncio.sleep(0.01)  # the receive is posted before the message comes
    await a.send(1, ("big",), np.arange(100_000, dtype=np.float64))
    await recv
    assert sinks and sinks[-1] is view  # zero copy: the connection wrote into our buffer
    assert (out == np.arange(100_000)).all()


async def test_early_messages_wait_for_their_receive(closing: list[Transport]) -> None:
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    a, b = (channel(t, 2) for t in ts)
    for i in range(5):
        await a.send(1, ("early", i), np.array([i], np.int32))
    await asyncio.sleep(0.02)
    got = []
    for i in reversed(range(5)):
        out = np.empty(1, np.int32)
        await b.recv_into(0, ("early", i), memoryview(out).cast("B"))
        got.append(int(out[0]))
    assert got == [4, 3, 2, 1, 0]


async def test_a_broken_connection_fails_pending_and_later_operations(closing: list[Transport]) -> None:
    ts = await start(3, MemoryStore())
    closing.extend(ts)
    chans = [channel(t, 3) for t in ts]
    # 0 <-> 1 and 0 <-> 2 connected; 1 has never talked to 2
    for peer in (1, 2):
        await chans[0].send(peer, ("hi",), b"")
        await chans[peer].recv_into(0, ("hi",), memoryview(bytearray()))
    pending_0 = asyncio.ensure_future(chans[0].recv_into(2, ("never",), memoryview(bytearray(1))))
    pending_1 = asyncio.ensure_future(chans[1].recv_into(0, ("never",), memoryview(bytearray(1))))
    await asyncio.sleep(0.01)
    ts[2].abort()  # rank 2 crashes
    async with asyncio.timeout(3):
        with pytest.raises(PeerFailureError) as e0:
            await pending_0
        with pytest.raises(PeerFailureError) as e1:
            await pending_1  # waits on rank 0, but the group contains the dead rank 2: told by rank 0
    assert e0.value.rank == 2 and e0.value.how == "connection lost"
    assert e1.value.rank == 2 and "reported by rank 0" in (e1.value.how or "")
    with pytest.raises(PeerFailureError):
        await chans[0].send(2, ("later",), b"x")
    with pytest.raises(PeerFailureError):
        await chans[1].recv_into(0, ("later",), memoryview(bytearray(1)))


async def test_a_connection_with_another_world_size_or_rank_is_refused(closing: list[Transport]) -> None:
    store = MemoryStore()
    (listener,) = await start(2, store, ranks=range(0, 1))
    closing.append(listener)
    (odd,) = await start(3, store, ranks=range(2, 3))  # rank 2 of a 3-rank world
    closing.append(odd)
    ch = channel(odd, 3)
    with pytest.raises(PeerRefusedError) as ei:
        await ch.send(0, ("x",), b"hi")
    assert "world size 3" in ei.value.reason


def count_dials(t: Transport) -> list[int]:
    """Count the connections ``t`` dials (its network's connect calls)."""
    dials: list[int] = []
    net = t._net
    connect = net.connect

    async def counting(*args: Any, **kwargs: Any) -> Any:
        dials.append(1)
        return await connect(*args, **kwargs)

    t._net = type("CountingNetwork", (), {"connect": staticmethod(counting)})()  # type: ignore[assignment]
    return dials


async def test_a_symmetric_exchange_is_dialed_once_by_the_lower_rank(closing: list[Transport]) -> None:
    """Both ranks send to each other at once: only rank 0 dials; rank 1 waits for that connection
    instead of dialing too (which used to cost a second connection, answered "dup" and closed)."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    for t in ts:
        t._dial_defer = 5.0  # plenty for rank 0's connection to arrive, however slow the machine
    dials = [count_dials(t) for t in ts]
    a, b = (channel(t, 2) for t in ts)
    bufs = [np.empty(8, np.uint8) for _ in range(2)]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.gather(
        b.send(0, ("x",), np.full(8, 2, np.uint8)),  # the higher rank first: it must still not dial
        a.send(1, ("x",), np.full(8, 1, np.uint8)),
        a.recv_into(1, ("x",), memoryview(bufs[0])),
        b.recv_into(0, ("x",), memoryview(bufs[1])),
    )
    assert loop.time() - t0 < 4.0  # rank 1 used rank 0's connection, it did not wait out its deferral
    assert bufs[0].tolist() == [2] * 8 and bufs[1].tolist() == [1] * 8
    assert (len(dials[0]), len(dials[1])) == (1, 0)
    assert ts[0].connected_peers() == [1] and ts[1].connected_peers() == [0]


async def test_the_higher_rank_dials_itself_when_the_lower_one_never_does(closing: list[Transport]) -> None:
    """Rank 1 sends to rank 0, which neither sends nor waits yet: after the deferral rank 1 dials."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    ts[1]._dial_defer = 0.2
    dials = [count_dials(t) for t in ts]
    a, b = (channel(t, 2) for t in ts)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await b.send(0, ("y",), np.arange(4, dtype=np.uint8))
    took = loop.time() - t0
    out = np.empty(4, np.uint8)
    await a.recv_into(1, ("y",), memoryview(out))
    assert out.tolist() == [0, 1, 2, 3]
    assert 0.2 <= took < 3.0, took
    assert (len(dials[0]), len(dials[1])) == (0, 1)


async def test_a_receive_from_a_higher_rank_dials_it_at_once(closing: list[Transport]) -> None:
    """Rank 0 waits for rank 1, which only sends later (after hearing from rank 2, say): rank 0 dials
    when its receive is posted, so rank 1's send finds the connection and need not wait out its deferral."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    ts[1]._dial_defer = 5.0
    dials = [count_dials(t) for t in ts]
    a, b = (channel(t, 2) for t in ts)
    out = np.empty(4, np.uint8)
    recv = asyncio.ensure_future(a.recv_into(1, ("w",), memoryview(out)))
    for _ in range(200):
        if ts[1].connected_peers() == [0]:
            break
        await asyncio.sleep(0.01)
    assert ts[1].connected_peers() == [0]  # rank 0 connected before rank 1 had anything to send
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await b.send(0, ("w",), np.arange(4, dtype=np.uint8))
    await recv
    assert loop.time() - t0 < 2.0
    assert out.tolist() == [0, 1, 2, 3] and (len(dials[0]), len(dials[1])) == (1, 0)


async def test_a_deferred_dial_to_a_lower_rank_that_is_gone_still_fails_fast(closing: list[Transport]) -> None:
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    ts[1]._dial_defer = 0.1
    await ts[0].close()  # rank 0 is gone: nobody listens at its address
    with pytest.raises(PeerFailureError) as ei:
        await channel(ts[1], 2).send(0, ("z",), b"hi")
    assert ei.value.rank == 0 and "unreachable" in str(ei.value)


async def test_heartbeat_watchers_start_only_after_the_first_interval(closing: list[Transport]) -> None:
    """A connection costs no watcher task during its first heartbeat interval; heartbeats then flow."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    for t in ts:
        t.configure_heartbeat(interval=0.1, misses=50)
    a, b = (channel(t, 2) for t in ts)
    await a.send(1, ("hi",), b"")
    await b.recv_into(0, ("hi",), memoryview(bytearray()))

    def watchers(t: Transport) -> int:
        return sum(1 for task in t._tasks if "_watch" in task.get_coro().__qualname__)  # type: ignore[union-attr]

    assert [watchers(t) for t in ts] == [0, 0]
    heard = ts[1]._peers[0].last_heard
    await asyncio.sleep(0.35)
    assert [watchers(t) for t in ts] == [1, 1]
    assert ts[1]._peers[0].last_heard > heard  # rank 0's heartbeats arrive
    assert ts[0].failed_peers() == [] and ts[1].failed_peers() == []
