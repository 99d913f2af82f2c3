"""Authenticated rank links over real TCP: the address-rewrite relay, wrong or missing secrets, the
frame limit before authentication, refusals that reveal nothing."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import numpy as np
import pytest
from transports import channel, closing, start_transports  # noqa: F401 (closing: a fixture)

from aiodist.comm import GroupComm, OpChannel, Transport
from aiodist.comm import frames as F
from aiodist.comm.connect import format_address, parse_address
from aiodist.errors import PeerFailureError, PeerRefusedError
from aiodist.net.tcp import TCPNetwork
from aiodist.store import MemoryStore
from aiodist.wire import PREAMBLE

SECRET = b"the job's secret"


async def start(n: int, store: Any, *, secrets: list[Any] | None = None, job: str = "job") -> list[Transport]:
    return await start_transports(n, store, job=job, secrets=secrets if secrets is not None else [SECRET] * n)


async def exchange(ts: list[Transport]) -> list[float]:
    a, b = (channel(t, 2) for t in ts)
    out = np.zeros(4)
    await asyncio.wait_for(asyncio.gather(a.send(1, ("x",), np.arange(4.0)), b.recv_into(0, ("x",), memoryview(out).cast("B"))), 5)
    return out.tolist()


@pytest.mark.parametrize("secret", [SECRET, None])
async def test_ranks_with_the_same_secret_or_none_at_all_talk(closing: list[Transport], secret: Any) -> None:
    ts = await start(2, MemoryStore(), secrets=[secret, secret])
    closing.extend(ts)
    assert await exchange(ts) == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("secrets", [[SECRET, b"another secret"], [SECRET, None], [None, SECRET]])
async def test_ranks_with_different_secrets_never_link(closing: list[Transport], secrets: list[Any]) -> None:
    ts = await start(2, MemoryStore(), secrets=secrets)
    closing.extend(ts)
    with pytest.raises(PeerFailureError) as e:
        await exchange(ts)
    assert e.value.rank in (0, 1) and "authentication failed" in str(e.value)
    assert ts[0].connected_peers() == [] and ts[1].connected_peers() == []


class Relay:
    """An attacker who rewrote a rank's address in the store: it forwards every byte to the real rank,
    adding 1000.0 to the first float64 of each large chunk it sees (the corruption of issue 13)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.forwarded = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> bytes:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return format_address((host, port))

    async def _relay(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        r2, w2 = await asyncio.open_connection(*self.target)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(1 << 16):
                    if len(data) > 4096:
                        data = data[:64] + struct.pack("<d", struct.unpack_from("<d", data, 64)[0] + 1000.0) + data[72:]
                    self.forwarded += len(data)
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        await asyncio.gather(pump(r1, w2), pump(r2, w1))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_an_attacker_who_rewrote_an_address_and_relays_cannot_sit_in_between(closing: list[Transport]) -> None:
    store = MemoryStore()
    ts = await start(2, store)
    closing.extend(ts)
    real = parse_address(bytes(await store.get("t/addr/0", timeout=1)))
    relay = Relay(real)
    await store.set("t/addr/0", await relay.start())  # rank 1 will dial the attacker
    try:
        channel(ts[0], 2)
        b = channel(ts[1], 2)
        with pytest.raises(PeerFailureError) as e:
            await asyncio.wait_for(b.send(0, ("big",), np.arange(1 << 16, dtype=np.float64)), 5)
        assert "did not prove the job's secret" in str(e.value)
        assert relay.forwarded < 2048  # the handshake only: no payload went through it
        assert ts[0].router.buffered(1) == (0, 0) and ts[0].connected_peers() == []  # nothing reached rank 0
    finally:
        await relay.close()


async def test_frames_are_limited_before_authentication(closing: list[Transport]) -> None:
    """A stranger announcing a huge frame (before or instead of a hello) is cut off, nothing allocated for it."""
    (t,) = await start(1, MemoryStore())
    closing.append(t)
    assert t.address is not None
    for head_len, payload_len in [(16, 1 << 30), (F.MAX_HANDSHAKE_FRAME + 1, 0)]:
        reader, writer = await asyncio.open_connection(*t.address)
        writer.write(PREAMBLE + struct.pack("<IQ", head_len, payload_len))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == PREAMBLE  # then closed: no reply, no waiting for more
        writer.close()


DEEP = b"\x91" * 1000 + b"\xc0"  # msgpack: a list nested 1000 deep


async def test_a_strangers_deeply_nested_hello_is_refused_in_one_line(closing: list[Transport], caplog: Any) -> None:
    """Before: formatting its job id raised RecursionError out of the handshake: a traceback logged per
    connection, without a secret and without a rate limit."""
    (t,) = await start(1, MemoryStore())
    closing.append(t)
    assert t.address is not None
    hello = b"\x82\xa1t\xa5hello\xa3job" + DEEP
    for _ in range(3):
        reader, writer = await asyncio.open_connection(*t.address)
        writer.write(PREAMBLE + struct.pack("<IQ", len(hello), 0) + hello)
        await writer.drain()
        await asyncio.wait_for(reader.read(), 5)  # answered, then closed
        writer.close()
    assert not [r for r in caplog.records if r.exc_info or "RecursionError" in r.getMessage()], caplog.text
    assert t.connected_peers() == []


async def test_a_refusal_never_names_this_ranks_job(closing: list[Transport]) -> None:
    store = MemoryStore()
    (current,) = [await Transport.start(rank=0, world_size=2, job_id="secret-job-2", store=store, key_prefix="t/",
                                        timeout=5.0, secret=SECRET)]
    (stale,) = [await Transport.start(rank=1, world_size=2, job_id="job-1", store=store, key_prefix="t/",
                                      timeout=5.0, secret=SECRET)]
    closing.extend([current, stale])
    with pytest.raises(PeerRefusedError) as e:
        await channel(stale, 2).send(0, ("x",), b"hi")
    assert "wrong job" in e.value.reason and "job-1" in e.value.reason and "secret-job-2" not in str(e.value)


async def test_a_link_costs_no_more_than_before_per_message(
    closing: list[Transport], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Authentication happens once per connection: the frames after it carry nothing of it."""
    ts = await start(2, MemoryStore())
    closing.extend(ts)
    await exchange(ts)
    conn = ts[0]._peers[1].conn
    assert conn is not None
    headers: list[dict[str, Any]] = []
    cls = type(conn)
    original = cls.try_send

    def spy(self: Any, header: Any, payload: Any = None) -> bool:
        if self is conn:
            headers.append(dict(header))
        return original(self, header, payload)

    monkeypatch.setattr(cls, "try_send", spy)  # (on the class: connections are slotted)
    a = OpChannel(GroupComm(ts[0], 0, (0, 1), name="test"), op="test", seq=1, sig="test")
    b = OpChannel(GroupComm(ts[1], 0, (0, 1), name="test"), op="test", seq=1, sig="test")
    out = np.zeros(2)
    await asyncio.gather(a.send(1, ("y",), np.ones(2)), b.recv_into(0, ("y",), memoryview(out).cast("B")))
    assert headers and all(set(h) == {F.KIND, F.GROUP, F.KEY, F.SIG} for h in headers)


async def test_insecure_links_still_need_the_handshake_in_order(closing: list[Transport]) -> None:
    """Without a secret the handshake is the same four frames, with no nonces or proofs."""
    t = await Transport.start(rank=0, world_size=2, job_id="job", store=MemoryStore(), key_prefix="t/", timeout=5.0,
                              secret=None)
    closing.append(t)
    assert t.address is not None
    conn = await TCPNetwork().connect(t.address, timeout=5)
    await conn.send(F.hello("job", 1, 2, 0, {}))
    challenge = (await asyncio.wait_for(conn.recv(), 5)).header
    assert challenge == {F.KIND: F.CHALLENGE}
    await conn.send(F.answer({}))
    assert (await asyncio.wait_for(conn.recv(), 5)).header == {F.KIND: F.WELCOME}
    await conn.aclose()
