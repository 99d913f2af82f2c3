"""What a foreign process of the same user on this machine does to a job: the attacks' tools.

Shared by tests/test_attacks.py, tests/test_tls.py, benchmarks/security_bench.py
and benchmarks/fuzz.py: a default ``aiodist run`` job to attack (:class:`Job`),
the environment of a process without the job's secret (:func:`child_env`), a
man in the middle (:class:`Relay`), one rank that prints its listener's address
(:data:`LISTENING_RANK`), and a process's resident memory (:func:`rss`,
:func:`rss_growth`). Benchmarks import it with ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from rank_procs import free_port

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[1]

JOB = """\
import asyncio, os, sys
import numpy as np
import aiodist as dist

async def main():
    pg = await dist.init_process_group(timeout=30)
    addr = (await pg.store.get(f"aiodist/0/addr/{pg.rank}")).decode()
    print("ready", pg.rank, os.getpid(), addr, pg.job_id, flush=True)
    while not os.path.exists(sys.argv[1]):
        await asyncio.sleep(0.02)
    base = np.arange(4096, dtype=np.float64)
    wrong = 0
    for i in range(int(sys.argv[2])):
        x = base * (pg.rank + 1) + i
        await dist.all_reduce(x)
        wrong += int(not np.array_equal(x, base * 3 + 2 * i))
    print("wrong", wrong, flush=True)
    await dist.destroy_process_group()

asyncio.run(main())
"""
"""Each rank: prints ``ready RANK PID LISTEN-ADDRESS JOB-ID``, waits for the go file (argv[1]), then
computes argv[2] float64 all_reduces and prints ``wrong N``, how many of them came out wrong (2 ranks)."""

LISTENING_RANK = """\
import asyncio, os
import aiodist as dist
async def main():
    pg = await dist.init_process_group(timeout=60)
    print((await pg.store.get("aiodist/0/addr/0")).decode(), flush=True)
    await asyncio.sleep(1e9)
asyncio.run(main())
"""
"""A one-rank job (RANK, WORLD_SIZE, MASTER_* from the environment) that prints its listener's address and idles."""


def child_env(tree: str | Path = ROOT, **extra: str) -> dict[str, str]:
    """This environment without the job's secret (nor an opt-out of authentication), importing aiodist from ``tree``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIODIST_SECRET") and k != "AIODIST_INSECURE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


class Job:
    """A ``python -m aiodist run`` of :data:`JOB` (in ``folder``), whose ranks wait for a go file once ready.

    ``ready``: rank -> (pid, listen address, job id). Starting blocks until every rank is ready (30 s at most).
    """

    def __init__(self, folder: Path, n: int, *options: str, iterations: int = 50, tree: str | Path = ROOT) -> None:
        (folder / "job.py").write_text(JOB)
        self.go = folder / "go"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aiodist", "run", "-n", str(n), "--master-port", str(self.port), *options,
             "job.py", str(self.go), str(iterations)],
            cwd=folder, env=child_env(tree), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.ready: dict[int, tuple[int, str, str]] = {}
        deadline = time.monotonic() + 30
        assert self.proc.stdout is not None
        while len(self.ready) < n and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            words = line.split()
            if "ready" in words:
                rank, pid, addr, job_id = words[words.index("ready") + 1 :][:4]
                self.ready[int(rank)] = (int(pid), addr, job_id)
        assert len(self.ready) == n, self.finish(5)

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        """Let the ranks go; (exit code, stdout, stderr) of the launcher (killed after ``timeout`` seconds)."""
        self.go.touch()
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return self.proc.returncode, out, err


class Relay:
    """A man in the middle on 127.0.0.1: forwards every byte both ways between whoever connects and ``target``.

    ``seen`` holds what it forwarded (both ways, in order of arrival); a
    subclass changes what goes through by overriding :meth:`alter`.
    ``async with Relay(target) as port:`` listens while inside (else
    :meth:`start` and :meth:`close`).
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = bytearray()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen on a free port of 127.0.0.1; the port."""
        self.server = await asyncio.start_server(self._serve, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop listening (connections being relayed go on until either end closes)."""
        if self.server is not None:
            self.server.close()

    async def __aenter__(self) -> int:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            tr, tw = await asyncio.open_connection(*self.target)
        except OSError:
            w.close()
            return
        await asyncio.gather(self.pipe(r, tw), self.pipe(tr, w), return_exceptions=True)

    async def pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        """Forward what ``r`` reads to ``w`` until either end closes; then close ``w``."""
        try:
            while data := await r.read(65536):
                data = self.alter(data)
                self.seen += data
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    def alter(self, data: bytes) -> bytes:
        """What goes on of ``data`` just read (``seen`` holds what went through before it): all of it, unchanged."""
        return data


def rss(pid: int) -> int:
    """The resident memory of process ``pid`` in bytes; 0 if it has none (it exited and was not reaped yet)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def rss_growth(pid: int, port: int, data: bytes, *, connections: int = 8, settle: float = 1.0) -> int:
    """How much process ``pid``'s memory grows while ``connections`` connections to ``port`` each sent ``data``.

    Measured ``settle`` seconds after the last one sent; then they are closed.
    A process without memory (gone) is an error, not a growth of zero.
    """
    before = rss(pid)
    socks = []
    try:
        for _ in range(connections):
            s = socket.create_connection((HOST, port))
            socks.append(s)
            s.sendall(data)
        await asyncio.sleep(settle)
        after = rss(pid)
    finally:
        for s in socks:
            s.close()
    if not (before and after):
        raise RuntimeError(f"process {pid} has no resident memory: it is gone")
    return after - before
