"""Receiving: frame handlers (and switching them), the frame size limit, and letting go of buffers at close."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import numpy as np
import pytest

from aiodist.errors import ConnectionLost
from aiodist.net.base import Frame, Network
from net_conformance.harness import Impl, connected


def test_a_frame_handler_gets_the_queued_frames_first_then_new_ones_in_order(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            for i in range(3):
                await a.send({"i": i})
            await asyncio.sleep(0.1)  # they wait, unread, for recv
            got: list[Any] = []
            b.set_frame_handler(lambda f: got.append(f.header["i"]))
            assert got == [0, 1, 2]
            for i in range(3, 6):
                await a.send({"i": i}, bytes(i))
            for _ in range(100):
                if len(got) == 6:
                    break
                await asyncio.sleep(0.01)
            assert got == list(range(6))

    impl.run(body)


def test_a_handler_that_steps_aside_gets_no_more_frames_and_recv_gets_the_rest_in_order(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            got: list[Any] = []

            def handler(f: Frame) -> None:
                got.append(f.header["i"])
                if f.header["i"] == 2:
                    b.set_frame_handler(None)  # from inside the handler

            b.set_frame_handler(handler)
            for i in range(6):  # sent together: they may arrive in one batch
                a.send_nowait({"i": i}, None)
            rest = [(await asyncio.wait_for(b.recv(), 10)).header["i"] for _ in range(3)]
            assert got == [0, 1, 2] and rest == [3, 4, 5]

    impl.run(body)


def test_with_a_handler_recv_only_reports_the_end(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            got: list[Any] = []
            b.set_frame_handler(lambda f: got.append(f.header["i"]))
            pending = asyncio.ensure_future(b.recv())
            await a.send({"i": 0})
            await asyncio.sleep(0.1)
            assert got == [0] and not pending.done()
            a.close()
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(pending, 10)

    impl.run(body)


def test_a_handler_that_raises_breaks_the_connection_for_both_ends(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            def handler(f: Frame) -> None:
                raise RuntimeError("a bug in the handler")

            b.set_frame_handler(handler)
            await a.send({"i": 0})
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(b.recv(), 10)
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(a.recv(), 10)

    impl.run(body)


def test_a_frame_over_the_listeners_limit_breaks_the_connection_but_smaller_ones_pass(impl: Impl) -> None:
    """A listener's max_frame_size is in force from the first byte; the frames before the big one arrive."""

    async def body(net: Network) -> None:
        async with connected(net, max_frame_size=4096) as (a, b):
            await a.send({"i": 0}, bytes(3000))
            await a.send({"i": 1}, bytes(5000))
            f = await asyncio.wait_for(b.recv(), 10)
            assert f.header == {"i": 0} and f.payload.nbytes == 3000
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(b.recv(), 10)
            with pytest.raises(ConnectionLost):  # the sender learns it too: its connection was reset
                await asyncio.wait_for(a.recv(), 10)

    impl.run(body)


def test_a_header_alone_counts_against_the_limit(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net, max_frame_size=1024) as (a, b):
            await a.send({"k": "v" * 2000})
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(b.recv(), 10)

    impl.run(body)


def test_the_limit_is_raised_after_a_handshake_and_lowered_again(impl: Impl) -> None:
    """The pattern of an authenticating protocol: few KiB until the peer proved itself, then large frames."""

    async def body(net: Network) -> None:
        async with connected(net, max_frame_size=2048) as (a, b):
            await a.send({"hello": 1}, bytes(100))
            assert (await asyncio.wait_for(b.recv(), 10)).header == {"hello": 1}
            b.set_max_frame_size(1 << 24)  # before telling the peer it may send more
            await b.send({"welcome": 1})
            assert (await asyncio.wait_for(a.recv(), 10)).header == {"welcome": 1}
            big = np.arange(1 << 20, dtype=np.int32)
            await a.send({"data": 1}, big)
            f = await asyncio.wait_for(b.recv(), 10)
            assert np.array_equal(np.frombuffer(f.payload, dtype=np.int32), big)
            b.set_max_frame_size(4096)
            await b.send({"lowered": 1})
            assert (await asyncio.wait_for(a.recv(), 10)).header == {"lowered": 1}
            await a.send({"data": 2}, big)
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(b.recv(), 10)
            with pytest.raises(ValueError):
                b.set_max_frame_size(0)

    impl.run(body)


def test_a_closed_connection_lets_go_of_its_sink_and_handler_at_once(impl: Impl) -> None:
    """Sink and handler that refer back to the connection (as a protocol's do): after close they are freed
    by reference counting alone (no reference cycle left for the garbage collector)."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            class Protocol:
                def __init__(self) -> None:
                    self.conn = b
                    self.got: list[Any] = []

                def sink(self, header: dict[str, Any], n: int, received: int) -> memoryview | None:
                    return None

                def on_frame(self, f: Frame) -> None:
                    self.got.append(f.header)

            p = Protocol()
            b.set_payload_sink(p.sink)
            b.set_frame_handler(p.on_frame)
            await a.send({"i": 0}, b"abc")
            for _ in range(100):
                if p.got:
                    break
                await asyncio.sleep(0.01)
            assert p.got == [{"i": 0}]
            ref = weakref.ref(p)
            gc.disable()
            try:
                b.close()
                del p
                assert ref() is None, "the closed connection still holds its sink or handler"
            finally:
                gc.enable()

    impl.run(body)


def test_a_refused_frame_limit_leaves_the_limit_as_it_was(impl: Impl) -> None:
    """set_max_frame_size with a bad value raises and changes nothing: frames keep coming."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            with pytest.raises(ValueError):
                b.set_max_frame_size(0)
            for size in (1000, 1 << 20):  # (inline, and through shared memory's ring)
                await a.send({"x": size}, bytes(size))
                f = await asyncio.wait_for(b.recv(), 10)
                assert f.header == {"x": size} and bytes(f.payload) == bytes(size)

    impl.run(body)
