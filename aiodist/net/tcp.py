"""The real network: listeners and connections over asyncio TCP (the default loop and uvloop).

:class:`TCPNetwork` is the :class:`~aiodist.net.base.Network` of real
processes; its connections are :class:`~aiodist.net.tcp_connection.TCPConnection`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl as _ssl
from typing import Any

from ..errors import ConnectionClosedError, ConnectionLost, ListenError
from ..rankenv import getenv
from ..wire import DEFAULT_MAX_FRAME_SIZE
from .accept import listen_socket
from .base import Address, Connection, ConnectionHandler, Listener, Network, wait_ended
from .gate import DEFAULT_MAX_HANDSHAKES
from .tcp_connection import TCPConnection

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT", "TCPConnection", "TCPListener", "TCPNetwork", "local_address_toward"]

log = logging.getLogger("aiodist.net")

DEFAULT_HANDSHAKE_TIMEOUT = 10.0


class TCPListener(Listener):
    def __init__(self, handler: ConnectionHandler) -> None:
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._address: Address = ("", 0)
        self._conns: dict[int, TCPConnection] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._next_id = 0
        self._closing = False

    def __repr__(self) -> str:
        state = "closing" if self._closing else "serving"
        return f"<TCPListener {self._address[0]}:{self._address[1]} {state} conns={len(self._conns)}>"

    @property
    def address(self) -> Address:
        return self._address

    def _accepted(self, conn: TCPConnection) -> None:
        if self._closing:
            conn.close()
            return
        cid = self._next_id
        self._next_id += 1
        self._conns[cid] = conn
        self._tasks[cid] = asyncio.get_running_loop().create_task(self._run_handler(cid, conn))

    async def _run_handler(self, cid: int, conn: TCPConnection) -> None:
        try:
            await self._handler(conn)
        except (asyncio.CancelledError, ConnectionClosedError):
            pass
        except Exception:
            log.exception("connection handler for %s failed", conn.peer)
        finally:
            conn.close()
            self._conns.pop(cid, None)
            self._tasks.pop(cid, None)

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.close()
        for task in list(self._tasks.values()):
            task.cancel()

    async def wait_closed(self) -> None:
        await wait_ended(self._tasks.values())
        if self._server is not None:
            await self._server.wait_closed()


async def local_address_toward(peer: str | None) -> str:
    """This machine's address on the route to ``peer`` (loopback for a local or missing peer).

    The name is looked up with the loop's resolver (never blocking the loop);
    the route is found with a UDP socket's ``connect``, which sends nothing.
    """
    if not peer or peer == "localhost":
        return "127.0.0.1"
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(peer, None, family=socket.AF_INET,
                                                             type=socket.SOCK_DGRAM)
        addr = infos[0][4][0]
        if ipaddress.ip_address(addr).is_loopback:
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return str(s.getsockname()[0])
    except (OSError, ValueError, IndexError):
        log.warning("cannot find a local address towards MASTER_ADDR=%s; listening on 127.0.0.1", peer)
        return "127.0.0.1"


class TCPNetwork(Network):
    """asyncio TCP. One instance serves every rank of a process."""

    def __init__(self, *, host: str | None = None) -> None:
        self._host = host
        self._toward: dict[str, str] = {}  # MASTER_ADDR -> local_address_toward(MASTER_ADDR)

    def __repr__(self) -> str:
        return "<TCPNetwork>"

    async def default_host(self) -> str:
        """The address this host's listeners are published under.

        ``127.0.0.1`` for a single-machine job; when the rank's MASTER_ADDR is
        another machine, the local address of the route towards it (so that
        ranks on other nodes can connect back). ``AIODIST_HOST`` overrides both
        (read by the callers).
        """
        if self._host:
            return self._host
        master = getenv("MASTER_ADDR") or ""
        found = self._toward.get(master)
        if found is None:
            found = self._toward[master] = await local_address_toward(master)
        return found

    async def connect(
        self,
        address: Address,
        *,
        timeout: float | None = None,
        max_frame_size: int | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> Connection:
        host, port = address
        loop = asyncio.get_running_loop()
        conn = TCPConnection(max_frame_size=max_frame_size or DEFAULT_MAX_FRAME_SIZE, peer=f"{host}:{port}")
        options: dict[str, Any] = {} if ssl is None else {"ssl": ssl}
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: conn, host, port, **options)
        except TimeoutError:
            conn.abort()
            raise TimeoutError(f"connecting to {host}:{port} timed out after {timeout:g}s") from None
        except _ssl.SSLError as e:  # (an OSError too: say that it was the TLS handshake)
            raise ConnectionLost(f"could not connect to {host}:{port}: TLS handshake failed: {e}") from None
        except OSError as e:
            lost = ConnectionLost.refusal if isinstance(e, ConnectionRefusedError) else ConnectionLost
            raise lost(f"could not connect to {host}:{port}: {e.strerror or e}") from None
        except BaseException:
            conn.abort()
            raise
        return conn

    async def listen(
        self,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int | None = None,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
        ssl: _ssl.SSLContext | None = None,
        max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
    ) -> Listener:
        """See :meth:`Network.listen`. With ``ssl`` the TLS handshake is part of the handshake: the
        ``handshake_timeout`` runs from the accept, and at most ``max_handshakes`` connections may be in
        their TLS handshake at once (more are reset at once, logged once per interval with a count)."""
        host, port = address
        listener = TCPListener(handler)
        mfs = max_frame_size or DEFAULT_MAX_FRAME_SIZE

        def factory() -> TCPConnection:
            return _ServerConnection(listener, handshake_timeout, max_frame_size=mfs)

        try:  # our own accept loop: running out of file descriptors is logged (see .accept)
            server = await listen_socket(host, port, factory, ssl=ssl, ssl_handshake_timeout=handshake_timeout,
                                         max_handshakes=max_handshakes)
        except OSError as e:
            raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}", address=(host, port)) from None
        listener._server = server  # type: ignore[assignment]  # an AcceptLoop: close, wait_closed, sockets
        sockname = server.sockets[0].getsockname()
        listener._address = (host or sockname[0], sockname[1])
        return listener


class _ServerConnection(TCPConnection):
    """An accepted connection. Made at the accept (before a TLS handshake): its handshake timeout runs from there."""

    def __init__(self, listener: TCPListener, handshake_timeout: float | None, **kw: Any) -> None:
        super().__init__(**kw)
        self._listener: TCPListener | None = listener
        self._handshake_timeout = handshake_timeout
        self._accepted_at = asyncio.get_running_loop().time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        whole = timeout = self._handshake_timeout
        if timeout is not None and self._loop is not None:  # (what a TLS handshake left of it)
            timeout = max(0.0, self._accepted_at + timeout - self._loop.time())
        self.start_handshake_timer(timeout, whole=whole)
        listener, self._listener = self._listener, None
        assert listener is not None
        listener._accepted(self)
