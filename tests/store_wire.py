"""Speaking the store's wire by hand (test helpers): frames, reads, the authenticated handshake."""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

import msgpack

from aiodist import auth
from aiodist.store import protocol as P
from aiodist.wire import PREAMBLE

HELLO = P.hello()  # without authentication fields


def frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<IQ", len(h), len(payload)) + h + payload


async def read_frame(r: asyncio.StreamReader, timeout: float = 10.0) -> tuple[dict[str, Any], int]:
    """The next frame's header and payload size (the payload is read and dropped)."""
    hlen, plen = struct.unpack("<IQ", await asyncio.wait_for(r.readexactly(12), timeout))
    header = msgpack.unpackb(await asyncio.wait_for(r.readexactly(hlen), timeout), raw=False)
    if plen:
        await asyncio.wait_for(r.readexactly(plen), timeout)
    return header, plen


async def handshake(
    r: asyncio.StreamReader, w: asyncio.StreamWriter, secret: Any = auth.FROM_ENVIRONMENT, timeout: float = 10.0
) -> dict[str, Any]:
    """The client's side of the authenticated handshake; the server's welcome (or its error frame)."""
    key = auth.resolve_secret(secret)
    dialer = auth.Dialer(key, purpose=P.AUTH_PURPOSE, binding=P.AUTH_BINDING, nonce=os.urandom(32) if key else b"")
    w.write(PREAMBLE + frame(P.hello(dialer.hello())))
    assert await asyncio.wait_for(r.readexactly(8), timeout) == PREAMBLE
    challenge, _ = await read_frame(r, timeout)
    if challenge.get("op") != "challenge":
        return challenge
    w.write(frame(P.answer(dialer.answer(challenge))))
    return (await read_frame(r, timeout))[0]
