"""Cheaper link set-up, same bytes and same behaviour: proofs against a reference, and the handshake as frame handlers."""

from __future__ import annotations

import hashlib
import hmac
import os

from aiodist import auth


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
