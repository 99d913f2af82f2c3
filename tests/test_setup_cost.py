"""Cheaper link set-up, same bytes and same behaviour: proofs against a reference, and the handshake as frame handlers."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
from typing import Any

import numpy as np
import pytest
from transports import channel, closing, start_transports  # noqa: F401 (closing: a fixture)

from aiodist import auth
from aiodist.comm import Transport, peers
from aiodist.comm.connect import format_address
from aiodist.errors import ConnectionLost, PeerFailureError
from aiodist.net.base import Connection
from aiodist.net.tcp import TCPNetwork
from aiodist.store import MemoryStore


def _reference_transcript(purpose: str, role: str, dn: bytes, an: bytes, binding: bytes) -> bytes:
    out = bytearray()
    for part in (b"aiodist-auth/1", purpose.encode(), role.encode(), dn, an, binding):
        out += len(part).to_bytes(4, "big")
        out += part
    return bytes(out)


def _reference_binding(*parts: str | int | bytes) -> bytes:
    out = bytearray()
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out += len(b).to_bytes(4, "big") + b
    return bytes(out)


def test_proofs_and_bindings_are_the_same_bytes_as_before() -> None:
    secret = os.urandom(32)
    for purpose in ("peer", "store"):
        for role in ("dialer", "acceptor"):
            dn, an = os.urandom(32), os.urandom(32)
            b = auth.binding(b"127.0.0.1|5555", "job", 3, 1)
            assert b == _reference_binding(b"127.0.0.1|5555", "job", 3, 1)
            t = auth.transcript(purpose=purpose, role=role, dialer_nonce=dn, acceptor_nonce=an, binding=b)
            assert t == _reference_transcript(purpose, role, dn, an, b)
            expected = hmac.new(secret, t, hashlib.sha256).digest()
            assert auth.proof(secret, purpose=purpose, role=role, dialer_nonce=dn, acceptor_nonce=an, binding=b) == expected


def test_both_sides_proofs_match_the_reference() -> None:
    secret, b = os.urandom(32), auth.binding(b"h|1", "job", 1, 0)
    nd, na = os.urandom(32), os.urandom(32)
    d = auth.Dialer(secret, purpose="peer", binding=b, nonce=nd)
    a = auth.Acceptor(secret, purpose="peer", binding=b, nonce=na)
    challenge = a.challenge(d.hello())
    assert challenge[auth.PROOF] == hmac.new(secret, _reference_transcript("peer", "acceptor", nd, na, b),
                                             hashlib.sha256).digest()
    answer = d.answer(challenge)
    assert answer[auth.PROOF] == hmac.new(secret, _reference_transcript("peer", "dialer", nd, na, b),
                                          hashlib.sha256).digest()
    a.verify(answer)
    assert a.authenticated and d.authenticated


# --------------------------------------------------------------------------- the handshake as frame handlers (TCP)

SECRET = b"the job's secret"


async def _silent_rank(store: MemoryStore) -> Any:
    """A listener published as rank 1's address that accepts and never says a word."""

    async def hold(conn: Connection) -> None:
        await asyncio.Event().wait()

    listener = await TCPNetwork().listen(("127.0.0.1", 0), hold)
    await store.set("t/addr/1", format_address(listener.address))
    return listener


async def test_a_dialer_that_says_nothing_is_hung_up_on_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, closing: list[Transport]
) -> None:
    monkeypatch.setattr(peers, "HELLO_TIMEOUT", 0.2)
    [t] = await start_transports(2, MemoryStore(), ranks=[0], secrets=[SECRET, SECRET])
    closing.append(t)
    assert t.address is not None
    conn = await TCPNetwork().connect(t.address, timeout=5.0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ConnectionLost):
        await asyncio.wait_for(conn.recv(), 5.0)
    assert loop.time() - start < 3.0
    conn.close()


async def test_an_acceptor_that_never_answers_fails_the_dial_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, closing: list[Transport]
) -> None:
    monkeypatch.setattr(peers, "HELLO_TIMEOUT", 0.2)
    store = MemoryStore()
    [t] = await start_transports(2, store, ranks=[0], secrets=[SECRET, SECRET])
    closing.append(t)
    silent = await _silent_rank(store)
    try:
        with pytest.raises(PeerFailureError) as e:
            await asyncio.wait_for(channel(t, 2).send(1, ("x",), np.arange(4.0)), 5.0)
        assert "unreachable (TimeoutError: no handshake from" in str(e.value) and "within 0.2s" in str(e.value)
        assert t.connected_peers() == []
    finally:
        silent.close()


def _dials(t: Transport) -> list[asyncio.Task[Any]]:
    """The dial tasks ``t``'s links own that have not ended."""
    return [task for task in t._links._tasks
            if not task.done() and getattr(task.get_coro(), "__qualname__", "").endswith("._dial")]


async def test_a_cancelled_wait_for_a_link_leaves_nothing_behind_and_close_ends_the_handshake(
    closing: list[Transport],
) -> None:
    store = MemoryStore()
    [t] = await start_transports(2, store, ranks=[0], secrets=[SECRET, SECRET])
    silent = await _silent_rank(store)
    try:
        ch = channel(t, 2)
        sends = [asyncio.ensure_future(ch.send(1, ("x", i), np.arange(4.0))) for i in range(3)]
        await asyncio.sleep(0.1)  # (the dial is in its handshake: the silent rank never answers)
        p = t._links.peers[1]
        assert p.waiters is not None and len(p.waiters) == 3
        sends[0].cancel()
        await asyncio.gather(sends[0], return_exceptions=True)
        assert len(p.waiters) == 2 and len(_dials(t)) == 1
        await asyncio.wait_for(t.close(), 5.0)  # cancels the dial under way (its connection is closed)
        assert _dials(t) == []
        for s in sends[1:]:
            with pytest.raises(Exception):
                await asyncio.wait_for(s, 5.0)
    finally:
        silent.close()


async def test_a_connection_that_ends_during_the_handshake_fails_the_dial_at_once_and_leaves_no_deadline(
    monkeypatch: pytest.MonkeyPatch, closing: list[Transport]
) -> None:
    from aiodist.comm import connect

    shakes: list[connect.Shake] = []
    made = connect.Dialing.__init__

    def spy(self: connect.Dialing, *args: Any, **kw: Any) -> None:
        made(self, *args, **kw)
        shakes.append(self)

    monkeypatch.setattr(connect.Dialing, "__init__", spy)
    store = MemoryStore()
    [t] = await start_transports(2, store, ranks=[0], secrets=[SECRET, SECRET])
    closing.append(t)

    async def hang_up(conn: Connection) -> None:
        await conn.recv()  # (the hello)
        conn.abort()

    rude = await TCPNetwork().listen(("127.0.0.1", 0), hang_up)
    await store.set("t/addr/1", format_address(rude.address))
    try:
        with pytest.raises(PeerFailureError) as e:
            await asyncio.wait_for(channel(t, 2).send(1, ("x",), np.arange(4.0)), 5.0)
        assert "unreachable (ConnectionLost:" in str(e.value)
        assert len(shakes) == 1 and not shakes[0].over and shakes[0]._timer is None
    finally:
        rude.close()
