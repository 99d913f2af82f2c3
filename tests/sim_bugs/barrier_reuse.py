"""A store-based barrier reused without generations: the last one out resets it for the next use."""

from __future__ import annotations

import asyncio

import aiodist

STEPS = 4


async def _barrier(store: aiodist.TCPStore, n: int, name: str) -> None:
    if await store.add(f"{name}/arrived", 1) == n:
        await store.set(f"{name}/open", "1")
    await store.wait([f"{name}/open"], timeout=10)
    if await store.add(f"{name}/left", 1) == n:  # the last one out resets it for the next use
        await store.delete_key(f"{name}/arrived")
        await store.delete_key(f"{name}/left")
        await store.delete_key(f"{name}/open")


async def _run(generations: bool) -> int:
    pg = await aiodist.init_process_group()
    store = pg.store
    n = pg.size
    await aiodist.barrier()
    for step in range(STEPS):
        await asyncio.sleep(0.001 * pg.rank)  # some work
        await store.add(f"done/{step}", 1)
        await _barrier(store, n, f"sync/{step}" if generations else "sync")
        finished = int(await store.add(f"done/{step}", 0))
        if finished != n:
            raise AssertionError(f"step {step}: passed the barrier with {finished} of {n} ranks done")
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return STEPS


async def buggy() -> int:
    return await _run(generations=False)


async def fixed() -> int:
    return await _run(generations=True)
