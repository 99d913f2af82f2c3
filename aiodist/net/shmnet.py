"""The network of a rank that may share memory: TCP, except towards processes of this host.

:class:`HostNetwork` wraps the TCP network. Every listener also listens on an
abstract Unix socket named after this host's identity and the TCP address
(:func:`endpoint_name`; abstract names live in the kernel only, and vanish
with the socket), and a connection to an address first tries that name: it
exists only if the peer runs on this host (same host id) and in the same
network namespace; then the connection is a
:class:`~aiodist.net.shm.ShmConnection`, else it is made over TCP. A peer
in another PID namespace (containers sharing the host's network) is reached
over TCP too: pids name its shared memory, and its pids are not ours.

Abstract names have no permissions: any process of the host can bind one
first. So both ends check who is at the other end (``SO_PEERCRED``): a
dialer uses the name only if the process listening there runs as the same
user, else it dials TCP (whose handshake proves the job's secret and binds
the address dialed), and a listener closes connections of other users. A
process of another user squatting the names can then neither sit between
two ranks nor see what they send. The
published address stays the TCP one, so ranks of other hosts, and tools,
see nothing new. :func:`aiodist.net.shmhost.choose_network` decides whether a
rank uses it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl as _ssl

from ..wire import DEFAULT_MAX_FRAME_SIZE
from . import fork
from .base import Address, Connection, ConnectionHandler, Listener, Network
from .shm import ShmConnection, FrameStream
from .shmstream import peer_credentials
from .tcp import DEFAULT_HANDSHAKE_TIMEOUT, TCPListener

log = logging.getLogger("aiodist.net")

__all__ = ["HostNetwork", "ShmListener", "connect_local", "endpoint_name"]


def endpoint_name(host_id: str, address: Address) -> str:
    """The abstract Unix socket name of the listener published as TCP ``address`` on host ``host_id``."""
    return f"\0aiodist/{host_id}/{address[0]}/{address[1]}"


class ShmListener(TCPListener):
    """Accepts connections of this host's processes on an abstract Unix socket; ``address`` is the TCP one it serves.

    The handler tasks are owned as by :class:`~aiodist.net.tcp.TCPListener`.
    """

    def __init__(self, handler: ConnectionHandler, address: Address) -> None:
        super().__init__(handler)
        self._address = address

    def __repr__(self) -> str:
        return f"<ShmListener {self._address[0]}:{self._address[1]} {'closing' if self._closing else 'serving'}>"

    @classmethod
    async def start(
        cls,
        name: str,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> ShmListener:
        """Listen on the abstract socket ``name`` (OSError if it is taken)."""
        listener = cls(handler, address)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(name)
            sock.listen(256)
            sock.setblocking(False)
            fork.own(sock.fileno())
        except OSError:
            sock.close()
            raise

        def made(stream: FrameStream) -> None:
            pid = stream.peer_pid
            if listener._closing or pid is None:
                stream.close()
                return
            conn = ShmConnection(stream, peer_pid=pid, max_frame_size=max_frame_size)
            stream.start_handshake_timer(handshake_timeout)
            listener._accepted(conn)  # type: ignore[arg-type]

        def factory() -> FrameStream:
            stream = FrameStream(max_frame_size=max_frame_size, peer="unix socket")
            stream.on_made = made
            stream.only_uid = os.geteuid()  # (a process of another user is closed, told nothing: the name is no secret)
            return stream

        listener._server = await asyncio.get_running_loop().create_unix_server(factory, sock=sock)
        return listener


async def connect_local(
    name: str, *, timeout: float | None = None, max_frame_size: int | None = None
) -> ShmConnection | None:
    """Connect to the abstract Unix socket ``name``; None when nobody listens there (the peer is elsewhere),
    when the process listening there is not of this user (nothing was sent to it; a warning says who), or
    when it runs in another PID namespace (same network, other container: its shared memory is out of reach).

    Cancellation (or the timeout) leaves nothing behind.
    """
    max_frame_size = max_frame_size or DEFAULT_MAX_FRAME_SIZE
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(timeout):
            await loop.sock_connect(sock, name)
            pid, uid = peer_credentials(sock)
            if pid is None or uid != os.geteuid():  # (checked before anything is written to it)
                if uid is not None and uid != os.geteuid():
                    log.warning(
                        "the Unix socket %s is held by a process of another user (uid %d, pid %s), not by the "
                        "rank published there: not using it (the connection goes over TCP)", name.lstrip("\0"), uid, pid,
                    )
                sock.close()
                return None
            _, stream = await loop.create_unix_connection(
                lambda: FrameStream(max_frame_size=max_frame_size, peer="unix socket"), sock=sock
            )
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except TimeoutError:
        sock.close()
        raise TimeoutError(f"connecting to a process of this host timed out after {timeout:g}s") from None
    except BaseException:
        sock.close()
        raise
    return ShmConnection(stream, peer_pid=pid, max_frame_size=max_frame_size)


class _BothListener(Listener):
    """A TCP listener and its same-host twin on a Unix socket, as one."""

    def __init__(self, tcp: Listener, local: ShmListener) -> None:
        self._tcp = tcp
        self._local = local

    def __repr__(self) -> str:
        return f"<HostListener {self._tcp!r} + {self._local!r}>"

    @property
    def address(self) -> Address:
        return self._tcp.address

    def close(self) -> None:
        self._local.close()
        self._tcp.close()

    async def wait_closed(self) -> None:
        await self._local.wait_closed()
        await self._tcp.wait_closed()


class HostNetwork(Network):
    """TCP, except towards processes of this host (same ``host_id``): Unix sockets and shared memory."""

    def __init__(self, tcp: Network, *, host_id: str) -> None:
        self.tcp = tcp
        self.host_id = host_id

    def __repr__(self) -> str:
        return f"<HostNetwork host={self.host_id} over {self.tcp!r}>"

    async def default_host(self) -> str:
        return await self.tcp.default_host()

    async def listen(
        self,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int | None = None,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
        ssl: _ssl.SSLContext | None = None,
    ) -> Listener:
        """Listen on TCP ``address`` and, for this host's processes, on its Unix socket twin.

        With ``ssl`` (links that cross machines encrypted) everything is TCP and TLS.
        """
        tcp = await self.tcp.listen(
            address, handler, max_frame_size=max_frame_size, handshake_timeout=handshake_timeout, ssl=ssl
        )
        if ssl is not None:
            return tcp
        try:
            local = await ShmListener.start(
                endpoint_name(self.host_id, tcp.address),
                tcp.address,
                handler,
                max_frame_size=max_frame_size or DEFAULT_MAX_FRAME_SIZE,
                handshake_timeout=handshake_timeout,
            )
        except OSError as e:
            log.warning(
                "not listening for processes of this host on a Unix socket (%s): TCP only (dialers use a "
                "Unix socket only when its owner runs as their user)", e,
            )
            return tcp
        except BaseException:
            await tcp.aclose()
            raise
        return _BothListener(tcp, local)

    async def connect(
        self,
        address: Address,
        *,
        timeout: float | None = None,
        max_frame_size: int | None = None,
        ssl: _ssl.SSLContext | None = None,
    ) -> Connection:
        """A connection to ``address``: through its Unix socket twin if it is on this host, else TCP (and TLS
        with ``ssl``)."""
        if ssl is None:
            local = endpoint_name(self.host_id, address)
            conn = await connect_local(local, timeout=timeout, max_frame_size=max_frame_size)
            if conn is not None:
                return conn
        return await self.tcp.connect(address, timeout=timeout, max_frame_size=max_frame_size, ssl=ssl)
