"""Backpressure: try_send, send_nowait, drained and send against a reader that does not read (every implementation).

The reader's program leaves frames unread (``max_unread_frames=8``): its
connection stops reading, the buffers between the two fill, and the sender
must notice. Nothing is ever lost or reordered.
"""

from __future__ import annotations

import asyncio

import pytest

from aiodist.net.base import Connection, Network
from net_conformance.harness import Impl, connected, fill_until_stuck

MIB = 1 << 20


async def read_ids(b: Connection, n: int) -> list[int]:
    return [(await asyncio.wait_for(b.recv(), 10)).header["i"] for _ in range(n)]


def test_a_full_buffer_makes_send_nowait_false_try_send_refuse_and_drained_wait_for_the_reader(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            n = await fill_until_stuck(a)
            assert a.try_send({"i": "refused"}, b"x") is False  # nothing goes past what waits
            assert a.send_nowait({"i": n}, b"queued") is False
            n += 1
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(a.drained(), 0.3)  # the reader still does not read
            reader = asyncio.ensure_future(read_ids(b, n))
            await asyncio.wait_for(a.drained(), 10)
            assert a.try_send({"i": n}, b"x") is True  # room again
            got = await reader
            assert got == list(range(n))
            assert (await asyncio.wait_for(b.recv(), 10)).header == {"i": n}

    impl.run(body, max_unread_frames=8)


def test_send_blocks_while_the_buffer_is_full_and_goes_once_the_reader_reads(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            n = await fill_until_stuck(a)
            blocked = asyncio.ensure_future(a.send({"i": n}, b"last"))
            await asyncio.sleep(0.2)
            assert not blocked.done()
            got = await read_ids(b, n + 1)
            await asyncio.wait_for(blocked, 10)
            assert got == list(range(n + 1))

    impl.run(body, max_unread_frames=8)


def test_a_reader_that_keeps_up_gets_everything_in_order(impl: Impl) -> None:
    """Many more bytes than any buffer holds, small and large frames mixed, read as they come."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            sizes = [10, 3 * MIB, 70_000, 0, 1000, MIB] * 6

            async def reader() -> list[tuple[int, int]]:
                out = []
                for _ in sizes:
                    f = await b.recv()
                    out.append((f.header["i"], 0 if f.payload is None else f.payload.nbytes))
                return out

            task = asyncio.ensure_future(reader())
            for i, size in enumerate(sizes):
                await a.send({"i": i}, bytes(size))
            assert await asyncio.wait_for(task, 30) == list(enumerate(sizes))

    impl.run(body, max_unread_frames=8)
