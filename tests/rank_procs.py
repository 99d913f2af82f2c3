"""Real rank processes of one env:// job on 127.0.0.1, and the JSON events each prints.

The harness of the failure tests (tests/test_failure_procs.py,
tests/test_shm_failure.py) and of benchmarks/failure_bench.py: a worker
prints one JSON object a line with :func:`emit` (``{"kind": ..., "t": wall
clock, ...}``); :class:`RankProcs` starts the W processes, keeps each rank's
latest event of each kind, injects signals, waits for what the ranks report
and ends them all. Wall-clock time is what is compared: the harness is
outside the runtime, comparing processes of one machine.

Standard library only (it imports no aiodist), so a benchmark measuring
another tree uses it unchanged. Benchmarks import it with ``tests/`` on
``sys.path``; pytest and a test file run as a worker script have it there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def emit(kind: str, **kw: Any) -> None:
    """Print one event (a worker's side): ``kind``, the wall-clock time and ``kw``, as a JSON line."""
    print(json.dumps({"kind": kind, "t": time.time(), **kw}), flush=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for env:// jobs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world_size: int, port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables ``aiodist run`` gives rank ``rank`` of a one-host job whose store is on ``port``."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    env.update(extra or {})
    return env


class RankProcs:
    """W processes, one per rank, each running ``python ARGV...`` with its rank's environment.

    ``events[r]`` maps each kind of event rank ``r`` printed to the latest one;
    ``faults`` holds the time of every fault, in order: signals sent with
    :meth:`kill` and ``"fault"`` events (a rank that says it misbehaves now).
    Lines that are not JSON are skipped; stderr is discarded. Use as
    ``async with await RankProcs.start(...) as ranks:``: leaving kills every
    process still running (a stopped one too) and waits for it.
    """

    def __init__(self, procs: list[asyncio.subprocess.Process]) -> None:
        self.procs = procs
        self.events: list[dict[str, dict[str, Any]]] = [{} for _ in procs]
        self.faults: list[float] = []
        self.ended: set[int] = set()  # ranks whose output ended (the process exited or closed it)
        self._changed = asyncio.Event()
        self._readers = [asyncio.create_task(self._read(r)) for r in range(len(procs))]
        self._closed = False

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        world: int,
        *,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
    ) -> RankProcs:
        """Start ``world`` ranks of a job whose store rank 0 hosts on a free port.

        Each gets this environment, its rank's variables (:func:`rank_env`),
        ``PYTHONPATH`` = the project root, then ``env``.
        """
        port = free_port()
        procs = []
        try:
            for r in range(world):
                penv = dict(os.environ, **rank_env(r, world, port), PYTHONPATH=str(ROOT), **(env or {}))
                procs.append(await asyncio.create_subprocess_exec(
                    python, *argv, env=penv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        except BaseException:
            for p in procs:
                p.kill()
                await p.wait()
            raise
        return cls(procs)

    async def __aenter__(self) -> RankProcs:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def _read(self, r: int) -> None:
        out = self.procs[r].stdout
        assert out is not None
        try:
            async for line in out:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                self.events[r][ev["kind"]] = ev
                if ev["kind"] == "fault":
                    self.faults.append(ev["t"])
                self._changed.set()
        finally:
            self.ended.add(r)
            self._changed.set()

    def of(self, kind: str) -> dict[int, dict[str, Any]]:
        """Rank -> its latest event of ``kind``, for the ranks that printed one."""
        return {r: evs[kind] for r, evs in enumerate(self.events) if kind in evs}

    def reported(self, kind: str, ranks: Iterable[int]) -> bool:
        """Every one of ``ranks`` printed an event of ``kind``."""
        return all(kind in self.events[r] for r in ranks)

    async def until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` (checked after each event), at most ``timeout`` seconds; what it says then.

        Returns at once when every rank's output has ended: nothing can change any more.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            left = deadline - loop.time()
            if left <= 0 or len(self.ended) == len(self.procs):
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return done()
        return True

    async def all_ready(self, timeout: float = 60.0) -> None:
        """Wait until every rank printed ``"ready"``; TimeoutError naming the others if not within ``timeout``."""
        every = range(len(self.procs))
        if not await self.until(lambda: self.reported("ready", every), timeout):
            late = [r for r in every if "ready" not in self.events[r]]
            raise TimeoutError(f"ranks {late} did not report ready within {timeout:g} s")

    def kill(self, rank: int, signum: int) -> float:
        """Send ``signum`` to ``rank``'s process; the time it was sent (also appended to :attr:`faults`)."""
        t = time.time()
        self.faults.append(t)
        os.kill(self.procs[rank].pid, signum)
        return t

    async def close(self, *, grace: float = 0.0) -> None:
        """Give each process ``grace`` seconds to exit on its own, then kill (SIGCONT first) the rest; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if grace > 0:
                for p in self.procs:
                    try:
                        await asyncio.wait_for(p.wait(), grace)
                    except TimeoutError:
                        pass
        finally:
            for p in self.procs:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
            for p in self.procs:
                await p.wait()
            for t in self._readers:
                t.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)
