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


# --------------------------------------------------------------------------- lost wake-up: a remote consumer


async def _remote_wakeup(clear_first: bool) -> int:
    """Rank 0 only hosts the store; rank 1 consumes what rank 2 produces, waking on a flag it clears."""
    pg = await aiodist.init_process_group()
    store = pg.store
    await aiodist.barrier()
    got = 0
    if pg.rank == 1:
        while got < 5:
            if clear_first:
                await store.delete_key("ring")
            produced = int(await store.add("n", 0))
            if not clear_first:
                await store.delete_key("ring")  # a ring between the count and here is lost
            if produced > got:
                got = produced
                continue
            await store.wait(["ring"], timeout=10)
    elif pg.rank == 2:
        for _ in range(5):
            await asyncio.sleep(0.004)
            await store.add("n", 1)
            await store.set("ring", "1")
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return got


async def remote_wakeup_buggy() -> int:
    return await _remote_wakeup(clear_first=False)


async def remote_wakeup_fixed() -> int:
    return await _remote_wakeup(clear_first=True)


# --------------------------------------------------------------------------- tight timeout: request and reply


async def _ask(numbered: bool) -> list[int]:
    """Rank 0 asks rank 1 a question per round and waits 30 ms for the answer, else asks the next one;
    rank 1 looks the answer up in the store first. A late answer is taken for the next question's."""
    pg = await aiodist.init_process_group()
    store = pg.store
    if pg.rank == 1:
        await store.set("table", "ok")
    await aiodist.barrier()
    answers: list[int] = []
    buf = np.zeros(1)
    for q in range(6):
        if pg.rank == 0:
            await aiodist.send(np.full(1, float(q)), dst=1, tag=1)
            while True:
                try:
                    await aiodist.recv(buf, src=1, tag=2, timeout=0.03)
                except TimeoutError:
                    answers.append(-1)
                    break
                if numbered and int(buf[0]) != q:
                    continue  # a late answer to an earlier question: skip it
                if int(buf[0]) != q:
                    raise AssertionError(f"question {q} got the answer to question {int(buf[0])}")
                answers.append(q)
                break
        else:
            await aiodist.recv(buf, src=0, tag=1)
            await store.get("table")
            await aiodist.send(buf.copy(), dst=0, tag=2)
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return answers


async def ask_buggy() -> list[int]:
    return await _ask(numbered=False)


async def ask_fixed() -> list[int]:
    return await _ask(numbered=True)


# --------------------------------------------------------------------------- split brain: heartbeats in the store


async def _store_leader(fenced: bool) -> str:
    """Rank 1 leads, beating a counter in the store; rank 2 takes over after 0.35 s without a beat.
    Both append to a log; with ``fenced`` a takeover bumps the log's epoch and the old leader's
    appends are refused."""
    pg = await aiodist.init_process_group()
    store = pg.store
    loop = asyncio.get_running_loop()
    end = loop.time() + 2.0
    if pg.rank == 0:
        await store.set("log", "1|")
    await aiodist.barrier()

    async def append(me: int, epoch: int) -> bool:
        while True:
            current = (await store.get("log")).decode()
            head, _, entries = current.partition("|")
            if fenced and int(head) > epoch:
                return False
            new = f"{head if not fenced else epoch}|{entries} {me}"
            if (await store.compare_set("log", current, new)).decode() == new:
                return True

    if pg.rank == 1:
        beat = 0
        while loop.time() < end and await append(1, 1):
            beat += 1
            await store.set("beat", str(beat))
            await asyncio.sleep(0.1)
    elif pg.rank == 2:
        last, seen_at = b"", loop.time()
        while loop.time() < end:
            await asyncio.sleep(0.1)
            beat = await store.get("beat") if await store.check(["beat"]) else b""
            if beat != last:
                last, seen_at = beat, loop.time()
            elif loop.time() - seen_at > 0.35:  # silence: take over
                epoch = 2
                if fenced:
                    while True:
                        current = (await store.get("log")).decode()
                        head, _, entries = current.partition("|")
                        if (await store.compare_set("log", current, f"{epoch}|{entries}")).decode() == f"{epoch}|{entries}":
                            break
                while loop.time() < end and await append(2, epoch):
                    await asyncio.sleep(0.1)
                break
    await store.add("done", 1)
    log = ""
    if pg.rank == 0:
        await store.wait(["done"], timeout=60)
        while int(await store.add("done", 0)) < pg.size:
            await asyncio.sleep(0.05)
        log = (await store.get("log")).decode().partition("|")[2]
        writers = log.split()
        if "2" in writers and "1" in writers[writers.index("2"):]:
            raise AssertionError(f"two leaders wrote: the old one after the new one ({log.strip()})")
        await store.set("checked", "1")
        await store.wait([f"left/{r}" for r in range(1, pg.size)], timeout=60)
    else:
        await store.wait(["checked"], timeout=60)
        await store.set(f"left/{pg.rank}", "1")
    await aiodist.destroy_process_group()
    return log


async def store_leader_buggy() -> str:
    return await _store_leader(fenced=False)


async def store_leader_fixed() -> str:
    return await _store_leader(fenced=True)
