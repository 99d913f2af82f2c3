"""The payload sink asked again: a payload it had no buffer for may still be moved into one (every implementation).

The contract (:data:`aiodist.net.base.PayloadSink`): asked first with
``received`` 0; after ``None``, while the payload is still arriving, it may be
asked again with the same header and ``received`` > 0, and a buffer it names
then gets the whole payload (the bytes received so far copied in). A network
whose payloads arrive whole (the simulator) asks once; TCP asks at its chunk
boundaries and lets its loop turn before reading on, so a receive posted by a
task woken meanwhile is in time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from aiodist.net.base import Frame, Network
from net_conformance.harness import Impl, connected

BIG = 8_000_000  # larger than any socket buffer: it cannot arrive in one read


def _data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=n, dtype=np.uint8)


def test_a_sink_that_names_a_buffer_when_asked_again_gets_the_whole_payload_there(impl: Impl) -> None:
    """Declined first, then a buffer: the frame's payload is that buffer, every byte right (early ones copied)."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            dest = np.zeros(BIG, dtype=np.uint8)
            asks: list[tuple[Any, int, int]] = []

            def sink(header: dict[str, Any], n: int, received: int) -> memoryview | None:
                if header.get("i") != 0:
                    return None
                asks.append((header, n, received))
                return memoryview(dest) if received else None

            b.set_payload_sink(sink)
            data = _data(BIG, 1)
            await a.send({"i": 0}, data)
            await a.send({"i": 1}, b"behind")
            f = await asyncio.wait_for(b.recv(), 20)
            after = await asyncio.wait_for(b.recv(), 20)
            assert np.array_equal(np.frombuffer(f.payload, dtype=np.uint8), data)
            assert after.header == {"i": 1} and bytes(after.payload) == b"behind"
            assert asks[0][1:] == (BIG, 0)
            assert all(h is asks[0][0] for h, _, _ in asks)  # the same frame, the same header object
            assert all(n == BIG and 0 < got < BIG for _, n, got in asks[1:])
            if len(asks) > 1:  # asked again (TCP): the named buffer got it all
                assert np.shares_memory(np.frombuffer(f.payload, dtype=np.uint8), dest)
                assert np.array_equal(dest, data)
            if impl.is_tcp:
                assert len(asks) == 2, "a payload larger than any socket buffer is asked about again"
            else:
                assert len(asks) == 1 and not dest.any()  # it arrived whole: asked once

    impl.run(body)


def test_a_sink_that_never_has_a_buffer_is_asked_a_handful_of_times_and_reading_goes_on(impl: Impl) -> None:
    """None every time: the payload arrives in the connection's own memory and the frames behind it follow."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            received: list[int] = []

            def sink(header: dict[str, Any], n: int, got: int) -> memoryview | None:
                if header.get("i") == 0:
                    received.append(got)
                return None

            b.set_payload_sink(sink)
            data = _data(BIG, 2)
            await a.send({"i": 0}, data)
            for i in range(1, 50):
                await a.send({"i": i}, bytes([i]) * 1000)
            f = await asyncio.wait_for(b.recv(), 20)
            assert np.array_equal(np.frombuffer(f.payload, dtype=np.uint8), data)
            for i in range(1, 50):
                g = await asyncio.wait_for(b.recv(), 20)
                assert g.header == {"i": i} and bytes(g.payload) == bytes([i]) * 1000
            assert received[0] == 0 and received == sorted(set(received)) and received[-1] < BIG
            assert len(received) <= 32  # a handful of questions, not one per read

    impl.run(body)


def test_a_receive_posted_by_a_task_woken_by_the_frame_before_gets_the_payload_in_place(impl: Impl) -> None:
    """The frame handler wakes a task that makes a buffer ready (as a collective posts its receive when the
    previous operation's last message came): the large payload right behind lands there (TCP), although
    both frames may be read at once. The connection never waits for it: the simulator's whole payloads
    are copied when the task's buffer comes too late."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            dest = np.zeros(BIG, dtype=np.uint8)
            ready: list[memoryview] = []
            frames: list[Frame] = []
            woken = asyncio.Event()

            async def poster() -> None:
                await woken.wait()
                ready.append(memoryview(dest))

            def sink(header: dict[str, Any], n: int, got: int) -> memoryview | None:
                return ready[0] if ready and header.get("i") == 1 else None

            def on_frame(frame: Frame) -> None:
                frames.append(frame)
                if frame.header.get("i") == 0:
                    woken.set()

            task = asyncio.ensure_future(poster())
            b.set_payload_sink(sink)
            b.set_frame_handler(on_frame)
            data = _data(BIG, 3)
            a.send_nowait({"i": 0}, b"go")
            await a.send({"i": 1}, data)
            for _ in range(2000):
                if len(frames) == 2:
                    break
                await asyncio.sleep(0.005)
            await task
            assert [f.header["i"] for f in frames] == [0, 1]
            assert np.array_equal(np.frombuffer(frames[1].payload, dtype=np.uint8), data)
            if impl.is_tcp:
                assert np.shares_memory(np.frombuffer(frames[1].payload, dtype=np.uint8), dest)

    impl.run(body)
