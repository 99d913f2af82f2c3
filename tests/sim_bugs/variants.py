"""Second programs of a few bug classes, written differently from the first ones (see CATALOG/VARIANTS)."""

from __future__ import annotations

import asyncio
import json

import numpy as np

import aiodist
from aiodist.context import getenv


# --------------------------------------------------------------------------- lost update: a JSON ledger


async def _ledger(atomic: bool) -> int:
    """Each rank books two payments into a JSON ledger kept under one key (read, modify, write it back)."""
    pg = await aiodist.init_process_group()
    store = pg.store
    if pg.rank == 0:
        await store.set("ledger", json.dumps([]))
    await aiodist.barrier()
    for k in range(2):
        entry = f"{pg.rank}.{k}"
        if atomic:
            while True:
                old = await store.get("ledger")
                new = json.dumps(json.loads(old) + [entry]).encode()
                if bytes(await store.compare_set("ledger", old, new)) == new:
                    break
        else:
            ledger = json.loads(await store.get("ledger"))
            ledger.append(entry)
            await store.set("ledger", json.dumps(ledger))
        await asyncio.sleep(0.002)
    await aiodist.barrier()
    booked = json.loads(await store.get("ledger"))
    await aiodist.destroy_process_group()
    if len(booked) != 2 * pg.size:
        raise AssertionError(f"{len(booked)} of {2 * pg.size} payments are in the ledger")
    return len(booked)


async def ledger_buggy() -> int:
    return await _ledger(atomic=False)


async def ledger_fixed() -> int:
    return await _ledger(atomic=True)


# --------------------------------------------------------------------------- check-then-act: a lock flag


async def _lock(atomic: bool) -> int:
    """A 'lock' taken by checking a flag key and then setting it; the holder bumps a shared count."""
    pg = await aiodist.init_process_group()
    store = pg.store
    me = str(pg.rank).encode()
    await aiodist.barrier()
    for _ in range(2):
        while True:
            if atomic:
                if bytes(await store.compare_set("lock", b"", me)) == me:
                    break
            elif not await store.check(["lock"]):
                await store.set("lock", me)
                break
            await asyncio.sleep(0.001)
        inside = int(await store.add("inside", 1))
        if inside != 1:
            raise AssertionError(f"{inside} ranks hold the lock at once")
        await asyncio.sleep(0.001)
        await store.add("inside", -1)
        await store.delete_key("lock")
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return pg.rank


async def lock_buggy() -> int:
    return await _lock(atomic=False)


async def lock_fixed() -> int:
    return await _lock(atomic=True)


# --------------------------------------------------------------------------- any-source: gather of replies


async def _gather(by_source: bool) -> list[int]:
    """Rank 0 asks every worker; workers 1.. reply, the higher ranks after checking a config key first;
    rank 0 assumes replies come back in rank order."""
    pg = await aiodist.init_process_group()
    store = pg.store
    if pg.rank == 0:
        await store.set("config", "fast")
    await aiodist.barrier()
    order: list[int] = []
    if pg.rank == 0:
        buf = np.zeros(1)
        for r in range(1, pg.size):
            await aiodist.recv(buf, src=r if by_source else None, tag=1)
            order.append(int(buf[0]))
        if order != list(range(1, pg.size)):
            raise AssertionError(f"replies in order {order}, assumed rank order")
    else:
        for _ in range(pg.rank - 1):  # the later the rank, the more it asks the store first
            await store.get("config")
        await aiodist.send(np.full(1, float(pg.rank)), dst=0, tag=1)
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return order


async def gather_buggy() -> list[int]:
    return await _gather(by_source=False)


async def gather_fixed() -> list[int]:
    return await _gather(by_source=True)


# --------------------------------------------------------------------------- restart amnesia: appends


async def _journal(durable: bool) -> int:
    """Each worker appends its chunks to one journal key; progress is a local counter (or kept in the store)."""
    rank, n = int(getenv("RANK") or 0), int(getenv("WORLD_SIZE") or 1)
    host, port = getenv("MASTER_ADDR") or "127.0.0.1", int(getenv("MASTER_PORT") or 29500)
    server = await aiodist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await aiodist.TCPStore.connect(host, port, timeout=60)
    chunks = 5
    try:
        if rank != 0:
            nxt = int(await store.add(f"next/{rank}", 0)) if durable else 0
            while nxt < chunks:
                await asyncio.sleep(0.005)
                if durable:  # claim the chunk first: once claimed, a restart does not append it again
                    claimed = int(await store.add(f"next/{rank}", 1))
                    if claimed - 1 != nxt:
                        nxt = claimed
                        continue
                await store.append("journal", f"{rank}:{nxt},")
                nxt += 1
            await store.set(f"done/{rank}", "1")  # (a key per worker: a restart may say it twice)
            await store.wait(["checked"], timeout=60)
            await store.set(f"left/{rank}", "1")
            return rank
        await store.wait([f"done/{r}" for r in range(1, n)], timeout=60)
        entries = [e for e in (await store.get("journal")).decode().split(",") if e]
        if len(entries) != len(set(entries)):
            raise AssertionError(f"chunks appended twice: {sorted(e for e in entries if entries.count(e) > 1)}")
        await store.set("checked", "1")
        await store.wait([f"left/{r}" for r in range(1, n)], timeout=60)  # the store lives here
        return len(entries)
    finally:
        await store.close()
        if server is not None:
            await server.close()


async def journal_buggy() -> int:
    return await _journal(durable=False)


async def journal_fixed() -> int:
    return await _journal(durable=True)
