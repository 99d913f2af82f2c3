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
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import ssl as _ssl
from collections.abc import Callable
from typing import Any

from ..ratelog import RateLog
from .base import wait_ended

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
    ) -> None:
        self._sock = sock
        self._name = sock.getsockname()
        self._factory = factory
        self._ssl = ssl
        self._ssl_handshake_timeout = ssl_handshake_timeout if ssl is not None else None
        self._loop = asyncio.get_running_loop()
        self._tasks: dict[int, asyncio.Task[Any]] = {}
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
            self._tasks[cid] = self._loop.create_task(self._connect(cid, conn))

    async def _connect(self, cid: int, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(
                self._factory, conn, ssl=self._ssl, ssl_handshake_timeout=self._ssl_handshake_timeout
            )
        except (OSError, asyncio.TimeoutError, _ssl.SSLError) as e:
            conn.close()
            self._broken.event(f"a connection to {self._name} failed while being set up: {e}")
        finally:
            self._tasks.pop(cid, None)

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
        for task in list(self._tasks.values()):
            task.cancel()

    async def wait_closed(self) -> None:
        await wait_ended(self._tasks.values())


async def listen_socket(
    host: str | None, port: int, factory: Callable[[], asyncio.BaseProtocol], *, ssl: _ssl.SSLContext | None = None
) -> AcceptLoop:
    """Listen on ``host:port`` (``host`` empty: every interface; port 0: a free one) and accept with an AcceptLoop."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.create_server(address, family=family, backlog=socket.SOMAXCONN)
    sock.setblocking(False)
    return AcceptLoop(sock, factory, ssl=ssl)
