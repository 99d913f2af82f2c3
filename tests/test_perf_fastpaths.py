"""The hot-path shortcuts of the TCP transport keep their semantics.

* a large keyed payload that arrives before its receive is read at once (the
  connection never pauses for it) and copied into the receive's buffer when it
  is posted; frames behind it are not held up; a payload whose receive is
  posted in time lands straight in the receive's buffer;
* the first frame of a loop iteration is written at once, later ones in the
  same iteration are coalesced, order is kept;
* the frame-handler fast path delivers queued frames first, in order;
* a failed header encoding leaves the shared msgpack packer clean;
* router.freeze makes nested keys hashable.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from transports import channel, start_transports

from aiodist.comm import OpChannel, Transport
from aiodist.comm import transport as transport_mod
from aiodist.comm.router import freeze
from aiodist.net.base import Frame
from aiodist.net.tcp import TCPNetwork
from aiodist.store import MemoryStore
from aiodist.wire import encode_header

BIG = 1 << 20


@pytest.fixture
async def pair() -> AsyncIterator[tuple[list[Transport], OpChannel, OpChannel]]:
    ts = await start_transports(2, MemoryStore(), job="perf", mode="tcp")
    chans = [channel(t, 2) for t in ts]
    await chans[0].send(1, ("warm",), b"")  # connect first
    await chans[1].recv_into(0, ("warm",), memoryview(bytearray()))
    yield ts, chans[0], chans[1]
    for t in ts:
        await t.close()


async def test_an_early_large_payload_is_taken_at_once_and_copied_into_its_receive_later(pair: Any) -> None:
    ts, a, b = pair
    data = np.arange(BIG // 8, dtype=np.float64)
    await a.send(1, ("big",), data)
    for _ in range(500):  # it is read off the connection although nobody waits for it yet
        if ts[1].router.buffered(0) == (1, BIG):
            break
        await asyncio.sleep(0.002)
    assert ts[1].router.buffered(0) == (1, BIG)
    out = np.zeros_like(data)
    await asyncio.wait_for(b.recv_into(0, ("big",), memoryview(out).cast("B")), 5)
    assert (out == data).all() and ts[1].router.buffered(0) == (0, 0)


async def test_frames_behind_an_early_large_payload_are_not_held_up(pair: Any, monkeypatch: Any) -> None:
    """The connection never pauses for a payload nobody waits for: a small frame behind it arrives at once
    (the removed deferral waited in the socket for the receive, up to its fallback timer, made long here)."""
    ts, a, b = pair
    monkeypatch.setattr(transport_mod, "DEFER_TIMEOUT", 60.0, raising=False)
    small = np.zeros(1, np.int32)
    recv = asyncio.ensure_future(b.recv_into(0, ("small",), memoryview(small).cast("B")))
    data = np.arange(BIG // 4, dtype=np.int32)
    await asyncio.gather(a.send(1, ("big",), data), a.send(1, ("small",), np.array([7], np.int32)))
    await asyncio.wait_for(recv, 5)
    assert small[0] == 7
    out = np.zeros_like(data)
    await b.recv_into(0, ("big",), memoryview(out).cast("B"))
    assert (out == data).all()


async def test_no_sink_answer_but_a_buffer_or_none(pair: Any) -> None:
    """The payload sink answers the posted receive's own buffer, or None (the connection allocates).

    (Asked again while a payload it declined arrives, it may name the buffer of a receive posted since.)
    """
    ts, a, b = pair
    answers: list[Any] = []
    p = ts[1]._peers[0]
    conn = p.conn
    assert conn is not None
    sink = functools.partial(ts[1]._sink, p)

    def spy(header: Any, nbytes: int, received: int) -> Any:
        answer = sink(header, nbytes, received)
        if not received:
            answers.append(answer)
        return answer

    conn.set_payload_sink(spy)
    out = np.zeros(BIG // 8, np.float64)
    view = memoryview(out).cast("B")
    recv = asyncio.ensure_future(b.recv_into(0, ("posted",), view))
    await asyncio.sleep(0.01)
    await a.send(1, ("posted",), np.ones(BIG // 8))
    await a.send(1, ("early",), np.ones(BIG // 8))
    await asyncio.wait_for(recv, 5)
    late = np.zeros(BIG // 8)
    await b.recv_into(0, ("early",), memoryview(late).cast("B"))
    assert len(answers) == 2 and answers[0] is view and answers[1] is None
    assert out.sum() == late.sum() == BIG // 8


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
