"""Ending a connection: orderly close, abort (reset), the peer's end, and whose fault each error is."""

from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest

from aiodist.errors import ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, ListenError
from aiodist.net.base import Connection, Network
from net_conformance.harness import Impl, connected, recv_all

MIB = 1 << 20


async def _read_late(b: Connection, delay: float) -> list[object]:
    await asyncio.sleep(delay)
    return await recv_all(b)


def test_close_delivers_every_queued_frame_then_end_of_stream(impl: Impl) -> None:
    """Frames queued by send_nowait (some still waiting on this side) all arrive, in order, then ConnectionLost."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            reader = asyncio.ensure_future(_read_late(b, 0.5))  # not reading while the frames are queued
            chunk = np.arange(MIB, dtype=np.uint8)
            results = [a.send_nowait({"i": i}, chunk) for i in range(24)]  # more than the buffers hold
            a.send_nowait({"i": "small"}, b"tail")
            assert False in results  # some of them wait on this side
            a.close()
            assert a.closed
            chunk[:] = 0  # after close the connection no longer reads the senders' buffers
            got = await asyncio.wait_for(reader, 20)
            assert [f.header["i"] for f in got[:-1]] == list(range(24)) + ["small"]
            assert all(bytes(f.payload) == bytes(np.arange(MIB, dtype=np.uint8)) for f in got[:24])
            assert isinstance(got[-1], ConnectionLost)

    impl.run(body, max_unread_frames=4)


def test_after_close_this_side_raises_closed_locally_and_try_send_refuses(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            a.close()
            a.close()  # idempotent
            assert a.closed
            assert a.try_send({"x": 1}) is False
            with pytest.raises(ConnectionClosedLocally):
                await a.send({"x": 2})
            with pytest.raises(ConnectionClosedLocally):
                a.send_nowait({"x": 3})
            with pytest.raises(ConnectionClosedLocally):
                await a.recv()
            with pytest.raises(ConnectionClosedLocally):
                await a.drained()
            await asyncio.wait_for(a.wait_closed(), 10)
            with pytest.raises(ConnectionLost, match="closed"):  # the peer: not its doing
                await asyncio.wait_for(b.recv(), 10)
            assert b.closed

    impl.run(body)


def test_closing_wakes_a_pending_recv_with_closed_locally(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            pending = asyncio.ensure_future(a.recv())
            await asyncio.sleep(0.05)
            a.close()
            with pytest.raises(ConnectionClosedLocally):
                await asyncio.wait_for(pending, 10)

    impl.run(body)


def test_when_the_peer_closes_its_frames_come_first_then_connection_lost(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            for i in range(5):
                await b.send({"i": i}, bytes(i * 1000))
            b.close()
            got = await recv_all(a)
            assert [f.header["i"] for f in got[:-1]] == list(range(5))
            assert isinstance(got[-1], ConnectionLost)
            assert a.closed
            with pytest.raises(ConnectionLost):
                await a.send({"late": 1})
            assert a.try_send({"late": 2}) is False
            with pytest.raises(ConnectionLost):
                await a.recv()  # still the peer's doing

    impl.run(body)


def test_an_ended_connection_keeps_nothing_of_the_calls_it_refused(impl: Impl) -> None:
    """Each refused call gets an error of its own: the connection's stored error collects no traceback,
    so the buffers of the senders (and receivers) it was raised to are freed as soon as they let go."""

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            b.abort()
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(a.recv(), 10)
            refs = []
            errors: list[BaseException] = []
            for i in range(3):
                payload = np.full(1024, i, dtype=np.uint8)
                refs.append(weakref.ref(payload))
                with pytest.raises(ConnectionLost) as e:
                    await a.send({"i": i}, payload)
                errors.append(e.value.with_traceback(None))  # (the test keeps the error, not the call's frames)
                with pytest.raises(ConnectionLost):
                    a.send_nowait({"i": i}, payload)
                with pytest.raises(ConnectionLost):
                    await a.recv()
                del payload, e
            gc.collect()
            assert [i for i, r in enumerate(refs) if r() is not None] == []  # (none kept alive)
            assert len({id(x) for x in errors}) == 3  # (distinct objects: one per refused call)
            assert all(type(x) is type(errors[0]) and str(x) == str(errors[0]) for x in errors)

    impl.run(body)


def test_abort_drops_what_is_queued_and_the_peer_sees_connection_lost(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            chunk = np.zeros(MIB, dtype=np.uint8)
            sent = 0
            while a.send_nowait({"i": sent}, chunk):  # until frames wait on this side
                sent += 1
            sent += 1
            for i in range(sent, sent + 10):  # and more behind them
                a.send_nowait({"i": i}, chunk)
            sent += 10
            blocked = asyncio.ensure_future(a.send({"i": "blocked"}, chunk))
            await asyncio.sleep(0)
            a.abort()
            a.abort()  # idempotent
            assert a.closed
            with pytest.raises(ConnectionClosedLocally):
                await asyncio.wait_for(blocked, 10)
            with pytest.raises(ConnectionClosedLocally):
                await a.send({"x": 1})
            with pytest.raises(ConnectionClosedLocally):
                await a.recv()
            got = await recv_all(b)
            assert isinstance(got[-1], ConnectionLost)
            ids = [f.header["i"] for f in got[:-1]]
            assert ids == list(range(len(ids))) and len(ids) < sent  # a prefix, in order; the rest dropped

    impl.run(body, max_unread_frames=4)


def test_aborting_after_close_resets_at_once(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            chunk = np.zeros(MIB, dtype=np.uint8)
            for i in range(40):
                a.send_nowait({"i": i}, chunk)
            a.close()
            a.abort()
            await asyncio.wait_for(a.wait_closed(), 10)
            got = await recv_all(b)
            assert isinstance(got[-1], ConnectionLost) and len(got) - 1 < 40

    impl.run(body, max_unread_frames=4)


def test_connecting_to_a_closed_port_is_connection_lost_binding_a_taken_one_a_listen_error(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async def idle(conn: Connection) -> None:
            await asyncio.sleep(10)

        lis = await net.listen(("127.0.0.1", 0), idle)
        address = lis.address
        assert address[1] != 0
        with pytest.raises(ListenError) as taken:  # (not ConnectionLost: no peer broke anything)
            await net.listen(("127.0.0.1", address[1]), idle)
        assert isinstance(taken.value, OSError) and taken.value.address == ("127.0.0.1", address[1])
        await lis.aclose()
        with pytest.raises(ConnectionLost, match="could not connect"):
            await net.connect(address, timeout=5)

    impl.run(body)


def test_closing_a_listener_closes_its_connections_and_cancels_its_handlers(impl: Impl) -> None:
    async def body(net: Network) -> None:
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        cancelled: asyncio.Future[None] = loop.create_future()

        async def handler(conn: Connection) -> None:
            started.set_result(None)
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set_result(None)
                raise

        lis = await net.listen(("127.0.0.1", 0), handler)
        conn = await net.connect(lis.address, timeout=5)
        await asyncio.wait_for(started, 10)
        await asyncio.wait_for(lis.aclose(), 10)
        assert cancelled.done()
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(conn.recv(), 10)
        conn.close()

    impl.run(body)


def test_a_handler_that_fails_closes_only_its_connection(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async def handler(conn: Connection) -> None:
            f = await conn.recv()
            if f.header.get("fail"):
                raise RuntimeError("a bug in the handler")
            await conn.send({"echo": f.header})
            await asyncio.sleep(60)

        async with await net.listen(("127.0.0.1", 0), handler) as lis:
            bad = await net.connect(lis.address, timeout=5)
            await bad.send({"fail": True})
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(bad.recv(), 10)
            good = await net.connect(lis.address, timeout=5)
            await good.send({"ok": 1})
            assert (await asyncio.wait_for(good.recv(), 10)).header == {"echo": {"ok": 1}}
            good.close()
            bad.close()

    impl.run(body)


def test_errors_are_connection_errors_and_say_whose_fault(impl: Impl) -> None:
    assert issubclass(ConnectionLost, ConnectionClosedError) and issubclass(ConnectionClosedLocally, ConnectionClosedError)
    assert issubclass(ConnectionClosedError, ConnectionError)
