"""``await aiodist.TCPStore(host, port, world_size, is_master, timeout)``: torch's constructor, awaited.

torch's ``TCPStore(host_name, port, world_size=None, is_master=False,
timeout=timedelta(seconds=300), wait_for_workers=True, ...)`` blocks: the
master process starts the server (and, with ``wait_for_workers``, waits until
``world_size`` clients have connected, its own included, whether or not they
are still there) and every process
connects. Here the same call, given torch's arguments, returns a coroutine
that does the same; ``await`` it (the port of torch code by adding
``await``). The master's store owns its server: closing that store stops the
server (torch's master stops it when its store goes). aiodist's own form is
``StoreServer.start`` plus ``TCPStore.connect``. ``multi_tenant`` and
``use_libuv`` are accepted and mean nothing here; ``master_listen_fd`` is not
supported. The connection is authenticated as every aiodist store's is
(``secret=`` and ``ssl=`` as on :meth:`TCPStore.connect`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .. import auth
from ..errors import InvalidArgumentError, StoreConnectTimeoutError
from .base import as_timeout
from .server import StoreServer

WORKERS_POLL = 0.01
"""Seconds between two looks at how many clients the master's server has (``wait_for_workers``)."""


async def open_torch_form(
    store_class: Any,
    host_name: str,
    port: int,
    world_size: int | None = None,
    is_master: bool = False,
    timeout: Any = 300.0,
    wait_for_workers: bool = True,
    multi_tenant: bool = False,
    master_listen_fd: int | None = None,
    use_libuv: bool = True,
    *,
    secret: Any = auth.FROM_ENVIRONMENT,
    ssl: Any = None,
) -> Any:
    """Start the server if ``is_master``, connect (a ``store_class``, :class:`~aiodist.store.client.TCPStore`), and
    (master, ``wait_for_workers``) wait for ``world_size`` clients."""
    if master_listen_fd is not None:
        raise InvalidArgumentError("TCPStore: master_listen_fd is not supported (the master listens on host_name:port)")
    if world_size is not None and (type(world_size) is not int or world_size < 1):
        raise InvalidArgumentError(f"TCPStore: world_size must be a positive int or None, got {world_size!r}")
    seconds = as_timeout(timeout, 300.0)
    server = await StoreServer.start(host_name, port, secret=secret, ssl=ssl) if is_master else None
    try:
        store = await store_class.connect(host_name, server.port if server is not None else port, timeout=seconds,
                                       secret=secret, ssl=ssl)
    except BaseException:
        if server is not None:
            await server.close()
        raise
    store._owned_server = server
    if server is not None and wait_for_workers and world_size is not None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while server.joined < world_size:  # (every client that came counts: torch's master counts joins too)
            if loop.time() >= deadline:
                joined = server.joined
                await store.close()
                raise StoreConnectTimeoutError(
                    f"TCPStore (master) at {host_name}:{server.port}: {joined} of {world_size} clients connected "
                    f"within {seconds:g}s (wait_for_workers)", host=host_name, port=server.port, timeout=seconds)
            await asyncio.sleep(WORKERS_POLL)
    return store
