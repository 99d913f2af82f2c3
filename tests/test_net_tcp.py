"""The TCP implementation of the network seam, over real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from aiodist.errors import ConnectionClosedLocally, ConnectionLost
from aiodist.net.tcp import TCPNetwork
from aiodist.wire import PREAMBLE, encode_frame

LOOPS = ["asyncio", "uvloop"]


def run_on(loop_name: str, coro_fn):
    if loop_name == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        factory = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as r:
        return r.run(asyncio.wait_for(coro_fn(), 30))


async def _echo_server(net: TCPNetwork, **kw):
    async def handler(conn):
        while True:
            f = await conn.recv()
            await conn.send(f.header, f.payload)

    return await net.listen(("127.0.0.1", 0), handler, **kw)


@pytest.mark.parametrize("loop", LOOPS)
def test_roundtrip_small_and_large(loop):
    async def main():
        net = TCPNetwork()
        async with await _echo_server(net) as lis:
            conn = await net.connect(lis.address, timeout=5)
            big = np.arange(3_000_000, dtype=np.float64)  # 24 MB: larger than any socket buffer
            await conn.send({"i": 1})
            await conn.send({"i": 2}, b"xyz")
            await conn.send({"i": 3}, big)
            f1, f2, f3 = [await conn.recv() for _ in range(3)]
            assert f1.header == {"i": 1} and f1.payload is None
            assert f2.header == {"i": 2} and bytes(f2.payload) == b"xyz"
            assert np.array_equal(np.frombuffer(f3.payload, dtype=np.float64), big)
            await conn.aclose()

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_payload_sink_receives_in_place(loop):
    async def main():
        net = TCPNetwork()
        async with await _echo_server(net) as lis:
            conn = await net.connect(lis.address)
            dest = np.zeros(1_000_000, dtype=np.int32)
            conn.set_payload_sink(lambda h, n: memoryview(dest).cast("B") if h.get("to") == "dest" else None)
            src = np.arange(1_000_000, dtype=np.int32)
            await conn.send({"to": "dest"}, src)
            f = await conn.recv()
            assert np.array_equal(dest, src)
            assert f.payload.obj is dest or np.shares_memory(np.frombuffer(f.payload, dtype=np.int32), dest)
            await conn.aclose()

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_concurrent_senders_do_not_interleave(loop):
    async def main():
        net = TCPNetwork()
        async with await _echo_server(net) as lis:
            conn = await net.connect(lis.address)
            payloads = [np.full(200_000 + i, i, dtype=np.uint8) for i in range(20)]
            await asyncio.gather(*(conn.send({"i": i}, p) for i, p in enumerate(payloads)))
            got = {}
            for _ in range(20):
                f = await conn.recv()
                got[f.header["i"]] = np.frombuffer(f.payload, dtype=np.uint8)
            for i, p in enumerate(payloads):
                assert np.array_equal(got[i], p)
            await conn.aclose()

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_errors_say_whose_fault(loop):
    async def main():
        net = TCPNetwork()
        closed = asyncio.Event()

        async def handler(conn):
            await conn.recv()
            conn.close()
            closed.set()

        async with await net.listen(("127.0.0.1", 0), handler) as lis:
            conn = await net.connect(lis.address)
            await conn.send({"bye": True})
            await closed.wait()
            with pytest.raises(ConnectionLost, match="closed the connection"):
                await asyncio.wait_for(conn.recv(), 5)
            conn2 = await net.connect(lis.address)
            conn2.close()
            with pytest.raises(ConnectionClosedLocally):
                await conn2.recv()
            with pytest.raises(ConnectionClosedLocally):
                await conn2.send({"x": 1})
        with pytest.raises(ConnectionLost, match="could not connect"):
            await net.connect(lis.address, timeout=5)

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_bad_peers_are_dropped_and_server_keeps_serving(loop):
    async def main():
        net = TCPNetwork()
        async with await _echo_server(net, max_frame_size=1 << 20, handshake_timeout=0.3) as lis:
            host, port = lis.address
            loop_ = asyncio.get_running_loop()

            async def raw(data: bytes) -> bytes:
                r, w = await asyncio.open_connection(host, port)
                w.write(data)
                try:
                    out = await asyncio.wait_for(r.read(), 5)  # server must close on us
                finally:
                    w.close()
                return out

            head, _ = encode_frame({"a": 1})
            await raw(b"GET / HTTP/1.1\r\n\r\n")  # wrong preamble
            await raw(PREAMBLE + b"\xff" * 12)  # 2**64-ish length prefix
            import struct
            await raw(PREAMBLE + struct.pack("<IQ", 5, 1 << 62))
            await raw(PREAMBLE + struct.pack("<IQ", 3, 0) + b"\xc1\xc1\xc1")  # undecodable header
            await raw(PREAMBLE + struct.pack("<IQ", 1, 0) + b"\x01")  # header not a map
            t0 = loop_.time()
            await raw(b"")  # silent: closed by the handshake timeout
            assert loop_.time() - t0 < 3
            # a well-behaved client still works
            conn = await net.connect(lis.address)
            await conn.send({"ok": 1}, b"p")
            f = await conn.recv()
            assert f.header == {"ok": 1}
            await conn.aclose()

    run_on(loop, main)


def test_truncated_frame_then_close_is_connection_lost():
    async def main():
        net = TCPNetwork()
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def handler(conn):
            try:
                await conn.recv()
            except ConnectionLost as e:
                got.set_result(e)

        async with await net.listen(("127.0.0.1", 0), handler) as lis:
            s = socket.create_connection(lis.address)
            head, _ = encode_frame({"a": 1}, b"x" * 100)
            s.sendall(PREAMBLE + head + b"x" * 10)
            s.close()
            e = await asyncio.wait_for(got, 5)
            assert "closed" in str(e)

    run_on("asyncio", main)


def _own_non_loopback_address() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for addr in out.split():
        if "." in addr and not addr.startswith("127."):
            return addr
    return None


def test_default_host_is_loopback_for_a_local_job(monkeypatch):
    from aiodist.net.tcp import local_address_toward

    for master in (None, "127.0.0.1", "localhost", "127.0.0.7"):
        if master is None:
            monkeypatch.delenv("MASTER_ADDR", raising=False)
        else:
            monkeypatch.setenv("MASTER_ADDR", master)
        local_address_toward.cache_clear()
        assert TCPNetwork().default_host() == "127.0.0.1"
    assert TCPNetwork(host="10.1.2.3").default_host() == "10.1.2.3"  # explicit host wins (no lookup)


def test_default_host_for_a_remote_master_is_the_local_route_address(monkeypatch):
    from aiodist.net.tcp import local_address_toward

    own = _own_non_loopback_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    # MASTER_ADDR naming this machine's own interface address: the route is local,
    # nothing leaves the machine, and the answer must be that address, not loopback.
    monkeypatch.setenv("MASTER_ADDR", own)
    local_address_toward.cache_clear()
    assert TCPNetwork().default_host() == own


def test_send_nowait_reports_a_full_buffer_and_drained_waits_for_it():
    async def main():
        net = TCPNetwork()
        release = asyncio.Event()
        got = []

        async def slow_reader(conn):
            await release.wait()
            while True:
                f = await conn.recv()
                got.append(0 if f.payload is None else len(f.payload))

        async with await net.listen(("127.0.0.1", 0), slow_reader) as lis:
            conn = await net.connect(lis.address)
            assert conn.send_nowait({"small": 1}) is True
            chunk = np.zeros(1 << 20, dtype=np.uint8)
            results = []
            for _ in range(64):  # 64 MiB: far more than the socket buffers hold
                results.append(conn.send_nowait({"big": 1}, chunk))
                if not results[-1]:
                    break
            assert results[-1] is False, "a peer that does not read must fill the buffer"
            release.set()
            await asyncio.wait_for(conn.drained(), 10)
            await conn.send({"last": 1})
            for _ in range(500):
                if len(got) == len(results) + 2:
                    break
                await asyncio.sleep(0.01)
            assert got == [0] + [1 << 20] * len(results) + [0]  # nothing lost, in order
            await conn.aclose()

    run_on("uvloop", main)
