"""Point-to-point: tags, any-source receives, ordering, handles (real TCP)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist.api as dist
from aiodist.errors import CollectiveMismatchError, CollectiveTimeoutError


async def test_send_recv_with_tags_out_of_order() -> None:
    async def body(pg: Any) -> Any:
        if pg.rank == 0:
            hs = [dist.isend(np.full(4, 10 * tag + i, np.int32), dst=1, tag=tag) for i in range(3) for tag in (1, 2)]
            for h in hs:
                await h
            return None
        # receive tag 2 first: tags are separate queues
        twos = [np.empty(4, np.int32) for _ in range(3)]
        ones = [np.empty(4, np.int32) for _ in range(3)]
        for b in twos:
            assert await dist.recv(b, src=0, tag=2) == 0
        for b in ones:
            await dist.irecv(b, src=0, tag=1)
        return [int(b[0]) for b in ones], [int(b[0]) for b in twos]

    res = await run_world(2, body)
    assert res[1] == ([10, 11, 12], [20, 21, 22])  # per (src, tag) in send order


async def test_any_source_receive_reports_the_sender() -> None:
    async def body(pg: Any) -> Any:
        if pg.rank != 0:
            await pg.send(np.full(3, pg.rank, np.float32), dst=0, tag=7)
            return None
        got = {}
        for _ in range(pg.size - 1):
            buf = np.empty(3, np.float32)
            src = await pg.recv(buf, tag=7)
            got[src] = buf.tolist()
        return got

    res = await run_world(4, body)
    assert res[0] == {r: [float(r)] * 3 for r in (1, 2, 3)}


async def test_many_messages_keep_order_per_source_and_tag() -> None:
    n = 200

    async def body(pg: Any) -> Any:
        if pg.rank == 1:
            hs = [pg.isend(np.array([i], np.int64), dst=0) for i in range(n)]
            for h in reversed(hs):
                await h
            return None
        bufs = [np.empty(1, np.int64) for _ in range(n)]
        hs = [pg.irecv(b, src=1) for b in bufs]  # posted in call order
        for h in reversed(hs):
            await h
        return [int(b[0]) for b in bufs]

    res = await run_world(2, body)
    assert res[0] == list(range(n))


async def test_p2p_does_not_consume_collective_sequence_numbers() -> None:
    async def body(pg: Any) -> Any:
        peer = 1 - pg.rank
        hs = pg.isend(np.ones(2), dst=peer) if pg.rank == 0 else pg.irecv(np.empty(2), src=peer)
        a = pg.all_reduce(np.ones(2))
        assert a.seq == 0
        await hs
        return (await a).tolist()

    assert await run_world(2, body) == [[2.0, 2.0]] * 2


async def test_recv_buffer_of_another_size_is_an_error_and_recv_times_out() -> None:
    async def body(pg: Any) -> Any:
        if pg.rank == 0:
            await pg.send(np.ones(5), dst=1)
            await pg.recv(np.empty(1), src=1, tag=9)  # stay until rank 1 is done
            return None
        buf = np.zeros(4)
        with pytest.raises(CollectiveMismatchError):
            await pg.recv(buf, src=0)
        assert (buf == 0).all()
        with pytest.raises(CollectiveTimeoutError) as ei:
            await pg.recv(np.empty(4), src=0, tag=3, timeout=0.2)
        assert ei.value.waiting_for == [0] and ei.value.op == "recv"
        await pg.send(np.ones(1), dst=0, tag=9)
        return None

    await run_world(2, body)


async def test_send_to_self_and_bad_ranks_are_refused() -> None:
    async def body(pg: Any) -> None:
        with pytest.raises(ValueError):
            pg.send(np.ones(1), dst=pg.rank)
        with pytest.raises(ValueError):
            dist.send(np.ones(1), dst=5)
        with pytest.raises(TypeError):
            pg.recv(np.ones(1), src=1 - pg.rank, tag="x")

    await run_world(2, body)


def test_a_tag_beyond_64_bits_is_refused_at_the_call_in_the_simulator_and_over_tcp() -> None:
    """Before: over TCP, 'TypeError: frame header is not serializable' (and the receiver timed out); the
    simulator delivered it (a program that passes there failed for real)."""
    import asyncio

    import sim

    async def body(pg: Any) -> Any:
        peer = 1 - pg.rank
        for tag in (2**63, -(2**63) - 1, 2**70):
            with pytest.raises(ValueError, match="64-bit"):
                pg.send(np.ones(1), dst=peer, tag=tag)
            with pytest.raises(ValueError, match="64-bit"):
                pg.recv(np.ones(1), src=peer, tag=tag)
        x = np.full(1, float(pg.rank))
        big = 2**63 - 1
        if pg.rank == 0:
            await pg.send(x, dst=1, tag=big)
            await pg.send(x, dst=1, tag=np.int64(-(2**63)))
        else:
            await pg.recv(x, src=0, tag=big)
            await pg.recv(x, src=0, tag=-(2**63))
        return float(x[0])

    assert asyncio.run(run_world(2, body)) == [0.0, 0.0]

    async def main() -> Any:
        pg = await dist.init_process_group()
        try:
            return await body(pg)
        finally:
            await dist.destroy_process_group()

    res = sim.run(main, world_size=2, seed=0, trace=False)
    assert res.ok, res.summary()
    assert res.rank_results == [0.0, 0.0]
