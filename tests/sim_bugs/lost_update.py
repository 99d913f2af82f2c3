"""Lost update: every rank adds its contributions to a shared total with get-then-set."""

from __future__ import annotations

import aiodist

ROUNDS = 3


async def _run(atomic: bool) -> int:
    pg = await aiodist.init_process_group()
    store = pg.store
    if pg.rank == 0:
        await store.set("total", "0")
    await aiodist.barrier()
    for _ in range(ROUNDS):
        if atomic:
            await store.add("total", 1)
        else:
            value = int(await store.get("total"))  # read ...
            await store.set("total", str(value + 1))  # ... then write: another rank may have written meanwhile
    await aiodist.barrier()
    total = int(await store.get("total"))
    await aiodist.destroy_process_group()
    if total != ROUNDS * pg.size:
        raise AssertionError(f"total is {total}, expected {ROUNDS * pg.size}: an update was lost")
    return total


async def buggy() -> int:
    return await _run(atomic=False)


async def fixed() -> int:
    return await _run(atomic=True)
