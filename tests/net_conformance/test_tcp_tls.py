"""TCP over TLS: the same frames, payload sinks, backpressure and cancellation guarantees as in the clear.

A self-signed certificate for 127.0.0.1 made with the ``openssl`` command
(skipped without it); real sockets, the default loop and uvloop.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from aiodist.errors import ConnectionLost
from aiodist.net.base import Connection
from aiodist.net.tcp import TCPNetwork
from test_net_tcp import LOOPS, run_on

MIB = 1 << 20


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting the server's self-signed certificate)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a certificate")
    folder: Path = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], cwd=folder, check=True, capture_output=True, timeout=60)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(folder / "cert.pem"))
    return server, client


@contextlib.asynccontextmanager
async def paired(net: TCPNetwork,
                 contexts: tuple[ssl.SSLContext, ssl.SSLContext] | None) -> AsyncIterator[tuple[Connection, Connection]]:
    """A connection to a fresh listener and the listener's end of it, over TLS with ``contexts``, else in the clear.

    Both closed (and the listener) at exit.
    """
    accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

    async def handler(conn: Connection) -> None:
        accepted.set_result(conn)
        await asyncio.sleep(60)

    lis = await net.listen(("127.0.0.1", 0), handler, ssl=None if contexts is None else contexts[0])
    conn = await net.connect(lis.address, timeout=10, ssl=None if contexts is None else contexts[1])
    try:
        yield conn, await asyncio.wait_for(accepted, 10)
    finally:
        conn.close()
        lis.close()
        await lis.wait_closed()


@pytest.mark.parametrize("loop", LOOPS)
def test_frames_and_a_payload_sink_over_tls(loop: str, contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    async def main() -> None:
        async with paired(TCPNetwork(), contexts) as (a, b):
            dest = np.zeros(3 * MIB, dtype=np.uint8)
            b.set_payload_sink(lambda h, n, got: memoryview(dest) if h.get("to") == "dest" else None)
            src = np.random.default_rng(2).integers(0, 255, size=3 * MIB, dtype=np.uint8)
            await a.send({"i": 0})
            await a.send({"i": 1, "to": "dest"}, src)
            await a.send({"i": 2}, src[: MIB + 5])
            got = [await asyncio.wait_for(b.recv(), 20) for _ in range(3)]
            assert [f.header["i"] for f in got] == [0, 1, 2]
            assert np.array_equal(dest, src) and np.shares_memory(np.frombuffer(got[1].payload, np.uint8), dest)
            assert bytes(got[2].payload) == src[: MIB + 5].tobytes()
            await b.send({"back": 1}, b"xyz")
            assert bytes((await asyncio.wait_for(a.recv(), 10)).payload) == b"xyz"

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_send_over_tls_frees_the_callers_buffer(loop: str, contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    async def main() -> None:
        async with paired(TCPNetwork(), contexts) as (a, b):
            payload = bytearray(b"\x01" * (32 * MIB))
            send = asyncio.ensure_future(a.send({"i": "big"}, payload))
            await asyncio.sleep(0.05)
            send.cancel()
            await asyncio.gather(send, return_exceptions=True)
            payload[:] = b"\x02" * len(payload)
            payload.extend(b"more")  # BufferError if anything still referred to it
            await a.send({"i": "end"})
            frames = [await asyncio.wait_for(b.recv(), 20) for _ in range(2)]
            assert [f.header["i"] for f in frames] == ["big", "end"]
            assert bytes(frames[0].payload[:4]) == bytes(frames[0].payload[-4:]) == b"\x01" * 4

    run_on(loop, main)


def test_a_client_without_tls_or_trust_gets_nowhere(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    async def main() -> None:
        net = TCPNetwork()

        async def handler(conn: Connection) -> None:
            await conn.recv()

        async with await net.listen(("127.0.0.1", 0), handler, ssl=contexts[0]) as lis:
            stranger = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)  # trusts the system's CAs only
            with pytest.raises(ConnectionLost, match="TLS"):
                await net.connect(lis.address, timeout=10, ssl=stranger)
            plain = await net.connect(lis.address, timeout=10)  # TCP connects; the server never completes TLS
            await plain.send({"hello": 1})
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(plain.recv(), 10)

    run_on("asyncio", main)
