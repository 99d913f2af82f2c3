"""Restart amnesia: a worker keeps its progress in memory; restarted, it does its jobs again.

Workers connect to the job's store (rank 0 hosts it, as with ``env://``) and
no process group, so a restarted worker simply comes back and carries on
(``AIODIST_RESTART_COUNT`` tells it it was restarted).
"""

from __future__ import annotations

import asyncio

import aiodist
from aiodist.context import getenv

JOBS = 6


async def _connect() -> tuple[aiodist.TCPStore, aiodist.StoreServer | None, int, int]:
    rank, n = int(getenv("RANK") or 0), int(getenv("WORLD_SIZE") or 1)
    host, port = getenv("MASTER_ADDR") or "127.0.0.1", int(getenv("MASTER_PORT") or 29500)
    server = await aiodist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await aiodist.TCPStore.connect(host, port, timeout=60)
    return store, server, rank, n


async def _run(durable: bool) -> int:
    store, server, rank, n = await _connect()
    try:
        start = int(await store.add(f"progress/{rank}", 0)) if durable else 0
        for job in range(start, JOBS):
            await asyncio.sleep(0.01)  # the job's work
            if durable:  # the job's result under its own key: doing it twice changes nothing
                await store.set(f"result/{rank}/{job}", "1")
                await store.add(f"progress/{rank}", 1)
            else:
                await store.add("results", 1)
        await store.set(f"finished/{rank}", "1")  # (a key per rank: a restart may say it twice)
        if rank == 0:
            await store.wait([f"finished/{r}" for r in range(n)], timeout=60)
            if durable:
                total = sum([await store.check([f"result/{r}/{j}"]) for r in range(n) for j in range(JOBS)])
            else:
                total = int(await store.add("results", 0))
            if total != n * JOBS:
                raise AssertionError(f"{total} results for {n * JOBS} jobs: work was done twice")
            await store.set("checked", "1")
            await store.wait([f"left/{r}" for r in range(1, n)], timeout=60)  # the store lives here
        else:
            await store.wait(["checked"], timeout=60)
            await store.set(f"left/{rank}", "1")
        return rank
    finally:
        await store.close()
        if server is not None:
            await server.close()


async def buggy() -> int:
    return await _run(durable=False)


async def fixed() -> int:
    return await _run(durable=True)
