"""What only the TCP implementation of the seam does, over real sockets on 127.0.0.1.

(What every implementation does is in ``tests/net_conformance``.) Here: bytes
that are not aiodist's protocol, the handshake timeout, and the address the
listeners are published under.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from conftest import run_on

from aiodist.errors import ConnectionLost
from aiodist.net.tcp import TCPNetwork
from aiodist.wire import PREAMBLE, encode_frame

LOOPS = ["asyncio", "uvloop"]


async def _echo_server(net: TCPNetwork, **kw):
    async def handler(conn):
        while True:
            f = await conn.recv()
            await conn.send(f.header, f.payload)

    return await net.listen(("127.0.0.1", 0), handler, **kw)


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


def _lost_after(data: bytes) -> ConnectionLost:
    """What a listener's recv() raises when a raw client sends ``data``, then closes."""

    async def main() -> ConnectionLost:
        net = TCPNetwork()
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def handler(conn):
            try:
                await conn.recv()
            except ConnectionLost as e:
                got.set_result(e)

        async with await net.listen(("127.0.0.1", 0), handler) as lis:
            s = socket.create_connection(lis.address)
            s.sendall(data)
            s.close()
            return await asyncio.wait_for(got, 5)

    return run_on("asyncio", main)


def test_truncated_frame_then_close_is_connection_lost():
    head, _ = encode_frame({"a": 1}, b"x" * 100)
    assert "closed" in str(_lost_after(PREAMBLE + head + b"x" * 10))


def test_bytes_that_break_the_protocol_end_the_connection_saying_so():
    # Before: the ConnectionLost had no .detail, so a rank link whose peer's bytes were altered on the path
    # failed with "rank 0 failed: connection lost", the protocol error dropped.
    import struct

    e = _lost_after(PREAMBLE + struct.pack("<IQ", 3, 0) + b"\xc1\xc1\xc1")  # an undecodable header
    assert e.detail is not None and e.detail.startswith("protocol error: "), (e, e.detail)


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
    for master in (None, "127.0.0.1", "localhost", "127.0.0.7"):
        if master is None:
            monkeypatch.delenv("MASTER_ADDR", raising=False)
        else:
            monkeypatch.setenv("MASTER_ADDR", master)
        assert asyncio.run(TCPNetwork().default_host()) == "127.0.0.1"
    assert asyncio.run(TCPNetwork(host="10.1.2.3").default_host()) == "10.1.2.3"  # explicit host wins (no lookup)


def test_default_host_for_a_remote_master_is_the_local_route_address(monkeypatch):
    own = _own_non_loopback_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    # MASTER_ADDR naming this machine's own interface address: the route is local,
    # nothing leaves the machine, and the answer must be that address, not loopback.
    monkeypatch.setenv("MASTER_ADDR", own)
    assert asyncio.run(TCPNetwork().default_host()) == own


def test_looking_up_master_addr_does_not_block_the_loop(monkeypatch):
    """A slow name lookup (DNS) for MASTER_ADDR runs off the loop: other tasks keep running meanwhile.

    (On the default loop, whose resolver calls socket.getaddrinfo in its executor; uvloop's
    resolver is libuv's, in C, and cannot be slowed down from here.)
    """
    import threading

    real = socket.getaddrinfo
    looked_up_in: list[str] = []

    def slow_getaddrinfo(*args, **kwargs):
        looked_up_in.append(threading.current_thread().name)
        import time

        time.sleep(0.5)  # a lookup that takes long
        return real("127.0.0.1", *args[1:], **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    monkeypatch.setenv("MASTER_ADDR", "master.invalid")

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        host = await TCPNetwork().default_host()
        t.cancel()
        return host, ticks

    host, ticks = run_on("asyncio", main)
    assert host == "127.0.0.1"  # (the name resolved to loopback)
    assert looked_up_in and threading.main_thread().name not in looked_up_in
    assert ticks >= 10, f"the loop was blocked during the lookup ({ticks} ticks in 0.5 s)"


