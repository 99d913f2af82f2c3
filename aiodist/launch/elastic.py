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

While its workers run, each agent watches the round's other nodes in the
store (:mod:`aiodist.launch.round_watch`: their heartbeats, the goodbye a
leaving agent writes, the round moving on): a node lost at any moment, even
before its workers joined the workers' rendezvous, fails the round on every
node at once (their workers would wait for the lost ones until their own
timeout), and they rejoin without it. SIGTERM/SIGINT/SIGHUP/SIGQUIT while an agent is between
jobs make it leave with a goodbye too. Ranks that are all there but do not all
join their rendezvous within ``--rdzv-timeout`` of the first fail the round
the same way.

Limits: the agent that hosts the rendezvous store must outlive the others
(it is the first one started, as with torchrun's c10d rendezvous); waiting
nodes are taken in only at the next restart (a running round is not
interrupted for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from .. import tls
from ..auth import resolve_secret
from ..elastic import ElasticRendezvous
from ..errors import LaunchError, StoreConnectionLost, StoreError
from .outcome import Blame
from .rdzv_failure import rendezvous_errors
from .round_watch import (FINISHED, HEARTBEAT_TIMEOUT, HOST_FINISHED, HOST_KEY, HOST_LEFT, RoundWatch, describe_ranks,
                          say_goodbye)
from .supervisor import STOP_SIGNALS, LaunchConfig, LaunchResult, free_port, launch


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


class _AgentSignals:
    """A stopping signal (STOP_SIGNALS) while the agent is between jobs (joining a round): stop it, saying goodbye.

    While a job runs, :func:`launch` handles them (it forwards them to the ranks and returns), and removes
    its handlers afterwards: :meth:`install` puts this one back.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._task = asyncio.current_task()
        self._installed: list[int] = []

    def install(self) -> None:
        if not self.enabled:
            return
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)
            if signum not in self._installed:
                self._installed.append(signum)

    def _on_signal(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
            if self._task is not None:
                self._task.cancel()

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in self._installed:
            loop.remove_signal_handler(signum)
        self._installed.clear()


@dataclasses.dataclass(frozen=True)
class _WorkersStore:
    """Where the ranks of the round rendezvous (their rank 0 hosts that store), how to get in, and the world."""

    host: str
    port: int
    secret: bytes | None = dataclasses.field(repr=False)  # (never in a repr: a log line could show it)
    ssl: Any
    ours: bool  # this node's rank 0 hosts it
    world_size: int

    async def status(self) -> tuple[list[int], bool] | None:
        """(ranks that joined their first rendezvous, whether it completed); None: cannot tell.

        While the store cannot be reached, and this node's rank 0 hosts it, nobody has joined yet.
        """
        from ..rendezvous import GENERATION_KEY
        from ..store.client import TCPStore

        try:
            async with asyncio.timeout(2.0):
                store = await TCPStore.connect(self.host, self.port, timeout=1.0, secret=self.secret, ssl=self.ssl)
                try:
                    gen = await store.add(GENERATION_KEY, 0)
                    prefix = f"aiodist/{gen}/"
                    if await store.check([f"{prefix}done"]) and bytes(await store.get(f"{prefix}done")) == b"1":
                        return list(range(self.world_size)), True
                    joined = [r for r in range(self.world_size) if await store.check([f"{prefix}joined/{r}"])]
                    return joined, False
                finally:
                    await store.close()
        except Exception:  # noqa: BLE001 - (the store may be gone with a lost node: then nobody can tell)
            return ([], False) if self.ours else None

    async def joined(self) -> bool | None:
        """Did the ranks complete their rendezvous? (None: cannot tell)."""
        status = await self.status()
        return None if status is None else status[1]


RDZV_POLL = 1.0
"""Seconds between two looks, while the ranks of a round have not all joined their rendezvous, at who did."""


async def _rendezvous_limit(workers: _WorkersStore, limit: float) -> tuple[list[int], str] | None:
    """Return once the ranks completed their rendezvous (None), or once some of them waited in it for more
    than ``limit`` s for the others (the ranks missing, and a message)."""
    loop = asyncio.get_running_loop()
    first_joined: float | None = None
    for _ in range(int(limit / RDZV_POLL) * 4 + 16):  # (joining may start late; then the ranks' own timeouts)
        await asyncio.sleep(RDZV_POLL)
        status = await workers.status()
        if status is None:
            continue
        joined, done = status
        if done:
            return None
        now = loop.time()
        if joined and first_joined is None:
            first_joined = now
        if first_joined is not None and now - first_joined > limit:
            missing = [r for r in range(workers.world_size) if r not in joined]
            return missing, (f"{describe_ranks(tuple(missing))} did not join the rendezvous within --rdzv-timeout {limit:g}s "
                    f"({describe_ranks(tuple(joined))} waited for them)")
    return None


JOINED_GRACE = 5.0
"""Seconds a job whose ranks had all joined is given to end on its own after a node was lost (its ranks then
name the rank they lost, and in which operation), before this node's ranks are stopped."""


async def _run_round(
    cfg: LaunchConfig,
    watch: RoundWatch,
    *,
    workers: _WorkersStore,
    rdzv_timeout: float,
    say: Callable[[str], None],
    stdout: BinaryIO | None,
    stderr: BinaryIO | None,
    log: Callable[[str], None] | None,
    handle_signals: bool,
) -> LaunchResult:
    """Run this node's part of the round's job while watching the other nodes (see :mod:`.round_watch`).

    A node lost before the job ended stops this node's ranks at once: the job of the round cannot
    complete without it (ranks waiting for it in the rendezvous would wait out their whole timeout).
    """
    job = asyncio.create_task(launch(cfg, stdout=stdout, stderr=stderr, log=log, handle_signals=handle_signals))
    watcher = asyncio.create_task(watch.run())
    limit = asyncio.create_task(_rendezvous_limit(workers, rdzv_timeout))
    try:
        await asyncio.wait([job, watcher, limit], return_when=asyncio.FIRST_COMPLETED)
        if not job.done() and not watcher.done():  # (the ranks completed their rendezvous, or some waited too long)
            missing = limit.result()
            if missing is not None:  # (every node is there, but not all their ranks joined: stuck before it?)
                return await _stop(job, cfg, say, Blame(missing[0][0], "lost", missing[1]), store_lost=False)
            await asyncio.wait([job, watcher], return_when=asyncio.FIRST_COMPLETED)
        if job.done():
            return job.result()
        loss = watcher.result()
        if loss is None:  # (the store is gone: the ranks' own detection decides)
            return await job
        joined = await workers.joined()
        when = " before its ranks joined the rendezvous" if joined is False else " while the job ran" if joined else ""
        message = loss.message(when)
        if joined and cfg.on_failure == "continue":  # (the ranks go on without it: theirs to handle)
            return dataclasses.replace(await job, store_lost=loss.store)
        if joined:  # the ranks notice a lost peer themselves, and can name the rank and the operation
            await asyncio.wait([job], timeout=JOINED_GRACE)
        if job.done():
            return dataclasses.replace(job.result(), store_lost=loss.store)
        first = loss.ranks[0] if loss.ranks else -1
        return await _stop(job, cfg, say, Blame(first, "lost", message), store_lost=loss.store)
    finally:
        for task in (job, watcher, limit):
            task.cancel()
        await asyncio.gather(job, watcher, limit, return_exceptions=True)


async def _stop(job: asyncio.Task[LaunchResult], cfg: LaunchConfig, say: Callable[[str], None], blame: Blame, *,
                store_lost: bool) -> LaunchResult:
    """Stop this node's part of the round's job, which ``blame`` says cannot complete."""
    say(f"root cause: {blame.message}; stopping this node's {cfg.nproc_per_node} rank(s)")
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        result = await job
        if result.signal is not None or result.ok:
            return dataclasses.replace(result, store_lost=store_lost)
    return LaunchResult(exit_code=1, attempts=1, root_cause=blame, store_lost=store_lost)


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
    access = (resolve_secret(environ=environ), tls.from_environment(environ))
    signals = _AgentSignals(handle_signals)
    signals.install()
    goodbye = "failed"  # what this agent tells the others as it leaves
    store = server = None
    node_id = f"{socket.gethostname()}:{os.getpid()}"
    prefix = f"aiodist/elastic/{config.run_id}/"
    restarts = 0
    joining = functools.partial(rendezvous_errors, where=f"{config.master_addr}:{config.master_port}",
                                nnodes=f"{min_nodes}:{max_nodes}", rdzv_timeout=rdzv_timeout)
    try:
        with joining():
            store, server = await _rendezvous_store(config.master_addr, config.master_port, rdzv_timeout, *access)
            if server is not None:
                await store.set(f"{prefix}{HOST_KEY}", node_id.encode())
        while True:
            rdzv = ElasticRendezvous(store, node_id, min_nodes=min_nodes, max_nodes=max_nodes, last_call=last_call,
                                     timeout=rdzv_timeout, prefix=prefix)
            with joining():
                r = await rdzv.next_round()
                key = f"{prefix}workers/{r.round}"
                if r.rank == 0:
                    host = _worker_host(config.master_addr)
                    await store.set(key, f"{host}|{free_port(host)}".encode())
                host, _, port = bytes(await store.get(key, timeout=rdzv_timeout)).decode().rpartition("|")
            say(f"round {r.round}: node {r.rank} of {r.world_size} (workers' store {host}:{port})")
            cfg = dataclasses.replace(config, nnodes=r.world_size, node_rank=r.rank, master_addr=host,
                                      master_port=int(port), max_restarts=0, restart_base=restarts,
                                      reported_max_restarts=config.max_restarts,
                                      on_failure="stop" if config.on_failure == "restart" else config.on_failure)
            watch = RoundWatch(store, prefix, round=r.round, rank=r.rank, participants=r.participants,
                               nproc_per_node=config.nproc_per_node)
            try:
                workers = _WorkersStore(host, int(port), *access, ours=r.rank == 0,
                                        world_size=r.world_size * config.nproc_per_node)
                result = await _run_round(cfg, watch, workers=workers, rdzv_timeout=rdzv_timeout, say=say,
                                          stdout=stdout, stderr=stderr, log=log, handle_signals=handle_signals)
            finally:
                signals.install()  # (launch removed its handlers, and with them ours)
            if signals.signum is not None:  # (it came while the ranks were being stopped)
                raise asyncio.CancelledError
            if result.ok:
                goodbye = FINISHED
            elif result.signal is not None:
                goodbye = signal.Signals(result.signal).name
            elif result.timed_out:
                goodbye = "its job exceeded its time limit"
            if result.store_lost:
                say("no new round can be formed: the rendezvous store is gone (its host must outlive the others)")
            if (result.ok or result.signal is not None or result.timed_out or result.store_lost
                    or restarts >= config.max_restarts):
                if not result.ok and goodbye == "failed":
                    goodbye = "its job failed and it may not restart again"
                return dataclasses.replace(result, attempts=restarts + 1)
            restarts += 1
            say(f"the job failed in round {r.round}: rejoining (restart {restarts} of {config.max_restarts})")
            try:
                # The store answers in milliseconds; one silent as long as a lost node's heartbeat is on a
                # node that is hung or cut off (its agent hosts it): no round can be formed without it.
                async with asyncio.timeout(HEARTBEAT_TIMEOUT):
                    await rdzv.open_next_round(after=r.round)
            except (TimeoutError, StoreError) as e:
                if isinstance(e, StoreConnectionLost):
                    say(f"cannot rejoin: the rendezvous store is gone (its host must outlive the others): {e}")
                else:
                    what = f"did not answer within {HEARTBEAT_TIMEOUT:g}s" if isinstance(e, TimeoutError) else f"failed: {e}"
                    say(f"cannot rejoin: the rendezvous store {what} (its host node is hung or cut off?)")
                return dataclasses.replace(result, attempts=restarts, store_lost=True)
    except asyncio.CancelledError:
        if signals.signum is None:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        name = signal.Signals(signals.signum).name
        goodbye = name
        say(f"received {name} while in the elastic rendezvous; leaving")
        return LaunchResult(exit_code=128 + signals.signum, attempts=restarts + 1, signal=signals.signum)
    finally:
        signals.enabled = False
        signals.remove()
        if store is not None:
            await say_goodbye(store, prefix, node_id, goodbye)
            await store.close()
        if server is not None:
            await server.close(reason=HOST_FINISHED if goodbye == FINISHED else
                               f"{HOST_LEFT}{goodbye})")
