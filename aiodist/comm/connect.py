"""The I/O of a link's set-up: dialing a rank's published address, and both sides of the handshake.

The decisions are :mod:`.handshake`'s (what the frames say) and
:mod:`.links`'s (what to do with a connection that authenticated); the two
drivers here (:class:`Dialing`, :class:`Accepting`) only move the frames,
with one deadline over the whole handshake. They run as the connection's
frame handler: each frame is answered in the step that delivers it, with no
task woken and no future per frame. The task that owns the connection
(:class:`~aiodist.comm.peers.PeerLinks`' dial, or the listener's handler)
meanwhile waits in :meth:`~aiodist.net.base.Connection.recv`, which with a
handler installed only reports the connection's end: a handshake that fails
or times out closes the connection, and the driver's :attr:`Shake.error`
says why. Before the other end has proved the job's secret, frames are
limited to :data:`.frames.MAX_HANDSHAKE_FRAME` bytes: both the acceptor's
listener and the dialer's connect start their connections so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from ssl import SSLContext

from ..errors import ConnectionClosedError
from ..net.base import Address, Connection, Frame, Header, Network
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


def open_connection(
    net: Network, raw_address: bytes, timeout: float, *, ssl: SSLContext | None = None
) -> Awaitable[Connection]:
    """Connect to ``raw_address`` (as published) within ``timeout``, frames limited as before authentication.

    Await the result; it raises what connecting raises (ConnectionLost, TimeoutError), and this call
    raises ValueError for an address that does not parse. (The network's own coroutine, not one of
    its own around it: one coroutine fewer per dial.)
    """
    return net.connect(parse_address(raw_address), timeout=timeout, max_frame_size=F.MAX_HANDSHAKE_FRAME,
                             ssl=ssl)


def _send(conn: Connection, header: Header) -> None:
    """Queue a handshake frame (tiny: never waits; a broken connection shows as the connection's end)."""
    try:
        conn.send_nowait(header)
    except ConnectionClosedError:
        pass


class Shake:
    """What both drivers share: the connection, one deadline for the whole handshake, and how it ended.

    ``rank``: the peer's (the dialer knows it from the start, the acceptor
    once the dialer proved it); ``over``: the handshake reached its end (an
    outcome, or a failure);
    ``error``: why it failed (None: it did not, or the connection ended
    first, which the owner's :meth:`~aiodist.net.base.Connection.recv`
    reports); ``linked``: the connection became the link (the owner's
    callback said so).
    """

    __slots__ = ("conn", "rank", "timeout", "over", "error", "linked", "_timer")  # (and each side's ``hs``)

    def __init__(self, conn: Connection, rank: int | None, timeout: float, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.rank = rank
        self.timeout = timeout
        self.over = False
        self.error: Exception | None = None
        self.linked = False
        self._timer: asyncio.TimerHandle | None = loop.call_later(timeout, self._expire)

    def _expire(self) -> None:
        if not self.over:
            self._fail(TimeoutError(f"no handshake from {self.conn.peer} within {self.timeout:g}s"))

    def _end(self) -> None:
        self.over = True
        self._stop_timer()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None  # (a link keeps nothing of its handshake: see also ``hs``)

    def _fail(self, error: Exception | None) -> None:
        """The handshake failed (``error``, or a refusal already sent): close the connection; the owner finds out."""
        self._end()
        self.error = error
        self.conn.close()

    def abandon(self) -> None:
        """The owner stops waiting (the connection ended, or the wait was cancelled): a handshake still under
        way stops there (its deadline cancelled, its connection closed; ``over`` stays False)."""
        if not self.over:
            self._stop_timer()
            self.conn.close()


class Dialing(Shake):
    """The dialer's side, as the frame handler of the connection it opened: sends the hello at once.

    Raises nothing: an :class:`~aiodist.auth.AuthenticationError` (the acceptor
    did not prove the secret, or refused our proof), a
    :class:`~aiodist.errors.ProtocolError` (a frame out of place) or the
    deadline's ``TimeoutError`` become :attr:`error`, and the connection is
    closed. The acceptor's verdict goes to ``outcome(rank, conn, outcome)``,
    which returns whether the connection became the link (then it installed
    the link's own frame handler; otherwise it closed the connection).
    """

    __slots__ = ("hs", "_outcome")

    def __init__(self, conn: Connection, hs: DialHandshake, timeout: float, loop: asyncio.AbstractEventLoop,
                 outcome: Callable[[int, Connection, Outcome], bool]) -> None:
        super().__init__(conn, hs.peer_rank, timeout, loop)
        self.hs: DialHandshake | None = hs  # (dropped once the verdict is in)
        self._outcome = outcome
        conn.set_frame_handler(self.on_frame)
        _send(conn, hs.hello())

    @property
    def answered(self) -> bool:
        """This dialer sent its proof and awaits the verdict: the acceptor may already hold the connection as
        its link."""
        return not self.over and self.hs is not None and self.hs.phase is Phase.AUTHENTICATING

    def on_frame(self, frame: Frame) -> None:
        hs = self.hs
        assert hs is not None  # (no frame comes here after the verdict: the link's handler, or closed)
        try:
            if hs.phase is Phase.HELLO_SENT:
                reply = hs.on_reply(frame.header)
                if not isinstance(reply, Outcome):
                    self.conn.set_max_frame_size(LINK_MAX_FRAME)  # it proved the secret: its frames may follow
                    _send(self.conn, reply)                       # the verdict at once
                    return
                outcome = reply
            else:
                outcome = hs.on_verdict(frame.header)
        except Exception as e:  # noqa: BLE001 - the owner decides (AuthenticationError, ProtocolError, ...)
            self._fail(e)
            return
        self._end()
        self.hs = None
        self.linked = self._outcome(hs.peer_rank, self.conn, outcome)


class Accepting(Shake):
    """The acceptor's side, as the frame handler of an accepted connection: the hello, then the dialer's proof.

    A hello this rank cannot take is refused (``hs.problem`` says why) and a
    dialer that does not prove the secret is refused with nothing more said
    (:attr:`error` is the :class:`~aiodist.auth.AuthenticationError`); either
    way the connection is closed. The authenticated dialer's rank goes to
    ``accepted(rank, conn)``, which answers it and returns whether the
    connection became the link (as :class:`Dialing`'s ``outcome``).
    """

    __slots__ = ("hs", "_accepted")

    def __init__(self, conn: Connection, hs: AcceptHandshake, timeout: float, loop: asyncio.AbstractEventLoop,
                 accepted: Callable[[int, Connection], bool]) -> None:
        super().__init__(conn, None, timeout, loop)
        self.hs: AcceptHandshake | None = hs  # (dropped once the dialer proved itself; kept if refused: its problem)
        self._accepted = accepted
        conn.set_frame_handler(self.on_frame)

    def on_frame(self, frame: Frame) -> None:
        hs = self.hs
        assert hs is not None  # (no frame comes here after the answer: the link's handler, or closed)
        if hs.phase is Phase.START:
            try:
                reply = hs.on_hello(frame.header)
            except Exception as e:  # noqa: BLE001 - a local bug: the owner raises it
                self._fail(e)
                return
            _send(self.conn, reply)
            if hs.problem is not None:  # refused (it says why)
                self._fail(None)
            return
        try:
            rank = hs.on_answer(frame.header)
        except Exception as e:  # noqa: BLE001 - AuthenticationError (or a local bug): the owner decides
            _send(self.conn, F.refused())
            self._fail(e)
            return
        self._end()
        self.hs = None
        self.rank = rank
        self.linked = self._accepted(rank, self.conn)
