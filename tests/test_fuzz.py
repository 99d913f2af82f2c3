"""Quick property-based fuzzing (CI-fast) of what an attacker reaches first: the codec, the handshake, the store.

Every input is either handled or refused with the one error its layer owns
(``ProtocolError``, ``AuthenticationError``, the store's ``BadMessage``);
nothing else escapes, nothing allocates past its limit, and garbage never
authenticates. ``benchmarks/fuzz.py`` runs the same kinds of inputs, by the
hundred thousand, against live servers.
"""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiodist import auth
from aiodist.errors import ProtocolError
from aiodist.store import protocol as P
from aiodist.store.limits import StoreLimits
from aiodist.store.requests import Session as _Session
from aiodist.store.server import StoreServer
from aiodist.wire import PREAMBLE, FrameDecoder

SECRET = b"fuzzing secret"

# ------------------------------------------------------------------ the codec

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
    st.text(max_size=12), st.binary(max_size=24),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                      max_leaves=12)
prefixes = st.builds(lambda h, p: struct.pack("<IQ", h, p), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))


@settings(max_examples=250, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=64), prefixes, values.map(lambda v: msgpack.packb(v))), max_size=8),
       st.booleans())
def test_the_decoder_takes_any_bytes_and_allocates_within_its_limit(parts: list[bytes], with_preamble: bool) -> None:
    dec = FrameDecoder(max_frame_size=4096)
    data = (PREAMBLE if with_preamble else b"") + b"".join(parts)
    try:
        for i in range(0, len(data), 7):
            for header, payload in dec.feed(data[i : i + 7]):
                assert isinstance(header, dict)
                assert payload is None or payload.nbytes <= 4096
    except ProtocolError:
        pass
    assert len(dec._buf) <= (1 << 17) + (1 << 12)  # the staging area never grew for a claim


# ------------------------------------------------------------------ the handshake


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2), st.sampled_from(["nonce", "proof"]), st.one_of(st.binary(max_size=40), scalars),
       st.integers(0, 255), st.booleans())
def test_changing_any_field_of_a_good_handshake_fails_it(
    which: int, field: str, replacement: Any, bit: int, flip: bool
) -> None:
    """A man in the middle who alters one field (or one bit of it) is found out by one side."""
    d = auth.Dialer(SECRET, purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
    a = auth.Acceptor(SECRET, purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
    tampered = False

    def tamper(m: dict[str, Any]) -> dict[str, Any]:
        nonlocal tampered
        if field not in m:
            return m  # the message has no such field: nothing to alter
        m = dict(m)
        if flip:
            v = bytearray(m[field])
            v[bit % len(v)] ^= 1 << (bit % 8)
            m[field] = bytes(v)
        elif replacement == m[field]:
            return m
        else:
            m[field] = replacement
        tampered = True
        return m

    try:
        hello = d.hello()
        challenge = a.challenge(tamper(hello) if which == 0 else hello)
        answer = d.answer(tamper(challenge) if which == 1 else challenge)
        a.verify(tamper(answer) if which == 2 else answer)
    except auth.AuthenticationError:
        assert tampered
        return
    assert not tampered


# ------------------------------------------------------------------ the store protocol

OPS = ["set", "get", "add", "compare_set", "append", "check", "wait", "delete_key", "num_keys", "multi_get",
       "multi_set", "queue_push", "queue_pop", "queue_len", "cancel", "unpop", "ping", "hello", "answer", "nope", 7]
FIELDS = ["id", "k", "ks", "v", "l", "n", "t", "c"]
requests = st.fixed_dictionaries(
    {"op": st.sampled_from(OPS)},
    optional={f: st.one_of(scalars, st.lists(st.one_of(st.binary(max_size=8), st.text(max_size=4), st.integers()),
                                              max_size=3)) for f in FIELDS},
)


class _Conn:
    peer = "fuzz"
    closed = False

    def send_nowait(self, header: Any, payload: Any = None) -> bool:
        return True

    async def drained(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def loop() -> Any:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(requests, st.one_of(st.none(), st.binary(max_size=64))), min_size=1, max_size=12))
def test_any_request_is_answered_or_refused_as_a_bad_message(loop: Any, batch: list[tuple[dict, bytes | None]]) -> None:
    server = StoreServer(limits=StoreLimits(max_client_bytes=4096, max_total_bytes=8192), secret=SECRET)
    session = _Session(1, _Conn())  # type: ignore[arg-type]
    server._sessions[1] = session

    async def feed() -> None:
        for header, payload in batch:
            try:
                replies = server._handle(session, header, memoryview(payload) if payload else None)
            except P.BadMessage:
                continue
            for r in replies:
                server._encode(session, r)  # every reply can be put on the wire
        server._end_session(session)  # cancels its timers and its writer task
        if session.writer is not None:
            await asyncio.gather(session.writer, return_exceptions=True)

    loop.run_until_complete(feed())
    assert server.state.stored_bytes() <= 8192
