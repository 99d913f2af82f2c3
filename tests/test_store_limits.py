"""The store server's limits over real TCP: connections, quotas, clients that stop reading, and their spec."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import msgpack
import pytest

from aiodist.errors import StoreConnectTimeoutError, StoreRequestError, StoreTimeoutError
from aiodist.store import StoreServer, TCPStore
from aiodist.store.limits import StoreLimits
from aiodist.store.quota import ENTRY_BYTES
from aiodist.store.waiters import waiter_cost
from aiodist.store import protocol as P
from aiodist.wire import PREAMBLE
from store_wire import frame, handshake, read_frame

HOST = "127.0.0.1"
SECRET = b"s" * 32


async def until(cond, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def store_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aiodist.store"]


async def test_over_the_connection_limit_clients_wait_and_refusals_are_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="aiodist.store")
    async with await StoreServer.start(HOST, 0, max_connections=2, log_interval=30) as srv:
        a = await TCPStore.connect(HOST, srv.port, timeout=5)
        b = await TCPStore.connect(HOST, srv.port, timeout=5)
        with pytest.raises(StoreConnectTimeoutError) as info:
            await TCPStore.connect(HOST, srv.port, timeout=0.5)  # retries while the server is full
        assert "connection limit" in str(info.value)
        busy = [m for m in store_messages(caplog) if "max_connections" in m]
        assert len(busy) == 1 and "2 connections are open" in busy[0]
        waiting = asyncio.create_task(TCPStore.connect(HOST, srv.port, timeout=5))
        await asyncio.sleep(0.1)
        await a.close()
        c = await waiting  # got in once a connection was free
        assert await c.add("n", 1) == 1 and await b.add("n", 1) == 2
        await b.close()
        await c.close()
    tail = [m for m in store_messages(caplog) if "max_connections" in m][1:]
    assert len(tail) == 1 and "such since the last report" in tail[0]  # the rest, counted, not dropped


async def test_sockets_stuck_in_their_handshake_cannot_crowd_out_real_clients() -> None:
    """A new connection over ``max_handshakes`` closes the oldest one still in its handshake. Before, the new
    one was refused: a flood of silent sockets, renewed as they timed out, kept every genuine client out."""
    async with await StoreServer.start(HOST, 0, max_handshakes=2, handshake_timeout=30) as srv:
        clients = [await TCPStore.connect(HOST, srv.port, timeout=5) for _ in range(4)]  # authenticated: not counted
        stuck = [await asyncio.open_connection(HOST, srv.port) for _ in range(2)]  # never authenticate
        await until(lambda: srv._admission.handshaking == 2)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with await TCPStore.connect(HOST, srv.port, timeout=5) as late:  # at once, not after 30 s
            assert await late.add("n", 1) == 1
        assert loop.time() - t0 < 3.0
        assert srv._admission.evicted >= 1 and srv._admission.refused == 0
        try:  # the oldest was closed (reset) for it
            assert await asyncio.wait_for(stuck[0][0].read(), 5) == b""
        except ConnectionResetError:
            pass
        for c in clients:
            assert await c.add("n", 1) > 1
            await c.close()
        for _, w in stuck:
            w.close()
        await until(lambda: srv._admission.handshaking == 0 and srv._admission.open == 0)


async def test_a_deeply_nested_hello_or_request_is_refused_in_one_line(caplog: Any) -> None:
    """Before: formatting the peer's value raised RecursionError: a traceback logged per connection (before
    authentication: by anyone), and after it the connection was dropped with no reply."""
    deep = b"\x91" * 1000 + b"\xc0"  # msgpack: a list nested 1000 deep
    async with await StoreServer.start(HOST, 0, secret=SECRET) as srv:
        for field in (b"\xa1v", b"\xa2op"):
            hello = b"\x83\xa2op\xa5hello\xa5proto" + msgpack.packb(P.PROTO) + field + deep
            if field == b"\xa2op":
                hello = b"\x82\xa5proto" + msgpack.packb(P.PROTO) + field + deep
            r, w = await asyncio.open_connection(HOST, srv.port)
            w.write(PREAMBLE + struct.pack("<IQ", len(hello), 0) + hello)
            await w.drain()
            assert await asyncio.wait_for(r.read(), 5)  # an error frame, then closed
            w.close()
        r, w = await asyncio.open_connection(HOST, srv.port)
        assert (await handshake(r, w, SECRET)).get("op") == "hello"  # (the welcome) then an authenticated deep op:
        request = b"\x82\xa2id\x01\xa2op" + deep
        w.write(struct.pack("<IQ", len(request), 0) + request)
        head, _ = await read_frame(r)
        assert head["err"] == P.UNKNOWN_OP and head["id"] == 1, head
        w.close()
        async with await TCPStore.connect(HOST, srv.port, secret=SECRET, timeout=5) as c:
            assert await c.add("n", 1) == 1  # still serving
    assert not [r for r in caplog.records if r.exc_info or "RecursionError" in r.getMessage()], caplog.text


async def test_quotas_refuse_the_writer_with_a_clear_error() -> None:
    async with await StoreServer.start(HOST, 0, max_client_bytes=10_000, max_total_bytes=25_000) as srv:
        a = await TCPStore.connect(HOST, srv.port, timeout=5)
        b = await TCPStore.connect(HOST, srv.port, timeout=5)
        await a.set("a1", b"x" * 9_000)
        with pytest.raises(StoreRequestError) as info:
            await a.set("a2", b"x" * 2_000)
        assert info.value.code == "quota_exceeded" and info.value.key == "a2"
        assert "max_client_bytes" in str(info.value) and "10000" in str(info.value)
        await a.set("a1", b"x" * 5_000)  # shrinking frees room
        await a.set("a2", b"x" * 2_000)
        await a.close()  # its 7 KB stay, in the total only
        await until(lambda: srv.state.stored_bytes() == 7_004 + 2 * ENTRY_BYTES and len(srv._sessions) == 1)
        await b.set("b1", b"y" * 9_000)
        c = await TCPStore.connect(HOST, srv.port, timeout=5)
        await c.set("c1", b"z" * 8_000)
        with pytest.raises(StoreRequestError) as info:
            await c.queue_push("c2", b"z" * 1_500)
        assert info.value.code == "quota_exceeded" and "max_total_bytes" in str(info.value)
        assert await b.get("a1") == b"x" * 5_000
        await b.close()
        await c.close()


async def test_a_client_parking_past_max_waiter_bytes_is_refused_while_others_keep_working() -> None:
    one = waiter_cost(("k0",))
    async with await StoreServer.start(HOST, 0, max_waiter_bytes=4 * one) as srv:
        a = await TCPStore.connect(HOST, srv.port, timeout=5)
        b = await TCPStore.connect(HOST, srv.port, timeout=5)
        parked = [asyncio.create_task(a.get(f"k{i}", timeout=30)) for i in range(3)]
        short = asyncio.create_task(a.get("k3", timeout=0.3))
        await until(lambda: srv.state.waiter_count() == 4)
        with pytest.raises(StoreRequestError) as info:
            await a.get("k4", timeout=30)
        e = info.value
        assert e.code == "waiter_quota_exceeded" and e.op == "get" and e.key == "k4"
        assert e.limit == "max_waiter_bytes" and e.limit_value == 4 * one
        assert "max_waiter_bytes" in str(e) and str(4 * one) in str(e)
        with pytest.raises(StoreRequestError) as info:
            await a.wait([f"w{i}" for i in range(100)], timeout=30)  # more than the whole limit in one request
        assert info.value.code == "waiter_quota_exceeded"
        assert await a.add("n", 1) == 1  # its connection stays usable
        # another client is served, parks and is woken as usual
        woken = asyncio.create_task(b.get("later", timeout=30))
        await until(lambda: srv.state.waiter_count() == 5)
        await b.set("later", b"v")
        assert await woken == b"v" and await b.add("n", 1) == 2
        # a timeout gives back what the request was charged
        with pytest.raises(StoreTimeoutError):
            await short
        await until(lambda: srv.state.waiter_bytes() == 3 * one)
        parked.append(asyncio.create_task(a.get("k3", timeout=30)))
        await until(lambda: srv.state.waiter_count() == 4)
        # a completion too
        await b.set("k0", b"v0")
        assert await parked[0] == b"v0"
        parked.append(asyncio.create_task(a.get("k4", timeout=30)))
        await until(lambda: srv.state.waiter_count() == 4 and srv.state.waiter_bytes() == 4 * one)
        # frames sent by hand (what a MITM could inject): the refusals come back, memory stays bounded
        r, w = await asyncio.open_connection(HOST, srv.port)
        await handshake(r, w)
        w.write(b"".join(frame({"op": "wait", "ks": [f"{i}.{j}" for j in range(3)], "t": None, "id": i}) for i in range(50)))
        replies = [(await read_frame(r))[0] for _ in range(50 - 4 * one // waiter_cost(["0.0", "0.1", "0.2"]))]
        assert all(h["err"] == "waiter_quota_exceeded" and h["limit"] == "max_waiter_bytes" for h in replies)
        assert srv.state.waiter_bytes() <= 2 * 4 * one
        w.close()
        await until(lambda: srv.state.waiter_bytes() == 4 * one)  # the hand-made client left: its waiters went
        await a.close()  # so do a's
        for t in parked[1:]:
            with pytest.raises(ConnectionError):
                await t
        await until(lambda: srv.state.waiter_bytes() == 0 and srv.state.waiter_count() == 0)
        assert await b.add("n", 1) == 3
        await b.close()


async def test_a_client_that_stops_reading_is_cut_off_after_the_send_timeout(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiodist.store")
    async with await StoreServer.start(HOST, 0, send_timeout=0.5, idle_timeout=None) as srv:
        async with await TCPStore.connect(HOST, srv.port, timeout=5) as c:
            await c.set("big", b"x" * (256 * 1024))
            r, w = await asyncio.open_connection(HOST, srv.port)
            await handshake(r, w)
            await until(lambda: len(srv._sessions) == 2)
            w.write(b"".join(frame({"op": "get", "id": i, "k": "big"}) for i in range(200)))  # ~50 MB, never read
            await until(lambda: len(srv._sessions) == 1, timeout=10)
            assert any("cut off" in m and "send_timeout" in m for m in store_messages(caplog))
            assert await c.add("others", 1) == 1  # everyone else is served throughout
            w.close()


async def test_replies_piling_up_for_a_client_past_the_outbox_limit_cut_it_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiodist.store")
    async with await StoreServer.start(HOST, 0, max_outbox_bytes=4 << 20, send_timeout=None) as srv:
        async with await TCPStore.connect(HOST, srv.port, timeout=5) as c:
            r, w = await asyncio.open_connection(HOST, srv.port)
            await handshake(r, w)
            w.write(b"".join(frame({"op": "get", "id": i, "k": "later"}) for i in range(64)))
            await until(lambda: srv.state.waiter_count() == 64)
            await c.set("later", b"x" * (1 << 20))  # 64 replies of 1 MiB for a client that reads nothing
            await until(lambda: len(srv._sessions) == 1)
            assert any("cut off" in m and "max_outbox_bytes" in m for m in store_messages(caplog))
            assert srv.state.waiter_count() == 0
            assert await c.get("later") == b"x" * (1 << 20)
            w.close()


async def _non_reading_client(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An authenticated raw connection with a tiny receive buffer (it will not read)."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (HOST, port))
    r, w = await asyncio.open_connection(sock=sock)
    await handshake(r, w)
    return r, w


@pytest.mark.parametrize("flood", ["timeout_errors", "pongs"])
async def test_error_replies_and_pongs_left_unread_count_what_they_hold_against_the_outbox_limit(
    caplog: pytest.LogCaptureFixture, flood: str
) -> None:
    # store audit s21, finding 1: they were counted as 64 bytes each, so a client that never read
    # its timeout errors (each naming its keys) or pongs grew the server far past max_outbox_bytes.
    caplog.set_level(logging.INFO, logger="aiodist.store")
    async with await StoreServer.start(HOST, 0, max_outbox_bytes=256 << 10, send_timeout=None, idle_timeout=None) as srv:
        async with await TCPStore.connect(HOST, srv.port, timeout=5) as c:
            await c.set("big", b"x" * (12 << 20))  # one reply that fills every socket buffer: the writer waits
            r, w = await _non_reading_client(srv.port)
            await until(lambda: len(srv._sessions) == 2)
            w.write(frame({"op": "get", "id": 0, "k": "big"}))
            if flood == "pongs":  # 2,000 pongs: 128 KB at 64 bytes each, below the limit
                w.write(b"".join(frame({"op": "ping"}) for _ in range(2000)))
            else:  # 64 timeout errors naming 8 keys of 1,000 characters: 4 KB at 64 bytes each
                keys = [f"{i}-" + "k" * 1000 for i in range(8)]
                w.write(b"".join(frame({"op": "wait", "id": i, "ks": keys, "t": 0.0}) for i in range(1, 65)))
            await until(lambda: len(srv._sessions) == 1, timeout=3)
            assert any("cut off" in m and "max_outbox_bytes" in m for m in store_messages(caplog))
            assert await c.add("others", 1) == 1  # everyone else is served throughout
            w.close()


async def test_a_multi_get_whose_reply_would_exceed_two_max_values_is_refused_and_the_connection_lives() -> None:
    # store audit s21, finding 2: a key repeated in one multi_get multiplied its value into a reply of any size
    # (gigabytes for a request of a few KB); a genuine client lost its connection to the oversized frame.
    limit = 64 << 10
    async with await StoreServer.start(HOST, 0, max_value_bytes=limit) as srv:
        async with await TCPStore.connect(HOST, srv.port, timeout=5) as c:
            await c.set("big", b"x" * limit)
            assert await c.multi_get(["big", "big"]) == [b"x" * limit] * 2  # two maximum values: allowed
            with pytest.raises(StoreRequestError) as e:
                await c.multi_get(["big"] * 2000)
            assert e.value.code == "request_too_large" and e.value.limit == "max_value_bytes"
            assert e.value.limit_value == limit and "its 2000 keys" in str(e.value) and str(2 * limit) in str(e.value)
            # A multi_get that waits is refused the same way when the value it waited for completes it.
            waiting = asyncio.ensure_future(c.multi_get(["big", "big", "later"], timeout=5))
            await until(lambda: srv.state.waiter_count() == 1)
            await c.set("later", b"y")
            with pytest.raises(StoreRequestError) as e:
                await waiting
            assert e.value.code == "request_too_large"
            assert await c.get("big") == b"x" * limit  # the connection and the server are fine
            assert srv.clients == 1


async def test_a_value_given_back_with_unpop_is_checked_and_charged_like_queue_push(caplog: pytest.LogCaptureFixture) -> None:
    # store audit s21, finding 3: unpop stored any key and value, over every quota, charged to nobody.
    caplog.set_level(logging.INFO, logger="aiodist.store")
    limits = dict(max_total_bytes=64 << 10, max_client_bytes=32 << 10, max_value_bytes=16 << 10, max_key_bytes=1024)
    async with await StoreServer.start(HOST, 0, **limits) as srv:
        async with await TCPStore.connect(HOST, srv.port, timeout=5) as innocent:
            r, w = await asyncio.open_connection(HOST, srv.port)
            await handshake(r, w)
            cid = max(srv._sessions)
            w.write(b"".join(frame({"op": "unpop", "k": "q", "v": [b"x" * 8000]}) for _ in range(10)))
            w.write(frame({"op": "ping"}))
            assert (await read_frame(r))[0] == {"op": "pong"}
            assert await innocent.queue_len("q") == 4  # 4 x 8,001 bytes fit in its 32 KiB; the rest was dropped
            assert srv.state.stored_bytes(cid) == 4 * (8001 + ENTRY_BYTES)
            assert any("gave back a popped value that was dropped" in m and "max_client_bytes" in m
                       for m in store_messages(caplog))
            # (a flood of them logs a line per interval, not one each: store re-audit s22, finding 4)
            w.write(b"".join(frame({"op": "unpop", "k": "q", "v": [b"x" * 8000]}) for _ in range(500)))
            w.write(frame({"op": "ping"}))
            assert (await read_frame(r))[0] == {"op": "pong"}
            assert sum("dropped" in m for m in store_messages(caplog)) <= 3
            w.write(frame({"op": "unpop", "k": "k" * 2000, "v": [b"x"]}))  # a key no push could have stored
            head, _ = await read_frame(r)
            assert head["err"] == P.BAD_REQUEST and "key of 2000 bytes exceeds the limit of 1024 bytes" in head["msg"]
            assert await r.read() == b""  # that connection is closed
            assert await innocent.queue_len("k" * 1000) == 0
            await innocent.set("innocent", b"1")
            w.close()


def test_limits_from_a_spec_and_back() -> None:
    limits = StoreLimits.parse("max_connections=2000, max_client_bytes=256MiB,idle_timeout=none,send-timeout=5s")
    assert limits.max_connections == 2000 and limits.max_client_bytes == 256 << 20
    assert limits.idle_timeout is None and limits.send_timeout == 5.0
    assert StoreLimits.parse(limits.spec()) == limits
    assert StoreLimits.parse("") == StoreLimits()
    assert StoreLimits().frame_bytes == 2 * (64 << 20) + 8192 + (1 << 20)
    assert StoreLimits.from_environment({"AIODIST_STORE_LIMITS": "max_total_bytes=1G"}.get).max_total_bytes == 1 << 30
    for bad in ("max_connections", "nope=1", "max_connections=many", "max_client_bytes=12XB", "max_connections=0",
                "handshake_timeout=none", "idle_timeout=-1"):
        with pytest.raises(ValueError):
            StoreLimits.parse(bad)
    with pytest.raises(TypeError):
        StoreLimits().replace(max_conections=3)
