"""Cancellation in every state: what a cancelled send, recv, drained or wait_closed leaves behind."""

from __future__ import annotations

import asyncio

import pytest

from aiodist.net.base import Connection, Network
from net_conformance.harness import Impl, connected, fill_until_stuck

MIB = 1 << 20


async def _ids(b: Connection, last: object) -> list[object]:
    out: list[object] = []
    while not out or out[-1] != last:
        f = await asyncio.wait_for(b.recv(), 10)
        out.append(f.header["i"])
        if f.header["i"] == "big":
            out.append(bytes(f.payload[:4]) + bytes(f.payload[-4:]))
    return out


def test_a_cancelled_recv_loses_no_frame(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(b.recv(), 0.05)
            await a.send({"i": 1})
            pending = asyncio.ensure_future(b.recv())
            await asyncio.sleep(0)
            await a.send({"i": 2})
            f1 = await asyncio.wait_for(pending, 10)
            f2 = await asyncio.wait_for(b.recv(), 10)
            assert [f1.header["i"], f2.header["i"]] == [1, 2]

    impl.run(body)


def test_a_cancelled_drained_leaves_the_queued_frames_queued(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            n = await fill_until_stuck(a)  # (its drained() was cancelled by a timeout)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(a.drained(), 0.1)
            a.send_nowait({"i": "end"}, None)
            got = await _ids(b, "end")
            assert got == list(range(n)) + ["end"]

    impl.run(body, max_unread_frames=4)


@pytest.mark.parametrize("started", [False, True], ids=["queued", "partly-sent"])
def test_a_cancelled_send_goes_whole_or_not_at_all_and_frees_the_callers_buffer(impl: Impl, started: bool) -> None:
    """send() of a large payload is cancelled while it waits; the caller then overwrites its buffer.

    The peer gets the frame whole with the bytes it had at the send, or not at
    all, and the frames around it in order; the caller's buffer is not
    referred to any more (a bytearray can be resized only when nothing
    exports it). "queued": the frame waits behind others (it goes not at all);
    "partly-sent": it is the first in line and part of it is out already
    (TCP sends the rest; the simulator copied all of it at the send).
    """

    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            if not started:
                n = await fill_until_stuck(a)
            else:
                n = 6
                for i in range(n):  # the reader's program leaves them unread: its connection stops reading
                    await a.send({"i": i}, b"x")
                await asyncio.sleep(0.1)
            payload = bytearray(b"\x01" * (24 * MIB))  # more than the buffers hold
            send = asyncio.ensure_future(a.send({"i": "big"}, payload))
            await asyncio.sleep(0.3)
            assert not send.done() or (impl.name == "sim" and started)
            send.cancel()
            await asyncio.gather(send, return_exceptions=True)
            payload[:] = b"\x02" * len(payload)
            payload.extend(b"more")  # BufferError if the connection still referred to it
            a.send_nowait({"i": "end"}, None)
            got = await _ids(b, "end")
            if started:
                assert got[n : n + 2] == ["big", b"\x01" * 8], "the frame changed after the send was cancelled"
                del got[n : n + 2]
            assert got == list(range(n)) + ["end"]

    impl.run(body, max_unread_frames=4)


def test_a_cancelled_wait_closed_only_stops_the_wait(impl: Impl) -> None:
    async def body(net: Network) -> None:
        async with connected(net) as (a, b):
            waiter = asyncio.ensure_future(a.wait_closed())
            await asyncio.sleep(0.01)
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            await a.send({"i": 1})  # still open
            assert (await asyncio.wait_for(b.recv(), 10)).header == {"i": 1}
            a.close()
            await asyncio.wait_for(a.wait_closed(), 10)

    impl.run(body)
