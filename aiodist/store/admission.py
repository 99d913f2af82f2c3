"""Who gets into the store server: the connection limit and the authenticated handshake.

:class:`Admission` counts open connections against ``max_connections``
(refusing more) and those in their handshake against ``max_handshakes``
(closing the oldest for a newer one); it logs refusals and evictions once per
interval (a count of what it did not log one by one, never a silent drop).
:func:`server_handshake` runs the store's hello exchange with the mutual
authentication of :mod:`aiodist.auth` on a fresh connection; :func:`client_handshake` is the client's side. Before a
connection has authenticated, its frames are limited to
:data:`~aiodist.store.limits.PRE_AUTH_MAX_FRAME` bytes (the callers open and
accept connections with that limit and raise it once the other end proved
the secret).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .. import auth
from ..context import token_bytes
from ..ratelog import RateLog
from ..shown import brief, shown
from ..errors import ConnectionClosedError, StoreError
from ..net.base import Connection
from ..net.gate import HandshakeGate, Ticket
from . import protocol as P
from .limits import StoreLimits

log = logging.getLogger("aiodist.store")


class Admission:
    """Connections open at once against ``limits.max_connections`` (a new one over it is refused), and those
    still in their handshake against ``limits.max_handshakes``: a new one over that closes the oldest one
    still in its handshake (:class:`~aiodist.net.gate.HandshakeGate`), so that sockets that never
    authenticate cannot shut real clients out (refusing the new one would: a flood of silent sockets,
    renewed as they time out, kept every genuine client out)."""

    def __init__(self, limits: StoreLimits, address: str) -> None:
        self.limit = limits.max_connections
        self.open = 0
        self.refused = 0
        self._address = address
        self._gate = HandshakeGate(limits.max_handshakes, f"store server {address}", log,
                                   interval=limits.log_interval)
        self._busy = RateLog(log, logging.WARNING, limits.log_interval)
        self._refusals = RateLog(log, logging.INFO, limits.log_interval)
        self._cutoffs = RateLog(log, logging.WARNING, limits.log_interval)
        self._drops = RateLog(log, logging.INFO, limits.log_interval)

    def __repr__(self) -> str:
        return (
            f"<Admission open={self.open}/{self.limit} handshaking={self.handshaking}/{self.handshake_limit}"
            f" refused={self.refused} evicted={self.evicted}>"
        )

    @property
    def handshaking(self) -> int:
        """Connections still in their handshake."""
        return self._gate.handshaking

    @property
    def handshake_limit(self) -> int:
        return self._gate.limit

    @property
    def evicted(self) -> int:
        """Connections closed in their handshake to let a newer one in (see the class doc)."""
        return self._gate.evicted

    def enter(self, peer: str, evict: Callable[[], object]) -> Ticket | None:
        """Count a new connection in (handshaking; ``evict()`` closes it if a newer one takes its place),
        or None (over ``max_connections``: logged, the caller closes it). The ticket leaves at
        :meth:`authenticated` or :meth:`leave`."""
        if self.open >= self.limit:
            self.refused += 1
            self._busy.event(f"store server {self._address}: refused a connection from {peer}: {self.open} "
                             f"connections are open, the limit (max_connections) is {self.limit}")
            return None
        self.open += 1
        return self._gate.admit(peer, evict)

    def authenticated(self, ticket: Ticket) -> None:
        """A connection finished its handshake."""
        ticket.leave()

    def leave(self, ticket: Ticket) -> None:
        """A connection ended (its ticket leaves, if it had not)."""
        self.open -= 1
        ticket.leave()

    def unauthenticated(self, peer: str, why: str) -> None:
        """A connection failed the handshake (logged at INFO, rate-limited: a scan must not flood the log)."""
        self._refusals.event(f"store server {self._address}: refused a connection from {peer}: {why}")

    def dropped(self, peer: str, why: str) -> None:
        """A value a client gave back (``unpop``) was dropped: it has no reply to carry an error (rate-limited:
        a client over its quota can send thousands)."""
        self._drops.event(f"store server {self._address}: the client at {peer} gave back a popped value that "
                          f"was dropped: {why}")

    def cut_off(self, peer: str, why: str) -> None:
        """A client was dropped for not reading its replies."""
        self._cutoffs.event(f"store server {self._address}: cut off the client at {peer}: {why}")

    def close(self) -> None:
        self._gate.close()
        self._busy.close()
        self._refusals.close()
        self._cutoffs.close()
        self._drops.close()


async def server_handshake(conn: Connection, secret: bytes | None, admission: Admission) -> bool:
    """Run the server's side of the handshake; True if ``conn`` may be served (the welcome is the caller's).

    Refused connections get a frame that tells them nothing (see
    :func:`protocol.refusal`) and are logged through ``admission``.
    The caller bounds the whole exchange with the handshake timeout.
    """
    frame = await conn.recv()
    try:
        P.check_hello(frame.header)
    except P.BadMessage as e:
        admission.unauthenticated(conn.peer, str(e))
        await send_quietly(conn, P.error_frame(e.code, str(e)))
        return False
    nonce = token_bytes(auth.NONCE_BYTES) if secret is not None else b""
    acceptor = auth.Acceptor(secret, purpose=P.AUTH_PURPOSE, binding=P.AUTH_BINDING, nonce=nonce, peer=conn.peer)
    try:
        await conn.send(P.challenge(acceptor.challenge(frame.header)))
        frame = await conn.recv()
        if frame.header.get("op") != "answer":
            raise auth.AuthenticationError("expected the answer to the challenge", reason="no_proof")
        acceptor.verify(frame.header)
    except auth.AuthenticationError as e:
        admission.unauthenticated(conn.peer, f"authentication failed ({e.reason})")
        await send_quietly(conn, P.refusal())
        return False
    return True


async def client_handshake(conn: Connection, secret: bytes | None, where: str) -> dict[str, Any]:
    """Run the client's side of the handshake; the server's welcome header.

    Raises :class:`~aiodist.auth.AuthenticationError` when the server cannot
    prove the secret or refuses ours, :class:`BusyError` when it is at its
    connection limit, :class:`~aiodist.errors.StoreError` when what answers
    is not a compatible store server.
    """
    nonce = token_bytes(auth.NONCE_BYTES) if secret is not None else b""
    dialer = auth.Dialer(secret, purpose=P.AUTH_PURPOSE, binding=P.AUTH_BINDING, nonce=nonce, peer=where)
    await conn.send(P.hello(dialer.hello()))
    reply = (await conn.recv()).header
    _raise_error(reply, dialer, where)
    if reply.get("op") != "challenge":
        raise StoreError(f"{where} is not a compatible store server (it answered the hello with {brief(reply.get('op'))})")
    await conn.send(P.answer(dialer.answer(reply)))
    reply = (await conn.recv()).header
    _raise_error(reply, dialer, where)
    if reply.get("op") != "hello" or reply.get("proto") != P.PROTO:
        raise StoreError(f"{where} is not a compatible store server (its welcome is {brief(reply.get('op'))})")
    return reply


class BusyError(StoreError):
    """The store server is at its connection limit (the client retries)."""


def _raise_error(reply: dict[str, Any], dialer: auth.Dialer, where: str) -> None:
    if reply.get("op") != "error":
        return
    code = reply.get("err")
    if code == P.REFUSED:
        raise dialer.refused()
    if code == P.BUSY:
        raise BusyError(f"the store server at {where} is at its connection limit")
    raise StoreError(f"{where} refused the store handshake: {shown(reply.get('msg', code))!r}")


async def send_quietly(conn: Connection, header: dict[str, Any]) -> None:
    """Best-effort goodbye frame before closing (the peer may already be gone, or not reading)."""
    try:
        async with asyncio.timeout(1.0):
            await conn.send(header)
    except (ConnectionClosedError, TimeoutError):
        pass
