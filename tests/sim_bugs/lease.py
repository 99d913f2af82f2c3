"""A lease (a lock with a timeout) and no fencing token: a holder that stalls writes after losing it."""

from __future__ import annotations

import asyncio

import aiodist

TTL = 0.3  # seconds a lease lasts; an expired one may be taken over
JOBS = 3


async def _acquire(store: aiodist.TCPStore, me: str) -> str:
    loop = asyncio.get_running_loop()
    while True:
        mine = f"{me} {loop.time() + TTL:.6f}"
        current = (await store.compare_set("lease", "free", mine)).decode()
        if current == mine:
            return mine
        owner, expiry = current.split()
        if float(expiry) < loop.time():  # the holder is gone or too slow: take it over
            if (await store.compare_set("lease", current, mine)).decode() == mine:
                return mine
        await asyncio.sleep(0.02)


async def _release(store: aiodist.TCPStore, mine: str) -> None:
    await store.compare_set("lease", mine, "free")


async def _run(fenced: bool) -> int:
    pg = await aiodist.init_process_group()
    store = pg.store
    me = str(pg.rank)
    if pg.rank == 0:
        await store.set("lease", "free")
        await store.set("balance", "0 0")  # "<fencing token> <value>"
    await aiodist.barrier()
    done = 0
    while done < JOBS:
        mine = await _acquire(store, me)
        token = int(await store.add("fence", 1)) if fenced else 0
        current = await store.get("balance")
        last_token, value = (int(x) for x in current.split())
        await asyncio.sleep(0.05)  # the work done under the lease
        new = f"{token} {value + 1}"
        if not fenced:
            await store.set("balance", new)
            done += 1
        elif last_token <= token and (await store.compare_set("balance", current, new)).decode() == new:
            done += 1  # (otherwise a newer holder wrote meanwhile: this one lost its lease; do it again)
        await _release(store, mine)
    await aiodist.barrier()
    value = int((await store.get("balance")).split()[1])
    await aiodist.destroy_process_group()
    if value != JOBS * pg.size:
        raise AssertionError(f"balance is {value}, expected {JOBS * pg.size}: two holders overlapped")
    return value


async def buggy() -> int:
    return await _run(fenced=False)


async def fixed() -> int:
    return await _run(fenced=True)
