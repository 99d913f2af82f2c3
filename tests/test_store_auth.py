"""The store's authenticated handshake over real TCP: who gets in, who is refused, and what a refusal says."""

from __future__ import annotations

import asyncio
import logging
import os
import struct

import pytest

from aiodist import auth
from aiodist.auth import AuthenticationError
from aiodist.store import StoreServer, TCPStore
from aiodist.store import protocol as P
from aiodist.wire import PREAMBLE
from store_wire import frame, handshake, read_frame

HOST = "127.0.0.1"
SECRET = b"the job's secret"
JOB_ID = "job-7f3a/0/12.5/0"


async def raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(HOST, port)


async def everything_until_closed(r: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    data = b""
    async with asyncio.timeout(timeout):
        while chunk := await r.read(65536):
            data += chunk
    return data


@pytest.fixture
async def server():
    srv = await StoreServer.start(HOST, 0, secret=SECRET, handshake_timeout=2.0)
    async with await TCPStore.connect(HOST, srv.port, secret=SECRET, timeout=5) as owner:
        await owner.set("aiodist/0/job", f"2 {JOB_ID}")  # what a refusal must never reveal
        await owner.set("aiodist/0/addr/0", b"127.0.0.1|40000")
    try:
        yield srv
    finally:
        await srv.close()


async def test_the_same_secret_gets_in(server: StoreServer) -> None:
    async with await TCPStore.connect(HOST, server.port, secret=SECRET, timeout=5) as c:
        assert await c.get("aiodist/0/job") == f"2 {JOB_ID}".encode()
    assert server.authenticated and "authenticated" in repr(server)


async def test_another_secret_is_refused_and_told_nothing(server: StoreServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiodist.store")
    with pytest.raises(AuthenticationError) as info:
        await TCPStore.connect(HOST, server.port, secret=b"a guess", timeout=5)
    assert info.value.reason == "bad_proof"  # the server proves first: the client finds out and leaves
    assert JOB_ID not in str(info.value)
    async with asyncio.timeout(5):
        while not any("refused a connection" in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.01)
    assert not any(JOB_ID in r.getMessage() or "aiodist/0" in r.getMessage() for r in caplog.records)


async def test_a_client_without_a_secret_is_refused_and_the_refusal_reveals_nothing(server: StoreServer) -> None:
    r, w = await raw(server.port)
    reply = await handshake(r, w, secret=None)
    assert reply == {"op": "error", "err": "refused", "msg": "authentication failed"}
    assert await everything_until_closed(r) == b""
    w.close()


async def test_a_wrong_answer_is_refused_the_same_way(server: StoreServer) -> None:
    r, w = await raw(server.port)
    dialer = auth.Dialer(SECRET, purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
    w.write(PREAMBLE + frame(P.hello(dialer.hello())))
    assert await r.readexactly(8) == PREAMBLE
    challenge, _ = await read_frame(r)
    assert challenge["op"] == "challenge" and set(challenge) == {"op", "nonce", "proof"}
    w.write(frame(P.answer({"proof": b"\0" * 32})))
    refusal, _ = await read_frame(r)
    assert refusal == P.refusal()
    assert await everything_until_closed(r) == b""
    w.close()


@pytest.mark.parametrize("request_", [
    {"op": "get", "id": 1, "k": "aiodist/0/job"},
    {"op": "set", "id": 1, "k": "aiodist/0/addr/1", "v": [b"6.6.6.6|1"]},
    {"op": "num_keys", "id": 1},
], ids=["get", "set", "num_keys"])
async def test_requests_in_place_of_the_answer_get_no_data_and_change_nothing(server: StoreServer, request_: dict) -> None:
    r, w = await raw(server.port)
    dialer = auth.Dialer(SECRET, purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
    w.write(PREAMBLE + frame(P.hello(dialer.hello())) + frame(request_) + frame(request_))
    data = await everything_until_closed(r)
    assert JOB_ID.encode() not in data and b"40000" not in data
    assert frame(P.refusal()) in data
    w.close()
    async with await TCPStore.connect(HOST, server.port, secret=SECRET, timeout=5) as c:
        assert await c.check(["aiodist/0/addr/1"]) is False
        assert await c.num_keys() == 2


async def test_the_client_refuses_a_server_that_cannot_prove_the_secret() -> None:
    async with await StoreServer.start(HOST, 0, secret=b"an impostor's guess") as impostor:
        with pytest.raises(AuthenticationError) as info:
            await TCPStore.connect(HOST, impostor.port, secret=SECRET, timeout=5)
        assert info.value.reason == "bad_proof"


async def test_the_client_refuses_a_server_without_authentication(caplog: pytest.LogCaptureFixture) -> None:
    monkey_warned = auth._warned_insecure
    async with await StoreServer.start(HOST, 0, secret=None) as open_server:
        assert not open_server.authenticated and "INSECURE" in repr(open_server)
        with pytest.raises(AuthenticationError) as info:
            await TCPStore.connect(HOST, open_server.port, secret=SECRET, timeout=5)
        assert info.value.reason == "no_proof"
        async with await TCPStore.connect(HOST, open_server.port, secret=None, timeout=5) as c:
            assert await c.add("n", 1) == 1  # both sides opted out: allowed (with a warning)
    auth._warned_insecure = monkey_warned


async def test_the_default_secret_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIODIST_SECRET", "from-env")
    async with await StoreServer.start(HOST, 0) as srv:
        async with await TCPStore.connect(HOST, srv.port, secret="from-env", timeout=5) as c:
            assert await c.add("n", 1) == 1
        with pytest.raises(AuthenticationError):
            await TCPStore.connect(HOST, srv.port, secret="other", timeout=5)


async def test_a_silent_client_after_its_hello_is_closed_within_the_handshake_timeout(server: StoreServer) -> None:
    r, w = await raw(server.port)
    dialer = auth.Dialer(SECRET, purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
    w.write(PREAMBLE + frame(P.hello(dialer.hello())))  # and never answers the challenge
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await everything_until_closed(r, timeout=5)
    assert loop.time() - t0 < 4.0
    w.close()


async def test_a_large_frame_before_authentication_is_refused_without_reading_it(server: StoreServer) -> None:
    r, w = await raw(server.port)
    dialer = auth.Dialer(SECRET, purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
    hello = frame(P.hello(dialer.hello()))
    big = msgpack_hello = hello[12:]  # the hello's own header, now announcing a 64 MiB payload
    w.write(PREAMBLE + struct.pack("<IQ", len(big), 64 << 20) + msgpack_hello)
    await everything_until_closed(r)
    w.close()
    async with await TCPStore.connect(HOST, server.port, secret=SECRET, timeout=5) as c:
        assert await c.num_keys() == 2
