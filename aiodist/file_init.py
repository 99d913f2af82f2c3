"""``init_method="file:///path"``: the ranks find their store through a file they all see (torch's FileStore init).

Rank 0 starts a store server on 127.0.0.1 (a free port) and publishes its
address in the file (written whole: a temporary file renamed over it); the
other ranks wait for the file, read the address and connect. A file left by
an earlier job names a server that is gone (or that does not know this
job's secret): a rank that cannot connect reads the file again until the
deadline. The store is authenticated (and TLS'd) as an ``env://`` one is.
Rank 0 removes the file when the job ends. ``rank`` and ``world_size`` are
required (given, or ``RANK``/``WORLD_SIZE`` in the environment), as in torch.

The ranks must run on one machine (the server listens on 127.0.0.1); across
machines, use ``tcp://`` or ``env://``.

Cancellation closes what was opened (the server, the client) and, on rank
0, removes the file it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from . import tls
from .auth import FROM_ENVIRONMENT, AuthenticationError, resolve_secret
from .context import getenv
from .errors import InvalidArgumentError, RendezvousError, StoreError
from .rendezvous import leave
from .store import StoreServer, TCPStore
from .store.limits import StoreLimits

__all__ = ["FILE_POLL", "FileRendezvous", "FileStore", "file_path", "open_file_store"]

FILE_POLL = 0.05
"""Seconds between two reads of the file by a rank waiting for rank 0 to publish it."""


def file_path(init_method: str) -> str:
    """The path of a ``file://`` init method (``file:///tmp/x`` and ``file://tmp/x`` style both taken as written)."""
    url = urlparse(init_method)
    path = unquote(url.netloc + url.path)
    if not path:
        raise RendezvousError(f"init_method {init_method!r} names no file: use file:///absolute/path")
    return path


@dataclass
class FileRendezvous:
    """The store a ``file://`` init found, and what this rank must close at the end (see :meth:`close`)."""

    store: Any
    path: str
    server: StoreServer | None = None
    closers: list[Any] = field(default_factory=list)

    async def close(self, prefix: str, world_size: int, *, wait: float) -> None:
        """Leave the round (rank 0 waits up to ``wait`` s for the others), close the client and server, remove the file."""
        await leave(self.store, prefix, world_size, wait=wait if self.server is not None else 0.0)
        with contextlib.suppress(Exception):
            await self.store.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await self.server.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)


async def open_file_store(
    init_method: str, *, rank: int, timeout: float, secret: bytes | None, ssl: Any = None, limits: Any = None
) -> FileRendezvous:
    """Rank 0: start a store server and publish its address in the file; others: connect to the address found there.

    ``secret``, ``ssl`` (an :class:`aiodist.tls.TLS` or None) and ``limits``
    (rank 0's server; None: from the environment) as for the store of an
    ``env://`` rendezvous.
    """
    path = file_path(init_method)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    client_ssl = tls.client_side(ssl)
    if rank == 0:
        server = await StoreServer.start(
            "127.0.0.1", 0, secret=secret, ssl=tls.server_side(ssl),
            limits=limits if limits is not None else StoreLimits.from_environment(getenv),
        )
        try:
            try:
                _publish(path, f"127.0.0.1:{server.port}\n")
            except OSError as e:
                raise RendezvousError(f"file:// init: rank 0 could not write {path}: {e}") from None
            store = await TCPStore.connect("127.0.0.1", server.port, timeout=timeout, secret=secret, ssl=client_ssl)
        except BaseException:
            await server.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return FileRendezvous(store, path, server)
    last: BaseException | None = None
    for _ in range(1 << 30):  # (bounded by the deadline)
        address = _read(path)
        if address is not None:
            host, port = address
            try:
                store = await TCPStore.connect(
                    host, port, timeout=max(min(1.0, deadline - loop.time()), 0.001), secret=secret, ssl=client_ssl
                )
            except (StoreError, OSError, TimeoutError, AuthenticationError) as e:  # an earlier job's file
                last = e
            else:
                return FileRendezvous(store, path)
        if loop.time() >= deadline:
            break
        await asyncio.sleep(FILE_POLL)
    what = "no usable address appeared in it" if last is None else f"its server did not answer ({last!r})"
    raise RendezvousError(f"file:// init: rank {rank} waited {timeout:g}s for rank 0 to publish {path}: {what}")


def _publish(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # (gone after a successful rename)


def _read(path: str) -> tuple[str, int] | None:
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host, int(port)


class _ServerAndFile:
    """What the store of rank 0 of a :func:`FileStore` stops when it is closed: the server, then the file."""

    def __init__(self, server: StoreServer, path: str) -> None:
        self.server = server
        self.path = path

    async def close(self) -> None:
        await self.server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


async def _file_store(file_name: str, world_size: int = -1, *, timeout: Any = 300.0, secret: Any = FROM_ENVIRONMENT,
                      ssl: Any = None) -> TCPStore:
    from .store.base import as_timeout

    raw = getenv("RANK") or ""
    if not raw.isdigit():
        raise InvalidArgumentError(
            "FileStore(file_name, world_size): the rank that serves the store is rank 0, read from RANK in the "
            "environment (aiodist run and the simulator set it); set RANK, or use init_process_group("
            "init_method='file://...', rank=..., world_size=...)")
    if type(world_size) is not int or not (world_size == -1 or world_size >= 1) or \
            (world_size >= 1 and int(raw) >= world_size):
        raise InvalidArgumentError(f"FileStore: world_size {world_size!r} does not fit RANK {raw}")
    found = await open_file_store(f"file://{file_name}", rank=int(raw), timeout=as_timeout(timeout, 300.0),
                                  secret=resolve_secret(secret), ssl=ssl)
    if found.server is not None:
        found.store._owned_server = _ServerAndFile(found.server, found.path)
    store: TCPStore = found.store
    return store


def FileStore(file_name: str, world_size: int = -1, **options: Any) -> Coroutine[Any, Any, TCPStore]:  # noqa: N802
    """torch's ``FileStore(file_name, world_size)``, awaited: ``store = await aiodist.FileStore(path, world_size)``.

    The ranks find one store through the file, as ``init_method="file://..."``
    does: rank 0 (``RANK`` in the environment) starts a server on 127.0.0.1
    and publishes its address there, the others connect; rank 0's store stops
    the server and removes the file when it is closed. One machine only.
    ``timeout=``, ``secret=`` and ``ssl=`` as for :meth:`TCPStore.connect`.
    """
    return _file_store(file_name, world_size, **options)
