"""Store calls end by their deadline even when the server stops reading and the socket buffer is full."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiodist.store.client as client_mod
from aiodist import auth
from aiodist.errors import ConnectionClosedError, StoreTimeoutError
from aiodist.store import TCPStore
from aiodist.store import protocol as P
from aiodist.wire import PREAMBLE
from store_wire import frame, read_frame

HOST = "127.0.0.1"
BIG = b"x" * (8 << 20)


@contextlib.asynccontextmanager
async def deaf_server() -> AsyncIterator[int]:
    """A store server that completes the handshake, then never reads again (hung or stopped); yields its port."""

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        acceptor = auth.Acceptor(auth.resolve_secret(), purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
        w.write(PREAMBLE)
        assert await r.readexactly(8) == PREAMBLE
        w.write(frame(P.challenge(acceptor.challenge((await read_frame(r))[0]))))
        acceptor.verify((await read_frame(r))[0])
        w.write(frame(P.hello_reply(idle=None, max_key=8192, max_value=64 << 20)))
        await asyncio.sleep(3600)  # the stream pauses reading once ~128 KiB wait unread

    server = await asyncio.start_server(serve, HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def fill_the_socket_buffer(c: TCPStore) -> list[asyncio.Task[Any]]:
    """Sets that sit in the client's send buffer (the server reads none of them)."""
    fillers = [asyncio.create_task(c.set(f"fill{i}", BIG)) for i in range(3)]
    await asyncio.sleep(0.2)
    assert not any(t.done() for t in fillers)
    return fillers


async def test_a_call_waiting_for_room_in_the_socket_buffer_ends_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "_GRACE", 0.1)
    async with deaf_server() as port:
        c = await TCPStore.connect(HOST, port, timeout=0.5)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        fillers = [asyncio.create_task(c.set(f"fill{i}", BIG)) for i in range(3)]
        async with asyncio.timeout(5):  # before: they waited in drained() forever
            results = await asyncio.gather(*fillers, return_exceptions=True)
        assert all(isinstance(r, StoreTimeoutError) for r in results), results
        assert loop.time() - t0 < 2.0
        await c.close()


async def test_a_blocked_cancellation_does_not_stop_the_expiry_of_other_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "_GRACE", 0.1)
    async with deaf_server() as port:
        c = await TCPStore.connect(HOST, port, timeout=30)
        early = asyncio.create_task(c.get("a", timeout=0.5))  # sent while the buffer is empty
        await asyncio.sleep(0.05)
        fillers = await fill_the_socket_buffer(c)
        b = asyncio.create_task(c.get("b", timeout=30))
        await asyncio.sleep(0.05)
        b.cancel()  # the housekeeper must send a cancel into the full buffer
        with pytest.raises(asyncio.CancelledError):
            await b
        async with asyncio.timeout(5):  # before: the housekeeper was stuck in that send and expired nothing
            with pytest.raises(StoreTimeoutError):
                await early
        await c.close()
        for t in fillers:
            with pytest.raises(ConnectionClosedError):
                await t
