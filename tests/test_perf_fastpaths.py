"""The hot-path shortcuts of the TCP transport keep their semantics.

* a large keyed payload that arrives before its receive waits in the socket
  (DEFER) and is then written straight into the receive's buffer; a receive
  that comes too late still gets it, and frames behind it are not held up;
* the first frame of a loop iteration is written at once, later ones in the
  same iteration are coalesced, order is kept;
* the frame-handler fast path delivers queued frames first, in order;
* a failed header encoding leaves the shared msgpack packer clean;
* router.freeze makes nested keys hashable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from aiodist.comm import GroupComm, OpChannel, Transport
from aiodist.comm import transport as transport_mod
from aiodist.comm.router import freeze
from aiodist.net.base import Frame
from aiodist.net.tcp import TCPNetwork
from aiodist.store import MemoryStore
from aiodist.wire import DEFER, FrameDecoder, encode_frame, encode_header

BIG = 1 << 20  # above DEFER_MIN_BYTES


@pytest.fixture
async def pair() -> AsyncIterator[tuple[list[Transport], OpChannel, OpChannel]]:
    store = MemoryStore()
    ts = [
        await Transport.start(rank=r, world_size=2, job_id="perf", store=store, key_prefix="t/", timeout=5.0, mode="tcp")
        for r in range(2)
    ]
    chans = []
    for t in ts:
        t.register_group(0, (0, 1))
        chans.append(OpChannel(GroupComm(t, 0, (0, 1), name="test"), op="test", seq=0, sig="test"))
    await chans[0].send(1, ("warm",), b"")  # connect first
    await chans[1].recv_into(0, ("warm",), memoryview(bytearray()))
    yield ts, chans[0], chans[1]
    for t in ts:
        await t.close()


def _spy_resume(t: Transport) -> list[Any]:
    """Record the targets handed to resume_payload on t's connections."""
    seen: list[Any] = []
    for p in t._peers.values():
        conn = p.conn
        if conn is None:
            continue
        original = conn.resume_payload  # type: ignore[attr-defined]

        def spy(target: Any, original: Any = original) -> None:
            seen.append(target)
            original(target)

        conn.resume_payload = spy  # type: ignore[attr-defined]
    return seen


