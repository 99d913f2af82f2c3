"""A program that fails only when two faults coincide: rank 1 stalls while rank 2 sees the store slow.

Neither alone breaks it (tests/test_sim_shrink.py: a plan of ten faults shrinks to those two).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiodist
from aiodist.context import getenv


async def main() -> Any:
    """Fails only if rank 1 stalls while rank 2 sees the store slow: neither alone does it."""
    rank = int(getenv("RANK") or 0)
    port = int(getenv("MASTER_PORT") or 0)
    server = await aiodist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await aiodist.TCPStore.connect(getenv("MASTER_ADDR") or "", port, timeout=30)
    loop = asyncio.get_running_loop()
    marks: list[float] = []
    for _ in range(40):
        t0 = loop.time()
        if rank == 1:
            await asyncio.sleep(0.05)
        elif rank == 2:
            await store.add("x", 0)
            await asyncio.sleep(0.04)
        else:
            await asyncio.sleep(0.05)
        if loop.time() - t0 > 0.2:  # a stall (rank 1) or a very slow store round trip (rank 2)
            marks.append(round(t0, 3))
    await store.set(f"marks/{rank}", " ".join(map(str, marks)))
    if rank == 0:
        got = await store.multi_get([f"marks/{r}" for r in (1, 2)])
        stalls, slow = ([float(x) for x in g.split()] for g in got)
        if any(abs(a - b) < 0.5 for a in stalls for b in slow):
            raise AssertionError("rank 1 stalled while rank 2's store was slow")
    await store.add("left", 1)
    if server is not None:
        while int(await store.add("left", 0)) < 3:
            await asyncio.sleep(0.01)
    await store.close()
    if server is not None:
        await server.close()
    return rank
