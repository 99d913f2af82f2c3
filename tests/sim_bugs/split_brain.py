"""Split brain: a standby promotes itself when the leader's heartbeats stop; the leader never learns.

Rank 0 leads: it appends to a shared log and sends a heartbeat to the
standby (rank 1) every 0.1 s. The standby takes over after 0.35 s without
one. Cut the leader -> standby direction (a one-way partition) and both
write. The fix: an epoch in the log itself; taking over bumps it, and a
write with an older epoch is refused (the old leader steps down).
"""

from __future__ import annotations

import asyncio

import numpy as np

import aiodist
from aiodist.errors import AiodistError

HEARTBEAT = 0.1
TAKEOVER = 0.35
END = 2.0  # virtual seconds of service
TAG = 3


async def _append(store: aiodist.TCPStore, me: int, epoch: int, fenced: bool) -> bool:
    """Add one entry ``me`` to the log; False if a newer epoch took the log (only when ``fenced``)."""
    if not fenced:
        await store.append("log", f" {me}")
        return True
    while True:
        current = (await store.get("log")).decode()
        head, _, entries = current.partition("|")
        if int(head) > epoch:
            return False
        new = f"{epoch}|{entries} {me}"
        if (await store.compare_set("log", current, new)).decode() == new:
            return True


async def _take_over(store: aiodist.TCPStore, fenced: bool) -> int:
    if not fenced:
        return 1
    while True:
        current = (await store.get("log")).decode()
        head, _, entries = current.partition("|")
        new = f"{int(head) + 1}|{entries}"
        if (await store.compare_set("log", current, new)).decode() == new:
            return int(head) + 1


async def _lead(store: aiodist.TCPStore, me: int, epoch: int, fenced: bool, beat: bool) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < END:
        if not await _append(store, me, epoch, fenced):
            return  # deposed
        if beat:
            try:
                await aiodist.send(np.ones(1), dst=1, tag=TAG, timeout=1.0)
            except (AiodistError, TimeoutError):
                pass  # the standby's business
        await asyncio.sleep(HEARTBEAT)


async def _stand_by(store: aiodist.TCPStore, fenced: bool) -> None:
    loop = asyncio.get_running_loop()
    buf = np.zeros(1)
    while loop.time() < END:
        try:
            await asyncio.wait_for(aiodist.recv(buf, src=0, tag=TAG), TAKEOVER)
        except (TimeoutError, AiodistError):  # silence, or the leader was declared failed: take over
            epoch = await _take_over(store, fenced)
            await _lead(store, 1, epoch, fenced, beat=False)
            return


async def _run(fenced: bool) -> str:
    pg = await aiodist.init_process_group()
    store = pg.store
    if pg.rank == 0:
        await store.set("log", "1|" if fenced else "")
    # Start together (through the store, as everything else here: a partition only delays it).
    if await store.add("ready", 1) == pg.size:
        await store.set("go", "1")
    await store.wait(["go"])
    if pg.rank == 0:
        await _lead(store, 0, 1, fenced, beat=True)
    elif pg.rank == 1:
        await _stand_by(store, fenced)
    await store.add("done", 1)
    log = ""
    if pg.rank == 0:
        while int(await store.add("done", 0)) < pg.size:
            await asyncio.sleep(0.05)
        log = (await store.get("log")).decode().partition("|")[2] if fenced else (await store.get("log")).decode()
        writers = log.split()
        if "1" in writers and "0" in writers[writers.index("1"):]:
            raise AssertionError(f"two leaders wrote: the old one after the new one ({' '.join(writers)})")
        await store.set("checked", "1")
        while int(await store.add("left", 0)) < pg.size - 1:  # (the store lives on this rank)
            await asyncio.sleep(0.05)
    else:
        await store.wait(["checked"], timeout=60)
        await store.add("left", 1)
    await aiodist.destroy_process_group()
    return log


async def buggy() -> str:
    return await _run(fenced=False)


async def fixed() -> str:
    return await _run(fenced=True)
