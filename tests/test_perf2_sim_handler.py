"""The simulated connection's frame handler (same contract as TCPConnection.set_frame_handler)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sim_pair import dial, rank, serve_once

import sim
from aiodist.errors import ConnectionLost
from aiodist.net.base import Connection
from sim.endpoints import SimConnection


def test_sim_connection_offers_a_frame_handler() -> None:
    assert callable(getattr(SimConnection, "set_frame_handler", None))


def test_queued_frames_first_in_order_then_live_ones_then_recv_reports_the_end() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> Any:
                await asyncio.sleep(0.5)  # frames 0..2 are queued meanwhile
                got: list[int] = []
                conn.set_frame_handler(lambda f: got.append(f.header["i"]))  # type: ignore[attr-defined]
                assert got == [0, 1, 2]  # handed over at once
                with pytest.raises(ConnectionLost):
                    await conn.recv()  # only the end of the connection
                return got

            return await serve_once(h)
        conn = await dial()
        for i in range(3):
            await conn.send({"i": i})
        await asyncio.sleep(1)
        for i in range(3, 6):
            await conn.send({"i": i})
        await asyncio.sleep(0.1)
        conn.close()

    res = sim.run(main, world_size=2)
    res.raise_on_failure()
    assert res.rank_results[0] == [0, 1, 2, 3, 4, 5]


def test_removing_the_handler_queues_frames_for_recv_again() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> Any:
                got: list[Any] = []
                conn.set_frame_handler(lambda f: got.append(f.header["i"]))  # type: ignore[attr-defined]
                await asyncio.sleep(0.5)
                conn.set_frame_handler(None)  # type: ignore[attr-defined]
                got.append((await conn.recv()).header["i"])
                return got

            return await serve_once(h)
        conn = await dial()
        await conn.send({"i": 0})
        await asyncio.sleep(1)
        await conn.send({"i": 1})
        await asyncio.sleep(0.5)
        conn.close()

    res = sim.run(main, world_size=2)
    res.raise_on_failure()
    assert res.rank_results[0] == [0, 1]


def test_a_failing_handler_breaks_the_connection() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> Any:
                def bad(frame: Any) -> None:
                    raise RuntimeError("handler bug")

                conn.set_frame_handler(bad)  # type: ignore[attr-defined]
                with pytest.raises(ConnectionLost, match="handler bug"):
                    await conn.recv()
                return conn.closed

            return await serve_once(h)
        conn = await dial()
        await conn.send({"i": 0})
        await asyncio.sleep(1)
        with pytest.raises(ConnectionLost):
            await conn.send({"i": 1})
        return "peer saw the reset"

    res = sim.run(main, world_size=2)
    res.raise_on_failure()
    assert res.rank_results == [True, "peer saw the reset"]


def test_many_frames_beyond_the_unread_limit_all_reach_the_handler() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> Any:
                await asyncio.sleep(1)  # more than max_unread_frames wait (some in the kernel)
                got: list[int] = []
                conn.set_frame_handler(lambda f: got.append(f.header["i"]))  # type: ignore[attr-defined]
                await asyncio.sleep(1)
                return got

            return await serve_once(h)
        conn = await dial()
        for i in range(500):
            await conn.send({"i": i})
        await asyncio.sleep(3)
        conn.close()

    res = sim.run(main, world_size=2, network=sim.Network(max_unread_frames=64))
    res.raise_on_failure()
    assert res.rank_results[0] == list(range(500))
