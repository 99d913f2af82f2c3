"""TCP: memory follows the bytes that arrive, never what a header claims; a closed connection frees it at once.

Real sockets on 127.0.0.1, one listener in this process; memory measured as
the process's resident set (Linux ``/proc/self/statm``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import sys
from typing import Any, Callable

import pytest

from aiodist.net.base import Connection
from aiodist.net.tcp import TCPNetwork
from aiodist.wire import PREAMBLE, encode_header

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/statm")

MB = 1_000_000
CLAIM = 512 << 20  # what each header announces (within the default frame limit)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def announce(nbytes: int, header: dict[str, Any] | None = None) -> bytes:
    """A preamble and a frame prefix + header announcing a payload of ``nbytes`` (~40 bytes in all)."""
    h = encode_header(header or {"t": "m", "k": [1, 2]})
    return PREAMBLE + struct.pack("<IQ", len(h), nbytes) + h


async def _settle(loop: asyncio.AbstractEventLoop) -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


async def _until(done: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll ``done`` every 10 ms for at most ``seconds`` (a busy machine can be slow to read or unmap)."""
    for _ in range(int(seconds / 0.01)):
        if done():
            return
        await asyncio.sleep(0.01)


def test_eight_sockets_announcing_huge_payloads_take_no_memory_for_them() -> None:
    """8 raw sockets send ~40 bytes each: a header announcing 512 MiB. The listener grows by at most 16 MB."""

    async def main() -> int:
        net = TCPNetwork()
        conns: list[Connection] = []

        async def handler(conn: Connection) -> None:
            conns.append(conn)
            await conn.recv()

        async with await net.listen(("127.0.0.1", 0), handler) as lis:
            gc.collect()
            before = rss()
            socks = []
            for _ in range(8):
                s = socket.create_connection(lis.address)
                s.sendall(announce(CLAIM))
                socks.append(s)
            loop = asyncio.get_running_loop()
            for _ in range(200):
                if len(conns) == 8:
                    break
                await asyncio.sleep(0.01)
            await _settle(loop)
            grown = rss() - before
            for s in socks:
                s.close()
            return grown

    grown = asyncio.run(main())
    assert grown <= 16 * MB, f"8 announced payloads took {grown / MB:.1f} MB"


def test_a_payload_without_a_sink_grows_with_the_bytes_that_arrived() -> None:
    """3 MiB of an announced 512 MiB arrive: the listener grows by about that much, not by the claim."""

    async def main() -> int:
        net = TCPNetwork()
        started = asyncio.Event()

        async def handler(conn: Connection) -> None:
            started.set()
            await conn.recv()

        async with await net.listen(("127.0.0.1", 0), handler) as lis:
            gc.collect()
            before = rss()
            s = socket.create_connection(lis.address)
            s.sendall(announce(CLAIM) + bytes(3 << 20))
            await asyncio.wait_for(started.wait(), 10)
            await _settle(asyncio.get_running_loop())
            grown = rss() - before
            s.close()
            return grown

    grown = asyncio.run(main())
    assert grown <= (3 << 20) + 12 * MB, f"grew by {grown / MB:.1f} MB for 3 MiB received"


def test_a_closed_connection_frees_a_half_received_payload_at_once_without_the_garbage_collector() -> None:
    """A protocol whose sink and handler refer back to the connection; 40 MiB of a 64 MiB payload arrived.

    With the collector disabled, closing the connection must free those 40 MiB at once.
    """

    async def main() -> tuple[int, int]:
        net = TCPNetwork()
        accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

        async def handler(conn: Connection) -> None:
            class Protocol:  # refers to the connection, the connection to it: a cycle until close
                def __init__(self) -> None:
                    self.conn = conn

                def sink(self, header: dict[str, Any], n: int, received: int) -> None:
                    return None

                def on_frame(self, frame: Any) -> None:
                    pass

            p = Protocol()
            conn.set_payload_sink(p.sink)
            conn.set_frame_handler(p.on_frame)
            accepted.set_result(conn)
            await asyncio.sleep(60)

        async with await net.listen(("127.0.0.1", 0), handler) as lis:
            s = socket.create_connection(lis.address)
            s.setblocking(False)
            conn = await asyncio.wait_for(accepted, 10)
            loop = asyncio.get_running_loop()
            gc.collect()
            start = rss()
            await loop.sock_sendall(s, announce(64 << 20) + bytes(40 << 20))
            # Every byte sent is read (not just queued in the kernel) before the resident set is taken.
            await _until(lambda: (conn.progress or 0) >= (40 << 20))
            await _settle(loop)
            gc.disable()
            try:
                before = rss()
                conn.close()
                del conn
                await _until(lambda: before - rss() >= 35 * MB)
                after = rss()
            finally:
                gc.enable()
            s.close()
            return before - start, before - after

    held, freed = asyncio.run(main())
    assert held >= 35 * MB, f"only {held / MB:.1f} MB were held for the 40 MiB received"
    assert freed >= 35 * MB, f"closing freed only {freed / MB:.1f} MB of the {held / MB:.1f} MB held"
