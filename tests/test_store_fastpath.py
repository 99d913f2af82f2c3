"""The server's frame-callback fast path over real TCP: backpressure when a
client does not read its replies, and recovery of the fast path afterwards."""

from __future__ import annotations

import asyncio

from aiodist.store import StoreServer, TCPStore
from store_wire import frame, handshake
from store_wire import read_frame as read

HOST = "127.0.0.1"


async def until(cond, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.005)


def _handler_installed(server: StoreServer, cid: int) -> bool:
    return server._sessions[cid].conn._on_frame is not None  # type: ignore[attr-defined]


async def test_client_that_does_not_read_gets_backpressure_then_every_reply_in_order() -> None:
    server = await StoreServer.start(HOST, 0, idle_timeout=30.0)
    try:
        async with await TCPStore.connect(HOST, server.port, timeout=10) as c:
            big = b"x" * (256 * 1024)
            await c.set("big", big)
            r, w = await asyncio.open_connection(HOST, server.port)
            assert (await handshake(r, w))["op"] == "hello"
            cid = max(server._sessions)
            assert _handler_installed(server, cid)
            n = 120  # ~30 MB of replies: far beyond the socket buffers
            w.write(b"".join(frame({"op": "get", "id": i, "k": "big", "t": 5}) for i in range(n)))
            # The server stops serving this client from the callback while its buffer is full ...
            await until(lambda: not _handler_installed(server, cid))
            # ... and keeps serving everyone else.
            assert await c.add("other", 1) == 1
            for i in range(n):
                h, plen = await read(r)
                assert h["id"] == i and h["l"] == [len(big)] and plen == len(big)
            # Drained: a request is served again, and the fast path is back.
            w.write(frame({"op": "add", "id": n, "k": "k", "n": 2}))
            assert (await read(r))[0] == {"id": n, "r": 2}
            await until(lambda: _handler_installed(server, cid))
            w.close()
    finally:
        await server.close()


async def test_bad_request_after_backpressure_closes_only_that_connection() -> None:
    server = await StoreServer.start(HOST, 0, idle_timeout=30.0)
    try:
        async with await TCPStore.connect(HOST, server.port, timeout=10) as c:
            await c.set("big", b"y" * (256 * 1024))
            r, w = await asyncio.open_connection(HOST, server.port)
            await handshake(r, w)
            n = 60
            w.write(b"".join(frame({"op": "get", "id": i, "k": "big"}) for i in range(n)) + frame({"op": "nope", "id": n}))
            for i in range(n):
                assert (await read(r))[0]["id"] == i
            err, _ = await read(r)
            assert err["id"] == n and err["err"] == "unknown_op"
            async with asyncio.timeout(3):
                assert await r.read() == b""
            assert await c.add("still", 1) == 1
            w.close()
    finally:
        await server.close()


async def test_client_dispatches_replies_from_the_frame_callback_and_notices_the_end() -> None:
    server = await StoreServer.start(HOST, 0, idle_timeout=30.0)
    c = await TCPStore.connect(HOST, server.port, timeout=10)
    try:
        assert c._watcher.get_name().startswith("aiodist.store.watch")
        assert await asyncio.gather(*(c.add("n", 1) for _ in range(300))) == list(range(1, 301))
        assert await c.get("n") == b"300"
        pending = asyncio.ensure_future(c.get("never", timeout=30))
        await asyncio.sleep(0.05)
        await server.close()
        from aiodist.errors import StoreConnectionLost

        async with asyncio.timeout(5):
            try:
                await pending
            except StoreConnectionLost:
                pass
            else:
                raise AssertionError("a pending call survived the server's close")
    finally:
        await c.close()
        await server.close()