async def test_an_early_large_payload_waits_in_the_socket_and_lands_in_place(pair: Any) -> None:
    ts, a, b = pair
    seen = _spy_resume(ts[1])
    data = np.arange(BIG // 8, dtype=np.float64)
    send = asyncio.ensure_future(a.send(1, ("big",), data))
    for _ in range(200):  # until the header has arrived and the payload was deferred
        await asyncio.sleep(0.001)
        if ts[1]._deferred:
            break
    assert ts[1]._deferred, "the early large payload was not deferred"
    out = np.zeros_like(data)
    view = memoryview(out).cast("B")
    await b.recv_into(0, ("big",), view)
    await send
    assert (out == data).all()
    assert len(seen) == 1 and seen[0] is view  # read straight into the receive's buffer
    assert not ts[1]._deferred


async def test_a_deferred_payload_falls_back_to_a_new_buffer_and_unblocks_what_follows(pair: Any) -> None:
    ts, a, b = pair
    seen = _spy_resume(ts[1])
    data = np.arange(BIG // 4, dtype=np.int32)
    await asyncio.gather(a.send(1, ("big",), data), a.send(1, ("small",), np.array([7], np.int32)))
    small = np.zeros(1, np.int32)
    # The small frame is behind the deferred big one on the same connection: it still arrives.
    await asyncio.wait_for(b.recv_into(0, ("small",), memoryview(small).cast("B")), 5)
    assert small[0] == 7
    assert seen == [None]  # the fallback: a new buffer after DEFER_TIMEOUT
    out = np.zeros_like(data)
    await b.recv_into(0, ("big",), memoryview(out).cast("B"))
    assert (out == data).all()


async def test_closing_with_a_deferred_payload_cancels_its_timer(pair: Any, monkeypatch: Any) -> None:
    ts, a, b = pair
    monkeypatch.setattr(transport_mod, "DEFER_TIMEOUT", 60.0)
    await a.send(1, ("big",), np.zeros(BIG, np.uint8))
    for _ in range(200):
        await asyncio.sleep(0.001)
        if ts[1]._deferred:
            break
    timers = [e[3] for e in ts[1]._deferred.values()]
    assert timers
    await ts[1].close()
    assert not ts[1]._deferred and all(t.cancelled() for t in timers)


def test_decoder_defers_then_writes_into_the_target_and_goes_on() -> None:
    asked: list[int] = []

    def sink(header: dict[str, Any], n: int) -> Any:
        asked.append(n)
        return DEFER if header.get("defer") else None

    dec = FrameDecoder(expect_preamble=False, sink=sink)
    payload = bytes(range(256)) * 40
    raw = b"".join(h + (bytes(p) if p is not None else b"") for h, p in (encode_frame({"defer": 1}, payload), encode_frame({"i": 2}, b"xy")))
    assert dec.feed(raw[:50]) == []
    assert dec.awaiting_target
    rest = dec.feed(raw[50:])  # staged while waiting, nothing decoded past the deferred payload
    assert rest == [] and dec.awaiting_target
    target = memoryview(bytearray(len(payload)))
    frames = dec.provide_target(target)
    assert [h for h, _ in frames] == [{"defer": 1}, {"i": 2}]
    assert frames[0][1] is target and bytes(target) == payload
    assert bytes(frames[1][1]) == b"xy"
    assert not dec.awaiting_target
    with pytest.raises(RuntimeError):
        dec.provide_target(None)


def test_a_failed_header_encoding_leaves_the_packer_clean() -> None:
    with pytest.raises(TypeError):
        encode_header({"a": [1, object()]})
    assert encode_header({"a": 1}) == b"\x81\xa1a\x01"


def test_freeze_makes_nested_keys_hashable_and_keeps_flat_ones() -> None:
    flat = (1, "x", 2)
    assert freeze(flat) is flat
    assert freeze([1, "x", 2]) == flat
    nested = freeze([1, [2, [3, "a"]], (4, [5])])
    assert nested == (1, (2, (3, "a")), (4, (5,)))
    hash(nested)


async def test_sends_write_the_first_frame_at_once_and_coalesce_the_rest() -> None:
    net = TCPNetwork()
    got: list[Frame] = []
    done = asyncio.Event()

    async def handler(conn: Any) -> None:
        while len(got) < 50:
            got.append(await conn.recv())
        done.set()
        await asyncio.sleep(10)

    async with await net.listen(("127.0.0.1", 0), handler) as lis:
        conn = await net.connect(lis.address, timeout=5)
        writes: list[int] = []
        original = conn._transport.write  # type: ignore[attr-defined]

        def spy(data: Any) -> None:
            writes.append(len(data))
            original(data)

        conn._transport.write = spy  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        await conn.send({"i": 0}, b"a")
        assert len(writes) == 1  # written at once, not on a later loop iteration
        await asyncio.gather(*(conn.send({"i": i}, bytes([i])) for i in range(1, 50)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(writes) < 10  # the frames of one iteration went out together
        await asyncio.wait_for(done.wait(), 5)
        assert [f.header["i"] for f in got] == list(range(50))
        assert [bytes(f.payload) for f in got] == [b"a"] + [bytes([i]) for i in range(1, 50)]
        await conn.aclose()


async def test_frame_handler_gets_queued_frames_first_then_new_ones_in_order() -> None:
    net = TCPNetwork()
    server_conn: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def handler(conn: Any) -> None:
        server_conn.set_result(conn)
        await asyncio.sleep(10)

    async with await net.listen(("127.0.0.1", 0), handler) as lis:
        conn = await net.connect(lis.address, timeout=5)
        srv = await server_conn
        for i in range(3):
            await conn.send({"i": i})
        await asyncio.sleep(0.05)  # these three are queued (no handler yet)
        seen: list[int] = []
        srv.set_frame_handler(lambda f: seen.append(f.header["i"]))
        assert seen == [0, 1, 2]
        for i in range(3, 6):
            await conn.send({"i": i})
        for _ in range(100):
            if len(seen) == 6:
                break
            await asyncio.sleep(0.005)
        assert seen == list(range(6))
        conn.close()
        with pytest.raises(Exception):  # recv now only reports the end of the connection
            await asyncio.wait_for(srv.recv(), 5)


@pytest.mark.parametrize("p", [2, 3, 4])
async def test_ring_all_reduce_with_several_lanes_and_segments(p: int, monkeypatch: Any) -> None:
    # The default is one lane of large blocks; the multi-lane pipeline must stay correct.
    from aiodist.collectives import all_reduce, tuning
    from aiodist.collectives.memory import MemoryFabric

    monkeypatch.setattr(tuning, "RING_LANES", 3)
    monkeypatch.setattr(tuning, "RING_BLOCK_BYTES", 1024)
    n = 10_007
    arrays = [np.arange(n, dtype=np.int64) * (r + 1) for r in range(p)]
    fabric = MemoryFabric(p)
    await asyncio.gather(*(all_reduce(fabric.channel(r), 0, arrays[r], algorithm="ring") for r in range(p)))
    expected = np.arange(n, dtype=np.int64) * (p * (p + 1) // 2)
    for a in arrays:
        assert (a == expected).all()


def test_broadcast_keeps_the_tree_for_few_ranks_even_when_large() -> None:
    from aiodist.collectives import tuning

    assert tuning.choose_broadcast(4, 64 << 20) == "binomial"
    assert tuning.choose_broadcast(3, 1 << 20) == "binomial"
    assert tuning.choose_broadcast(5, 1 << 20) == "scatter_allgather"
    assert tuning.choose_broadcast(8, 1 << 10) == "binomial"
