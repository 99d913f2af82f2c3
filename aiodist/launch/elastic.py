"""The elastic agent: ``aiodist run --nnodes MIN:MAX``.

Each ``aiodist run`` is one node. The agents meet in a rendezvous store at
``--master-addr:--master-port`` (the first agent to bind the port hosts it;
the others connect) and agree through :class:`aiodist.elastic.ElasticRendezvous`
on a *round*: between MIN and MAX nodes, a last call of ``--rdzv-last-call``
seconds once MIN are there, each node's rank its place in the round. Node 0 of
the round picks the port of the workers' own store and publishes it; then
every agent runs its ``-n`` workers as a static job of that round (RANK,
WORLD_SIZE, ... as usual; TORCHELASTIC_RESTART_COUNT / AIODIST_RESTART_COUNT
count the rounds this agent went through).

When the job fails on any node (a worker died; the others then fail with
PeerFailureError naming it), every agent stops its workers, opens the next
round (once: ``open_next_round(after=round)``) and rejoins, up to
``--max-restarts`` times: the job goes on with the nodes that are still there
(at least MIN), and an agent that was too late for a round joins the next.

Limits: the agent that hosts the rendezvous store must outlive the others
(it is the first one started, as with torchrun's c10d rendezvous); waiting
nodes are taken in only at the next restart (a running round is not
interrupted for them).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from typing import Any, BinaryIO

from .. import tls
from ..auth import resolve_secret
from ..elastic import ElasticRendezvous
from ..errors import LaunchError
from .supervisor import LaunchConfig, LaunchResult, free_port, launch


def parse_nnodes(raw: str | int) -> tuple[int, int]:
    """``"N"`` -> (N, N); ``"MIN:MAX"`` -> (MIN, MAX)."""
    lo, sep, hi = str(raw).partition(":")
    try:
        a, b = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise ValueError(f"--nnodes must be N or MIN:MAX, got {raw!r}") from None
    if not 1 <= a <= b:
        raise ValueError(f"--nnodes {raw!r}: need 1 <= MIN <= MAX")
    return a, b


async def _rendezvous_store(addr: str, port: int, timeout: float, secret: bytes | None, ssl: Any) -> tuple[Any, Any]:
    from ..store.client import TCPStore
    from ..store.server import StoreServer

    server = None
    try:
        server = await StoreServer.start(host=addr, port=port, secret=secret, ssl=ssl)
    except OSError:
        server = None  # another agent hosts it
    try:
        store = await TCPStore.connect(addr, port, timeout=timeout, secret=secret, ssl=ssl)
    except BaseException:
        if server is not None:
            await server.close()
        raise
    return store, server


def _worker_host(master_addr: str) -> str:
    if master_addr in ("127.0.0.1", "localhost", "::1"):
        return master_addr
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return master_addr


async def launch_elastic(
    config: LaunchConfig,
    *,
    min_nodes: int,
    max_nodes: int,
    last_call: float = 1.0,
    rdzv_timeout: float = 300.0,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
    log: Callable[[str], None] | None = None,
    handle_signals: bool = True,
) -> LaunchResult:
    """Run this node's part of an elastic job (see the module doc)."""
    if config.master_port is None:
        raise LaunchError("--nnodes MIN:MAX needs --master-port (the rendezvous store's port, the same on every node)")
    say = log or (lambda m: print(f"aiodist run: {m}", file=__import__("sys").stderr, flush=True))
    environ = os.environ if config.env is None else config.env  # the agents' secret and TLS are the job's
    store, server = await _rendezvous_store(config.master_addr, config.master_port, rdzv_timeout,
                                            resolve_secret(environ=environ), tls.from_environment(environ))
    node_id = f"{socket.gethostname()}:{os.getpid()}"
    prefix = f"aiodist/elastic/{config.run_id}/"
    restarts = 0
    try:
        while True:
            rdzv = ElasticRendezvous(store, node_id, min_nodes=min_nodes, max_nodes=max_nodes, last_call=last_call,
                                     timeout=rdzv_timeout, prefix=prefix)
            r = await rdzv.next_round()
            key = f"{prefix}workers/{r.round}"
            if r.rank == 0:
                host = _worker_host(config.master_addr)
                await store.set(key, f"{host}|{free_port(host)}".encode())
            host, _, port = bytes(await store.get(key, timeout=rdzv_timeout)).decode().rpartition("|")
            say(f"round {r.round}: node {r.rank} of {r.world_size} (workers' store {host}:{port})")
            cfg = dataclasses.replace(config, nnodes=r.world_size, node_rank=r.rank, master_addr=host,
                                      master_port=int(port), max_restarts=0, restart_base=restarts,
                                      on_failure="stop" if config.on_failure == "restart" else config.on_failure)
            result = await launch(cfg, stdout=stdout, stderr=stderr, log=log, handle_signals=handle_signals)
            if result.ok or result.signal is not None or result.timed_out or restarts >= config.max_restarts:
                return dataclasses.replace(result, attempts=restarts + 1)
            restarts += 1
            say(f"the job failed in round {r.round}: rejoining (restart {restarts} of {config.max_restarts})")
            await rdzv.open_next_round(after=r.round)
    finally:
        await store.close()
        if server is not None:
            await server.close()
