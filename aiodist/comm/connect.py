"""The I/O of a link's set-up: dialing a rank's published address, and both sides of the handshake.

The decisions are :mod:`.handshake`'s (what the frames say) and
:mod:`.links`'s (what to do with a connection that authenticated); these
coroutines only move the frames, with a timeout on every wait. Before the
other end has proved the job's secret, frames are limited to
:data:`.frames.MAX_HANDSHAKE_FRAME` bytes: both the acceptor's listener and
the dialer's connect start their connections so.
"""

from __future__ import annotations

import asyncio
from ssl import SSLContext
from typing import Any

from ..errors import ConnectionClosedError
from ..net.base import Address, Connection, Header, Network
from ..wire import DEFAULT_MAX_FRAME_SIZE
from . import frames as F
from .handshake import AcceptHandshake, DialHandshake, Outcome, Phase

LINK_MAX_FRAME = DEFAULT_MAX_FRAME_SIZE
"""Bytes a frame may have on a link that is up (1 GiB of payload and a header)."""


def format_address(address: Address) -> bytes:
    """The form of a listening address published in the store (what dialers bind their proofs to)."""
    return f"{address[0]}|{address[1]}".encode()


def parse_address(raw: bytes) -> Address:
    host, _, port = raw.decode().rpartition("|")
    return host, int(port)


async def dial(
    net: Network,
    raw_address: bytes,
    hs: DialHandshake,
    timeout: float,
    loop: asyncio.AbstractEventLoop,
    *,
    ssl: SSLContext | None = None,
) -> tuple[Connection, Outcome]:
    """Connect to ``raw_address`` (as published) and shake hands within ``timeout``; the connection and
    the acceptor's verdict.

    Raises what connecting raises (ConnectionLost, TimeoutError, ValueError for
    an address that does not parse), AuthenticationError, ProtocolError.
    Any error, or cancellation, closes the connection.
    """
    conn = await net.connect(parse_address(raw_address), timeout=timeout, max_frame_size=F.MAX_HANDSHAKE_FRAME, ssl=ssl)
    deadline = _Deadline(loop, conn, timeout)
    try:
        _send(conn, hs.hello())
        step = hs.on_reply(await deadline.recv())
        if isinstance(step, Outcome):
            return conn, step
        conn.set_max_frame_size(LINK_MAX_FRAME)  # it proved the secret: its frames may follow the verdict at once
        _send(conn, step)
        return conn, hs.on_verdict(await deadline.recv())
    except BaseException:
        conn.close()
        raise
    finally:
        deadline.cancel()


async def accept(conn: Connection, hs: AcceptHandshake, timeout: float, loop: asyncio.AbstractEventLoop) -> int | None:
    """The acceptor's side up to the dialer's proof (within ``timeout``): the authenticated dialer's rank, or None.

    None: the hello could not be taken (refused, see ``hs.problem``) or the
    connection ended or timed out. Raises AuthenticationError for a dialer
    that did not prove the secret (it was refused with nothing more said).
    Cancellation leaves the connection open.
    """
    deadline = _Deadline(loop, conn, timeout)
    try:
        _send(conn, hs.on_hello(await deadline.recv()))
        if hs.phase is Phase.FAILED:
            return None
        answer = await deadline.recv()
    except (TimeoutError, ConnectionClosedError):
        return None
    finally:
        deadline.cancel()
    try:
        return hs.on_answer(answer)
    except Exception:
        _send(conn, F.refused())
        raise


def _send(conn: Connection, header: Header) -> None:
    """Queue a handshake frame (tiny: never waits; a broken connection shows at the next receive)."""
    try:
        conn.send_nowait(header)
    except ConnectionClosedError:
        pass


class _Deadline:
    """One timer for a whole handshake: when it fires the connection is closed, and :meth:`recv` says why.

    (Not ``asyncio.timeout``: a context manager, a cancellation and its undoing, on
    both sides of every new connection.)
    """

    __slots__ = ("conn", "timeout", "expired", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: Connection, timeout: float) -> None:
        self.conn = conn
        self.timeout = timeout
        self.expired = False
        self._timer = loop.call_later(timeout, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self.conn.close()

    def cancel(self) -> None:
        self._timer.cancel()

    async def recv(self) -> Header:
        """The next frame's header; TimeoutError once the deadline passed (the connection is closed then)."""
        try:
            return (await self.conn.recv()).header
        except ConnectionClosedError:
            if self.expired:
                raise TimeoutError(f"no handshake from {self.conn.peer} within {self.timeout:g}s") from None
            raise


async def first_of(loop: asyncio.AbstractEventLoop, a: asyncio.Future[Any], b: asyncio.Future[Any] | None) -> None:
    """Wait until ``a`` or ``b`` is done (without cancelling either when this wait is cancelled).

    What ``asyncio.wait(shield(a), b, FIRST_COMPLETED)`` does, for a fraction of
    its cost: every first send to a peer waits here while the connection is made.
    """
    if a.done() or (b is not None and b.done()):
        return
    waiter = loop.create_future()

    def wake(_: Any) -> None:
        if not waiter.done():
            waiter.set_result(None)

    a.add_done_callback(wake)
    if b is not None:
        b.add_done_callback(wake)
    try:
        await waiter
    finally:
        a.remove_done_callback(wake)
        if b is not None:
            b.remove_done_callback(wake)
