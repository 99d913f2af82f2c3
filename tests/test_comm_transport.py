"""The peer transport over real TCP: lazy connections, one per pair, hello checks, failures."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from transports import channel, closing  # noqa: F401 (closing: a fixture)
from transports import start_transports as start

from aiodist.comm import Transport
from aiodist.comm import frames
from aiodist.comm.router import Router
from aiodist.errors import PeerFailureError, PeerRefusedError
from aiodist.store import MemoryStore


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


async def test_payload_of_a_posted_receive_lands_in_the_callers_buffer(
    closing: list[Transport], monkeypatch: pytest.MonkeyPatch
) -> None:
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    a, b = (channel(t, 2) for t in ts)
    await a.send(1, ("warm",), b"")  # connect first
    await b.recv_into(0, ("warm",), memoryview(bytearray()))
    sinks: list[Any] = []
    router = ts[1].router
    original = Router.route

    def spy(self: Router, src: int, header: dict[str, Any], nbytes: int) -> Any:
        m = original(self, src, header, nbytes)
        if self is router:
            sinks.append(m.sink)
        return m

    monkeypatch.setattr(Router, "route", spy)  # (on the class: routers are slotted)
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
    assert e0.value.rank == 2 and (e0.value.how or "").startswith("connection lost")  # (and what broke it, if said)
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
    net = t._links._net
    connect = net.connect

    async def counting(*args: Any, **kwargs: Any) -> Any:
        dials.append(1)
        return await connect(*args, **kwargs)

    t._links._net = type("CountingNetwork", (), {"connect": staticmethod(counting)})()  # type: ignore[assignment]
    return dials


async def test_a_symmetric_exchange_is_dialed_once_by_the_lower_rank(closing: list[Transport]) -> None:
    """Both ranks send to each other at once: only rank 0 dials; rank 1 waits for that connection
    instead of dialing too (which used to cost a second connection, answered "dup" and closed)."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    for t in ts:
        t.links.dial_defer = 5.0  # plenty for rank 0's connection to arrive, however slow the machine
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
    ts[1].links.dial_defer = 0.2
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
    ts[1].links.dial_defer = 5.0
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
    ts[1].links.dial_defer = 0.1
    await ts[0].close()  # rank 0 is gone: nobody listens at its address
    with pytest.raises(PeerFailureError) as ei:
        await channel(ts[1], 2).send(0, ("z",), b"hi")
    assert ei.value.rank == 0 and "unreachable" in str(ei.value)


