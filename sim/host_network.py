"""A virtual host's network (aiodist's Network seam) and the listeners bound on it.

:class:`HostNetwork` is what a rank's code gets as its network: ``connect``
goes through the run's fabric (:mod:`sim.network`), ``listen`` binds a
:class:`SimListener` on the host's ports. A listener accepts
:class:`~sim.endpoints.SimConnection` s and owns their handler tasks.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiodist.errors import ConnectionClosedError, ConnectionLost, ListenError
from aiodist.net.base import Address, Connection, ConnectionHandler, Listener
from aiodist.net.base import Network as _SeamNetwork
from aiodist.wire import DEFAULT_MAX_FRAME_SIZE

from .endpoints import SimConnection
from .links import Host, Links
from .storehost import STORE_HOST

LOCAL_NAMES = frozenset({"", "0.0.0.0", "::", "127.0.0.1", "localhost", "::1"})
"""Addresses that mean "this host" (listen on them, or connect to yourself)."""


class SimListener(Listener):
    """Accepts simulated connections on one host:port; owns the handler tasks."""

    def __init__(self, loop: Any, host: Host, address: Address, handler: ConnectionHandler,
                 max_frame_size: int, errors: list[str]) -> None:
        self._loop = loop
        self._errors = errors  # (where a handler's unexpected error is reported)
        self._host = host
        self._address = address
        self._handler = handler
        self._max_frame_size = max_frame_size
        self._conns: dict[int, SimConnection] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._closing = False

    def __repr__(self) -> str:
        return f"<SimListener {self._address[0]}:{self._address[1]} conns={len(self._conns)}>"

    @property
    def address(self) -> Address:
        return self._address

    def _accept(self, conn: SimConnection) -> None:
        self._conns[conn._id] = conn
        self._tasks[conn._id] = self._loop.create_task(self._run_handler(conn))

    async def _run_handler(self, conn: SimConnection) -> None:
        try:
            await self._handler(conn)
        except (asyncio.CancelledError, ConnectionClosedError):
            pass
        except Exception as e:  # noqa: BLE001 - like TCP: log, close the connection, keep serving
            self._errors.append(f"{self._host.name}: connection handler failed: {e!r}")
        finally:
            conn.close()
            self._conns.pop(conn._id, None)
            self._tasks.pop(conn._id, None)

    def _unbind(self) -> None:
        port = self._address[1]
        if self._host.listeners.get(port) is self:
            del self._host.listeners[port]

    def close(self) -> None:
        self._closing = True
        self._unbind()
        for conn in list(self._conns.values()):
            conn.close()
        for task in list(self._tasks.values()):
            task.cancel()

    def _crash(self, reason: str) -> None:
        self._closing = True
        self._unbind()
        for conn in list(self._conns.values()):
            conn._die(reason)
        for task in list(self._tasks.values()):
            task.cancel()

    async def wait_closed(self) -> None:
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class Dialer(Protocol):
    """What a host's network view needs from the run's fabric (:class:`sim.network.Fabric`)."""

    links: Links
    handler_errors: list[str]

    async def connect(self, src: Host, address: Address, timeout: float | None) -> SimConnection: ...


class HostNetwork(_SeamNetwork):
    """One virtual host's view of the simulated network (aiodist's Network seam)."""

    __slots__ = ("_host", "fabric")

    def __init__(self, host: Host, fabric: Dialer) -> None:
        self._host = host
        self.fabric = fabric

    def __repr__(self) -> str:
        return f"<sim.HostNetwork {self._host.name}>"

    async def default_host(self) -> str:
        return self._host.name

    async def connect(self, address: Address, *, timeout: float | None = None,
                      max_frame_size: int | None = None, ssl: Any = None) -> Connection:
        """Open a connection (a round trip). ConnectionLost if refused/unknown; TimeoutError on timeout.

        ``ssl`` is accepted and has no effect: the simulated links run inside
        one process, with nothing to encrypt.

        Cancellation (or the timeout): nothing is left behind; a connection
        the peer accepted meanwhile is closed (the peer sees ConnectionLost).
        """
        loop = self.fabric.links.loop
        if loop.lane in loop.dead_lanes:
            await loop.create_future()
        conn = await self.fabric.connect(self._host, address, timeout)
        if max_frame_size is not None:
            conn.set_max_frame_size(max_frame_size)
        return conn

    async def listen(
        self,
        address: Address,
        handler: ConnectionHandler,
        *,
        max_frame_size: int | None = None,
        handshake_timeout: float | None = None,
        ssl: Any = None,
    ) -> Listener:
        """Bind ``address`` on this host (port 0 picks a free port); ConnectionLost if taken. (``ssl``: as connect.)"""
        fabric = self.fabric
        links = fabric.links
        host, port = address
        h = self._host
        if str(host) not in LOCAL_NAMES and str(host) != h.name:
            hint = ""
            if str(host) == STORE_HOST:  # (a program serving its own store, run with store_host="separate")
                hint = (f" (the store's own host: the simulator serves the store there and the ranks see "
                        f"TORCHELASTIC_USE_AGENT_STORE=True; a program that starts its own store server should not "
                        f"then, as under torchrun's agent store)")
            raise ListenError(f"cannot listen on {host}:{port}: not an address of {h.name}{hint}", address=(host, port))
        port = int(port)
        if port == 0:
            while h.next_port in h.listeners:
                h.next_port += 1
            port = h.next_port
            h.next_port += 1
        if port in h.listeners:
            raise ListenError(f"cannot listen on {host}:{port}: address already in use", address=(host, port))
        listener = SimListener(links.loop, h, (str(host) or h.name, port), handler,
                               max_frame_size or DEFAULT_MAX_FRAME_SIZE, fabric.handler_errors)
        h.listeners[port] = listener
        h.gone.pop(port, None)
        links.tracer.emit(links.loop.now, "listen", h.name, detail=str(port))
        return listener
