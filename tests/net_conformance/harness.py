"""Run one test body against every implementation of the network seam.

``Impl.run(body)`` calls ``await body(net)`` with a :class:`aiodist.net.base.Network`:

* ``tcp-asyncio`` / ``tcp-uvloop``: :class:`aiodist.net.tcp.TCPNetwork`, real
  sockets on 127.0.0.1, on the default asyncio loop or on uvloop;
* ``sim``: one virtual host of the simulator (``sim.run`` with one rank), on
  its virtual clock; its connections to ``127.0.0.1`` are simulated links
  to itself;
* ``shm-asyncio`` / ``shm-uvloop``: :class:`aiodist.net.shmnet.HostNetwork`,
  what ranks of one host use: its connections to a listener of this host are
  Unix sockets with shared-memory rings (:mod:`aiodist.net.shm`).

:func:`connected` gives a connection and the listener's end of it, so one body
drives both ends. The same body must pass on every implementation: that is
the contract, whatever the implementation does inside.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

import sim
from aiodist.context import current_network
from aiodist.net import shm, shmnet, tcp, tcp_connection
from aiodist.net.base import Connection, Listener, Network

T = TypeVar("T")
Body = Callable[[Network], Awaitable[T]]

IMPLS = ("tcp-asyncio", "tcp-uvloop", "sim", "shm-asyncio", "shm-uvloop")


@dataclass(frozen=True)
class Impl:
    """One implementation of the seam, and how to run a body on it."""

    name: str

    @property
    def is_tcp(self) -> bool:
        return self.name.startswith("tcp")

    def __str__(self) -> str:
        return self.name

    def run(self, body: Body[T], *, max_unread_frames: int | None = None, timeout: float = 60.0,
            seed: int = 0) -> T:
        """``await body(net)`` on this implementation; its result (or its exception).

        ``max_unread_frames``: a receiver whose program leaves this many frames
        unread stops reading from the network (the implementations' default
        is 4096; tests of backpressure lower it so that little data fills
        the buffers).
        """
        if self.name == "sim":
            return self._run_sim(body, max_unread_frames, timeout, seed)
        return self._run_tcp(body, max_unread_frames, timeout)

    def _run_tcp(self, body: Body[T], max_unread_frames: int | None, timeout: float) -> T:
        if self.name.endswith("-uvloop"):
            uvloop = pytest.importorskip("uvloop")
            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        else:
            factory = asyncio.new_event_loop
        net: Network = tcp.TCPNetwork()
        if self.name.startswith("shm"):
            net = shmnet.HostNetwork(net, host_id="conformance")
        saved = tcp_connection._MAX_QUEUED_FRAMES, shm.MAX_QUEUED_FRAMES
        if max_unread_frames is not None:
            tcp_connection._MAX_QUEUED_FRAMES = shm.MAX_QUEUED_FRAMES = max_unread_frames
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                return runner.run(asyncio.wait_for(body(net), timeout))
        finally:
            tcp_connection._MAX_QUEUED_FRAMES, shm.MAX_QUEUED_FRAMES = saved

    def _run_sim(self, body: Body[T], max_unread_frames: int | None, timeout: float, seed: int) -> T:
        network = sim.Network(max_unread_frames=max_unread_frames or 4096)
        result = sim.run(_sim_main, args=(body, timeout), world_size=1, seed=seed, network=network)
        result.raise_on_failure()
        outcome, value = result.rank_results[0]
        if outcome == "raised":
            raise value
        return value  # type: ignore[no-any-return]


async def _sim_main(body: Body[T], timeout: float) -> tuple[str, Any]:
    """The body as the simulated rank's main; what it raised comes back as it is (for pytest.raises)."""
    try:
        return "returned", await asyncio.wait_for(body(current_network()), timeout)
    except Exception as e:  # noqa: BLE001 - handed to the test as it is
        return "raised", e


@contextlib.asynccontextmanager
async def connected(net: Network, *, max_frame_size: int | None = None,
                    handshake_timeout: float | None = None) -> AsyncIterator[tuple[Connection, Connection]]:
    """A connection to a fresh listener and the listener's end of it; both closed (and the listener) at exit.

    The listener's handler keeps its connection open until the block ends.
    """
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[Connection] = loop.create_future()
    done = asyncio.Event()

    async def handler(conn: Connection) -> None:
        if not accepted.done():
            accepted.set_result(conn)
        await done.wait()

    kw: dict[str, Any] = {"max_frame_size": max_frame_size}
    if handshake_timeout is not None:
        kw["handshake_timeout"] = handshake_timeout
    listener: Listener = await net.listen(("127.0.0.1", 0), handler, **kw)
    client: Connection | None = None
    try:
        client = await net.connect(listener.address, timeout=10)
        server = await asyncio.wait_for(accepted, 10)
        yield client, server
    finally:
        done.set()
        if client is not None:
            client.abort()
        listener.close()
        await listener.wait_closed()


async def recv_all(conn: Connection, *, timeout: float = 10.0) -> list[Any]:
    """Every frame until the connection ends, then the error that ended it: ``[frame, ..., exc]``."""
    out: list[Any] = []
    while True:
        try:
            out.append(await asyncio.wait_for(conn.recv(), timeout))
        except (ConnectionError, TimeoutError) as e:
            out.append(e)
            return out


async def fill_until_stuck(a: Connection, *, chunk_size: int = 1 << 20, limit: int = 2000) -> int:
    """send_nowait frames ``{"i": 0}``, ``{"i": 1}``... of ``chunk_size`` bytes until the buffers are full
    for good (towards a reader that does not read); how many were queued.

    Full for good: send_nowait said False and ``drained()`` does not return
    within 0.3 s (it is cancelled then, which leaves the frames queued).
    """
    chunk = bytes(chunk_size)
    for i in range(limit):
        if not a.send_nowait({"i": i}, chunk):
            try:
                await asyncio.wait_for(a.drained(), 0.3)
            except TimeoutError:
                return i + 1
    raise AssertionError("a reader that does not read must fill the buffers")


def payload_bytes(frame: Any) -> bytes | None:
    return None if frame.payload is None else bytes(frame.payload)
