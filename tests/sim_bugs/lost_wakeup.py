"""Lost wake-up: a consumer reads the counter, then clears the doorbell, then sleeps on it."""

from __future__ import annotations

import asyncio

import aiodist

ITEMS = 6


async def _consumer(store: aiodist.TCPStore, clear_first: bool) -> int:
    seen = 0
    while seen < ITEMS:
        if clear_first:
            await store.delete_key("doorbell")
            available = int(await store.add("produced", 0))
        else:
            available = int(await store.add("produced", 0))
            await store.delete_key("doorbell")  # a ring between the read and here is lost
        if available > seen:
            seen = available
            continue
        await store.wait(["doorbell"], timeout=10)
    return seen


async def _producer(store: aiodist.TCPStore) -> int:
    for _ in range(ITEMS):
        await asyncio.sleep(0.003)
        await store.add("produced", 1)
        await store.set("doorbell", "1")
    return ITEMS


async def _run(clear_first: bool) -> int:
    pg = await aiodist.init_process_group()
    await aiodist.barrier()
    got = await (_consumer(pg.store, clear_first) if pg.rank == 0 else _producer(pg.store))
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return got


async def buggy() -> int:
    return await _run(clear_first=False)


async def fixed() -> int:
    return await _run(clear_first=True)
