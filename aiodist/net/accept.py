"""Accepting TCP connections on a listening socket, with running out of file descriptors logged.

asyncio's own accept loop reports ``EMFILE`` through the loop's exception
handler up to a hundred times per turn; uvloop's says nothing at all (libuv
accepts and resets the waiting connections). :class:`AcceptLoop` accepts
itself instead: each accepted socket is handed to
``loop.connect_accepted_socket`` (TLS included), and when the process is out
of file descriptors (or the system of memory for sockets) it says so once per
interval with the count of failed accepts, stops accepting for a moment and
tries again, while every connection already open keeps being served. The
connections that wait meanwhile stay in the kernel's backlog (their clients
wait, or time out), they are not reset.

With TLS, a connection's TLS handshake is part of its handshake: it is
bounded by ``ssl_handshake_timeout`` (the listener's handshake timeout, not
asyncio's 60 s) and counted by a :class:`~aiodist.net.gate.HandshakeGate`
(``max_handshakes``): a new connection over it takes the place of the oldest
one still in its TLS handshake, which is closed at once (logged once per
interval with a count). Once its TLS handshake is done, a connection's
owner counts and bounds the rest of its handshake. (Without TLS, setting a
connection up takes one step.)
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import resource
import socket
import ssl as _ssl
from collections.abc import Callable
from typing import Any

from ..ratelog import RateLog
from . import fork
from .base import wait_ended
from .gate import DEFAULT_MAX_HANDSHAKES, HandshakeGate, Ticket

log = logging.getLogger("aiodist.net")

OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
RETRY_DELAY = 0.25
"""Seconds without accepting after running out of file descriptors."""
LOG_INTERVAL = 10.0
_BATCH = 64  # accepts per readiness event (others wait for the next turn)


class AcceptLoop:
    """Accept on ``sock`` (listening, non-blocking) and connect each socket to ``factory()``'s protocol."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.BaseProtocol],
        *,
        ssl: _ssl.SSLContext | None = None,
        ssl_handshake_timeout: float | None = None,
        max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
    ) -> None:
        self._sock = sock
        self._name = sock.getsockname()
        where = f"TLS listener {self._name[0]}:{self._name[1]}"
        self._gate = None if ssl is None else HandshakeGate(
            max_handshakes, where, log, what="in their TLS handshake", interval=LOG_INTERVAL
        )
        self._factory = factory
        self._ssl = ssl
        self._ssl_handshake_timeout = ssl_handshake_timeout if ssl is not None else None
        self._loop = asyncio.get_running_loop()
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._waiting: dict[int, socket.socket] = {}  # accepted, not yet handed to the loop (their task has not run)
        self._tickets: dict[int, Ticket] = {}  # (with TLS) counted by the gate until set up
        self._next = 0
        self._retry: asyncio.TimerHandle | None = None
        self._exhausted = RateLog(log, logging.WARNING, LOG_INTERVAL)
        self._broken = RateLog(log, logging.INFO, LOG_INTERVAL)
        self._reading = False
        self._closed = False
        self._resume()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "accepting" if self._reading else "paused"
        return f"<AcceptLoop {self._name} {state} setting-up={len(self._tasks)}>"

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._sock,)

    def _resume(self) -> None:
        self._retry = None
        if not self._closed and not self._reading:
            self._loop.add_reader(self._sock.fileno(), self._accept)
            self._reading = True

    def _accept(self) -> None:
        for _ in range(_BATCH):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno not in OUT_OF_RESOURCES:
                    log.warning("accepting on %s failed: %s", self._name, e)
                    return
                self._out_of_resources(e)
                return
            conn.setblocking(False)
            cid = self._next
            self._next += 1
            self._waiting[cid] = conn
            task = self._tasks[cid] = self._loop.create_task(self._connect(cid, conn))
            task.add_done_callback(functools.partial(self._set_up, cid))
            if self._gate is not None:  # (the oldest one still in its TLS handshake makes room if need be)
                self._tickets[cid] = self._gate.admit(_peer_of(conn), task.cancel)

    async def _connect(self, cid: int, conn: socket.socket) -> None:
        del self._waiting[cid]  # (the loop owns it from here: a cancellation closes it)
        try:
            await self._loop.connect_accepted_socket(
                self._factory, conn, ssl=self._ssl, ssl_handshake_timeout=self._ssl_handshake_timeout
            )
        except (OSError, asyncio.TimeoutError, _ssl.SSLError) as e:
            conn.close()
            self._broken.event(f"a connection to {self._name} failed while being set up: {e}")

    def _set_up(self, cid: int, task: asyncio.Task[Any]) -> None:
        """A connection's setup ended (connected, failed, or cancelled: closed, or evicted by a newer one)."""
        self._tasks.pop(cid, None)
        conn = self._waiting.pop(cid, None)
        if conn is not None:  # cancelled before it ran
            conn.close()
        ticket = self._tickets.pop(cid, None)
        if ticket is not None:
            ticket.leave()  # (the rest of its handshake is counted and bounded by its owner)

    def _out_of_resources(self, e: OSError) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self._exhausted.event(
            f"cannot accept connections on {self._name}: {e.strerror or e} (ulimit -n is {soft}); "
            "connections already open are still served, new ones wait"
        )
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False
        if self._retry is None and not self._closed:
            self._retry = self._loop.call_later(RETRY_DELAY, self._resume)

    def close(self) -> None:
        """Stop accepting and close the listening socket; connections being set up are cancelled."""
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False
        self._sock.close()
        self._exhausted.close()
        self._broken.close()
        if self._gate is not None:
            self._gate.close()
        for task in list(self._tasks.values()):
            task.cancel()

    async def wait_closed(self) -> None:
        await wait_ended(self._tasks.values())


def _peer_of(conn: socket.socket) -> str:
    try:
        peer = conn.getpeername()
    except OSError:
        return "?"
    return f"{peer[0]}:{peer[1]}"


async def listen_socket(
    host: str | None,
    port: int,
    factory: Callable[[], asyncio.BaseProtocol],
    *,
    ssl: _ssl.SSLContext | None = None,
    ssl_handshake_timeout: float | None = None,
    max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
) -> AcceptLoop:
    """Listen on ``host:port`` (``host`` empty: every interface; port 0: a free one) and accept with an AcceptLoop.

    With ``ssl``: at most ``max_handshakes`` connections in their TLS handshake at once (a new one closes the
    oldest), each for at most ``ssl_handshake_timeout`` seconds (None: asyncio's default).
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.create_server(address, family=family, backlog=socket.SOMAXCONN)
    fork.own(sock.fileno())
    sock.setblocking(False)
    return AcceptLoop(sock, factory, ssl=ssl, ssl_handshake_timeout=ssl_handshake_timeout,
                      max_handshakes=max_handshakes)
