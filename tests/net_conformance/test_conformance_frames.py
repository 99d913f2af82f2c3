"""Frames: order, content, payloads in place, and bad input from the caller (every implementation)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from aiodist.errors import ConnectionLost
from aiodist.net.base import Network
from net_conformance.harness import Impl, connected, payload_bytes

SIZES = [None, 0, 1, 100, 60_000, 70_000, 300_000, 3_000_000]  # around the 64 KiB coalescing limit, and large


def _payload(i: int, size: int | None) -> bytes | None:
    return None if size is None else bytes([i % 251]) * size


def test_frames_arrive_whole_and_in_order_whatever_the_way_they_were_sent(impl: Impl) -> None:
    """send, send_nowait and try_send mixed, payloads of every size: the peer gets each frame once, in order."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            sent = []
            for i in range(60):
                size = SIZES[i % len(SIZES)]
                payload = _payload(i, size)
                how = i % 3
                if how == 0:
                    await a.send({"i": i}, payload)
                elif how == 1:
                    if not a.send_nowait({"i": i}, payload):
                        await a.drained()
                elif not a.try_send({"i": i}, payload):
                    await a.send({"i": i}, payload)
                sent.append((i, payload))
            for i, payload in sent:
                f = await asyncio.wait_for(b.recv(), 10)
                assert f.header == {"i": i}
                assert payload_bytes(f) == (payload or None)  # an empty payload arrives as None

    impl.run(body)


def test_concurrent_senders_never_interleave(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            payloads = [np.full(200_000 + i, i, dtype=np.uint8) for i in range(20)]
            got: dict[int, np.ndarray] = {}

            async def reader() -> None:
                for _ in range(20):
                    f = await b.recv()
                    got[f.header["i"]] = np.frombuffer(f.payload, dtype=np.uint8)

            await asyncio.wait_for(asyncio.gather(reader(), *(a.send({"i": i}, p) for i, p in enumerate(payloads))), 20)
            for i, p in enumerate(payloads):
                assert np.array_equal(got[i], p)

    impl.run(body)


def test_headers_arrive_as_msgpack_gives_them_and_payloads_as_they_were_at_the_send(impl: Impl) -> None:
    """Tuples become lists, bytearrays bytes; send copies or hands over the payload before it returns."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            buf = np.arange(4, dtype=np.int32)
            header: dict[str, Any] = {"key": (1, "a"), "nested": {"t": (2, 3)}, "b": bytearray(b"x")}
            await a.send(header, buf)
            buf[:] = -1  # the sender may reuse its buffer as soon as send returns
            header["late"] = True
            small = bytearray(b"abc")
            assert a.try_send({"i": 2}, small)  # taken: a copy (or already sent)
            small[:] = b"zzz"
            f = await asyncio.wait_for(b.recv(), 10)
            assert f.header == {"key": [1, "a"], "nested": {"t": [2, 3]}, "b": b"x"}
            assert bytes(f.payload) == np.arange(4, dtype=np.int32).tobytes()
            f2 = await asyncio.wait_for(b.recv(), 10)
            assert f2.header == {"i": 2} and bytes(f2.payload) == b"abc"

    impl.run(body)


def test_a_payload_sink_receives_straight_into_the_callers_buffer(impl: Impl) -> None:
    """The sink is asked once per payload (header, size); a buffer it names is where the bytes land."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            dest = np.zeros(1_000_000, dtype=np.int32)  # 4 MB: larger than any socket buffer
            asked: list[tuple[Any, int]] = []

            def sink(header: dict[str, Any], n: int, received: int) -> memoryview | None:
                asked.append((header.get("i"), n))
                return memoryview(dest).cast("B") if header.get("to") == "dest" else None

            b.set_payload_sink(sink)
            src = np.arange(1_000_000, dtype=np.int32)
            await a.send({"i": 0})  # no payload: the sink is not asked
            await a.send({"i": 1, "to": "dest"}, src)
            await a.send({"i": 2}, b"xyz")
            frames = [await asyncio.wait_for(b.recv(), 10) for _ in range(3)]
            assert asked == [(1, src.nbytes), (2, 3)]
            assert np.array_equal(dest, src)
            assert np.shares_memory(np.frombuffer(frames[1].payload, dtype=np.int32), dest)
            assert bytes(frames[2].payload) == b"xyz"

    impl.run(body)


def test_a_large_payload_without_a_sink_arrives_whole(impl: Impl) -> None:
    """No sink buffer: the connection receives the payload into memory of its own (several MiB here)."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            data = np.random.default_rng(1).integers(0, 255, size=9_000_001, dtype=np.uint8)
            await a.send({"big": 1}, data)
            f = await asyncio.wait_for(b.recv(), 20)
            assert f.payload is not None and not f.payload.readonly
            assert np.array_equal(np.frombuffer(f.payload, dtype=np.uint8), data)

    impl.run(body)


@pytest.mark.parametrize("how", ["raises", "wrong size", "raises when asked again", "wrong size when asked again"])
def test_a_failing_payload_sink_breaks_the_connection(impl: Impl, how: str) -> None:
    """A sink that raises, or names a buffer of the wrong size, is a local bug: both ends see ConnectionLost.

    Also when it does so only when asked again about a payload it declined (a network whose
    payloads arrive whole never asks again: there the frame simply arrives)."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            def sink(header: dict[str, Any], n: int, received: int) -> memoryview | None:
                if how.endswith("asked again") and not received:
                    return None
                if how.startswith("raises"):
                    raise RuntimeError("a bug in the sink")
                return memoryview(bytearray(n + 1))

            b.set_payload_sink(sink)
            payload = bytes(8_000_000) if how.endswith("asked again") else b"abc"
            try:
                await a.send({"i": 0}, payload)
            except ConnectionLost:  # (the large one: the reset may come while it is being sent)
                assert how.endswith("asked again") and impl.is_tcp
            if how.endswith("asked again") and not impl.is_tcp:
                f = await asyncio.wait_for(b.recv(), 10)
                assert f.header == {"i": 0} and f.payload is not None and f.payload.nbytes == len(payload)
                return
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(b.recv(), 10)
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(a.recv(), 10)

    impl.run(body)


def test_bad_input_from_the_caller_is_refused_and_nothing_is_sent(impl: Impl) -> None:
    """An unserializable header (TypeError) or a non-contiguous payload (ValueError): nothing goes out."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            with pytest.raises(TypeError):
                await a.send({"x": object()})
            with pytest.raises(TypeError):
                a.send_nowait({"x": object()})
            with pytest.raises(ValueError, match="contiguous"):
                await a.send({"x": 1}, np.arange(10)[::2])
            await a.send({"ok": 1})
            f = await asyncio.wait_for(b.recv(), 10)
            assert f.header == {"ok": 1}

    impl.run(body)