async def test_heartbeats_cost_no_task_per_connection_and_flow_both_ways(
    closing: list[Transport], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One heartbeat timer per rank, not a watcher task per connection; heartbeat frames flow both ways."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    for t in ts:
        t.configure_heartbeat(interval=0.1, misses=50)
    a, b = (channel(t, 2) for t in ts)
    await a.send(1, ("hi",), b"")
    await b.recv_into(0, ("hi",), memoryview(bytearray()))
    beats = {0: 0, 1: 0}
    original = Transport._on_control

    def spy(self: Transport, p: Any, kind: Any, h: dict[str, Any]) -> None:
        if any(self is t for t in ts):
            beats[self.rank] += kind == frames.HEARTBEAT
        original(self, p, kind, h)

    monkeypatch.setattr(Transport, "_on_control", spy)  # (on the class: transports are slotted)
    tasks = [len(t._links._tasks) for t in ts]
    await asyncio.sleep(0.45)
    assert [len(t._links._tasks) for t in ts] == tasks  # (rank 0's dial task reads the connection; nothing else)
    assert beats[0] >= 2 and beats[1] >= 2, beats
    assert ts[0].failed_peers() == [] and ts[1].failed_peers() == []


async def test_a_rank_declared_silent_is_told_before_it_is_hung_up_on(closing: list[Transport]) -> None:
    """What a stopped rank finds when it resumes: the notice comes before the end of the connection, so
    it blames itself (EvictedError naming its own rank), not the healthy peer that hung up on it."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    a, b = (channel(t, 2) for t in ts)
    await a.send(1, ("hi",), b"")
    await b.recv_into(0, ("hi",), memoryview(bytearray()))
    pending = asyncio.ensure_future(b.recv_into(0, ("never",), memoryview(bytearray(1))))
    await asyncio.sleep(0.01)
    ts[0]._links._silent(1, "hung or unreachable: heard nothing for 3.0s")  # (what the detector would decide)
    with pytest.raises(PeerFailureError) as e:
        await asyncio.wait_for(pending, 5)
    assert type(e.value).__name__ == "EvictedError" and e.value.global_rank == 1
    assert "declared failed by its peers" in str(e.value) and "heard nothing" in str(e.value)
    for _ in range(200):  # then the end of the connection
        if 0 in ts[1].failed_peers():
            break
        await asyncio.sleep(0.01)
    assert ts[1].failed_peers() == [0, 1] and ts[0].failed_peers() == [1]
    assert type(ts[1].peer_error(0)).__name__ == "EvictedError"  # rank 0 hung up because of it


async def _stalled_rank(t: Transport, rank: int, secret: bytes) -> asyncio.StreamWriter:
    """A rank ``rank`` that shakes hands with ``t`` (it knows the secret) and then never reads again."""
    import os

    from aiodist.comm.connect import format_address
    from aiodist.comm.handshake import DialHandshake, Verdict
    from aiodist.wire import PREAMBLE, FrameDecoder, encode_frame

    assert t.address is not None
    reader, writer = await asyncio.open_connection(*t.address)
    writer.write(PREAMBLE)
    decoder = FrameDecoder()
    hs = DialHandshake(secret, job=t.job_id, rank=rank, world=t.world_size, peer_rank=t.rank,
                       address=format_address(t.address), nonce=os.urandom(32))

    async def reply() -> dict[str, Any]:
        while True:
            data = await asyncio.wait_for(reader.read(1), 5)  # (a byte at a time: nothing read past the verdict)
            assert data, "closed during the handshake"
            got = decoder.feed(data)
            if got:
                return got[0][0]

    writer.write(encode_frame(hs.hello())[0])
    answer = hs.on_reply(await reply())
    assert isinstance(answer, dict)
    writer.write(encode_frame(answer)[0])
    assert hs.on_verdict(await reply()).verdict is Verdict.WELCOME
    return writer  # (its reader is never read again: the kernel's buffers fill up, then the sender's)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_cancelled_large_send_leaves_no_reference_to_the_callers_buffer(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam promises "queued whole or not at all": a send cancelled while its payload is still queued
    (the peer does not read) leaves the connection holding no reference to that payload (the caller may
    reuse it at once), and the link stays up: the connection hands the kernel only what it takes at once.
    (uvloop and asyncio >= 3.12 would otherwise write a large payload without copying it.)"""
    import gc
    import weakref

    uvloop = pytest.importorskip("uvloop") if loop == "uvloop" else None
    secret = b"test secret"

    async def main() -> tuple[bool, list[int]]:
        t = await Transport.start(rank=0, world_size=2, job_id="job", store=MemoryStore(), key_prefix="t/",
                                  timeout=5.0, secret=secret)
        try:
            writer = await _stalled_rank(t, 1, secret)
            for _ in range(200):
                if t.connected_peers() == [1]:
                    break
                await asyncio.sleep(0.01)
            data = np.ones(64 << 17)  # 64 MiB: more than the kernel's buffers take
            ref = weakref.ref(data)
            pending = t.send_soon(1, {"t": "m", "g": 0, "k": (0, "big"), "o": "test"}, data, 0)
            assert pending is not None
            task = asyncio.ensure_future(pending)
            await asyncio.sleep(0.1)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            del data, pending, task
            for _ in range(5):
                gc.collect()
                await asyncio.sleep(0.01)
            writer.close()
            return ref() is None, t.failed_peers()
        finally:
            await t.close()

    factory = uvloop.new_event_loop if uvloop is not None else None
    with asyncio.Runner(loop_factory=factory) as runner:
        released, failed = runner.run(main())
    assert released, "the connection still holds the cancelled send's payload"
    assert failed == []  # (nothing had to be reset)


async def test_a_mismatch_report_connects_if_needed(closing: list[Transport]) -> None:
    """report_mismatch is fire and forget, and reaches a rank this one never talked to."""
    from aiodist.errors import CollectiveMismatchError

    ts = await start(3, MemoryStore())
    closing.extend(ts)
    chans = [channel(t, 3) for t in ts]
    pending = asyncio.ensure_future(chans[2].recv_into(1, ("x",), memoryview(bytearray(1))))  # rank 2 waits on 1
    await asyncio.sleep(0.01)
    assert ts[0].connected_peers() == []
    ts[0].report_mismatch(2, 0, 0, "rank 0 called broadcast", {0: "broadcast", 2: "all_reduce"})
    with pytest.raises(CollectiveMismatchError) as e:
        await asyncio.wait_for(pending, 5)
    assert "reported by rank 0" in str(e.value) and ts[0].connected_peers() == [2]
