"""Fourth blind set: ten bug programs, one per class of issue 12, each with its fixed twin.

Written from the public docs only (README.md, sim/README.md, /work/shared/API.md, examples/,
docstrings), without reading the other programs of tests/sim_bugs or the simulator's source (of
blind_c.py only its layout: ``_twins`` and the tables at the end). ``<name>`` raises when its bug
bites (SYMPTOM: the exception type and a marker its message holds); ``<name>_fixed`` runs the same
body, the fix being the lines under ``if fixed``. The programs: (1) data-loader tasks (two per
rank) updating a JSON stats record in the store, (2) one dataset downloader per node elected in
subgroups of two, the verdict checked with ``all_gather_object``, (3) checkpoint mergers taking a
store lease (a TTL in the lock value) and writing parts to a storage rank over p2p, (4) an
evaluator woken by a doorbell when trainers publish checkpoints, (5) a tokenizer rank relaying
batches stamped with the vocabulary version a coordinator pushes to both it and the trainer,
(6) a table reader taking the first any-source object as the schema while the other sender looks
its offsets up in the store, (7) a learner receiving rollouts with a 20 ms timeout per round,
(8) per-epoch evaluation scores behind a store barrier reset by its last arrival, (9) tokenizer
workers on a standalone store, whose output (a journal) survives a restart but whose progress
does not, (10) a primary/standby log writer pair, heartbeats rank 1 -> 2 over p2p, the log in
rank 0's store.

Measured on ca1beca, and again after a lint-only cleanup (same numbers, seed by seed) (``sim.run(prog, world_size=WORLD[name], seed=s, trace=False, **run)``, seeds
0..199). bug: runs failing with SYMPTOM; other: runs failing another way; fixed timing: the same
with ``explore=False``.

| program | W | run | first bug seed | bug of 200 | other of 200 | fixed timing: bug of 200 (first) |
|---|---:|---|---:|---:|---:|---:|
| lost_update | 3 | defaults | 0 | 200 | 0 | 200 (0) |
| check_then_act | 4 | defaults | 0 | 157 | 0 | 199 (0) |
| lease | 4 | defaults | 0 | 29 | 0 | 0 |
| lost_wakeup | 4 | defaults | 11 | 29 | 0 | 0 |
| causal_order | 3 | defaults | 3 | 66 | 0 | 27 (15) |
| any_source | 3 | defaults | 4 | 33 | 0 | 0 |
| tight_timeout | 3 | defaults | 2 | 65 | 0 | 0 |
| barrier_reuse | 4 | defaults | 1 | 132 | 0 | 8 (34) |
| restart_amnesia | 4 | defaults | - | 0 | 0 | |
| restart_amnesia | 4 | Swarm() | 29 | 9 | 86 (a) | 10 (29) |
| restart_amnesia | 4 | Swarm(kinds={"restart"}) | 2 | 74 | 0 | |
| split_brain | 3 | defaults | 0 | 58 | 0 | |
| split_brain | 3 | Swarm() | 0 | 17 | 150 (b) | 6 (3) |
| split_brain | 3 | Swarm(kinds={"partition"}) | 5 | 77 | 0 | |

Twins, failures of seeds 0..99 under the defaults: 0 for all ten. Under the swarm restricted to their
kind: restart_amnesia_fixed 0 of 200 (seeds 0..199), split_brain_fixed 0 of 200. For information,
under ``Swarm()`` (kinds they do not claim to tolerate): 55 and 73 of 100 fail, none with SYMPTOM.

split_brain is found under the defaults too: its promotion deadline (0.4 s of heartbeat silence) is
far tighter than aiodist's failure detector, and exploration's pauses and clogs of the link 1 -> 2
reach it (sim/README.md: "a program with tighter timeouts of its own ... is perturbed past them").
Under ``Swarm()`` its first find (seed 0) is a one-way partition {1} -> {0, 2} of 0.23 s on top of
exploration; seed 3: two clogs of the link 1 -> 2.

(a) the store, crash and pause kinds: StoreConnectionLost 64, StoreTimeoutError 18 (a crashed
    worker never reports), StoreConnectTimeoutError 4.
(b) the store, crash and pause kinds: RendezvousError 63, PeerFailureError 54, StoreConnectionLost
    22, RendezvousTimeoutError 7, EvictedError 3, StoreTimeoutError 1.

Changed after the first measurement (the programs, not for the simulator's sake): restart_amnesia's
twin was itself buggy. It resumed from its journal but committed with ``append``; under
``Swarm(kinds={"restart"})`` seeds 39 and 96 (of 100) restarted a worker right after it sent an
append, and that frame of the dead process reached the store 6 ms later (a latency tail), after the
new process had read the journal: the shard was tokenized and written twice - as it can be for real
(TCP delivers a killed process's last bytes). The twin now commits each shard with compare_set on
the journal (exactly once); the bug is untouched. Its exit also waits for every worker to leave before
the store closes (seed 74 under the defaults: a worker paused past the coordinator's fixed 0.5 s
grace lost the store: StoreConnectionLost, an "other" failure of the buggy program).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from datetime import timedelta
from typing import Any

import numpy as np

import aiodist as dist

from .twins import twins as _twins


# ---------------------------------------------------------------- helpers


async def _init() -> tuple[int, int, dist.Store]:
    """torch-style start (env://); the rank, the world size and the group's store for our own keys."""
    pg = await dist.init_process_group("gloo", "env://", timeout=timedelta(seconds=60))
    store: dist.Store = pg.store
    return pg.rank, pg.size, store


async def _finish() -> None:
    await dist.barrier()
    await dist.destroy_process_group()


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# ---------------------------------------------------------------- 1. lost update: loader stats

STATS = "loader/stats"
LOADERS = 2  # asyncio tasks per rank
BATCHES = 6  # per loader


def _batch_tokens(rank: int, loader: int, i: int) -> int:
    return 100 + 10 * rank + 3 * loader + i


async def _loader_stats(fixed: bool) -> dict[str, Any]:
    rank, world, store = await _init()
    if rank == 0:
        await store.set(STATS, json.dumps({"batches": 0, "tokens": 0, "last": ""}))
    await dist.barrier()

    async def record(loader: int, i: int) -> None:
        tokens = _batch_tokens(rank, loader, i)
        if fixed:
            while True:  # optimistic update: retry when someone else wrote in between
                raw = await store.get(STATS)
                stats = json.loads(raw)
                stats["batches"] += 1
                stats["tokens"] += tokens
                stats["last"] = f"{rank}/{loader}/{i}"  # makes our value unique
                new = json.dumps(stats).encode()
                if await store.compare_set(STATS, raw, new) == new:
                    return
        stats = json.loads(await store.get(STATS))
        stats["batches"] += 1
        stats["tokens"] += tokens
        stats["last"] = f"{rank}/{loader}/{i}"
        await store.set(STATS, json.dumps(stats))

    async def loader(loader: int) -> None:
        for i in range(BATCHES):
            await asyncio.sleep(0.002 * (1 + (rank + loader + i) % 3))  # read and decode a batch
            await record(loader, i)

    await asyncio.gather(*(loader(k) for k in range(LOADERS)))
    await dist.barrier()
    stats: dict[str, Any] = json.loads(await store.get(STATS))
    want = sum(_batch_tokens(r, k, i) for r in range(world) for k in range(LOADERS) for i in range(BATCHES))
    assert (stats["batches"], stats["tokens"]) == (world * LOADERS * BATCHES, want), (
        f"lost update: stats say {stats['batches']} batches / {stats['tokens']} tokens, "
        f"expected {world * LOADERS * BATCHES} / {want}")
    await _finish()
    return stats


lost_update, lost_update_fixed = _twins("lost_update", _loader_stats)


# ---------------------------------------------------------------- 2. check-then-act: a downloader per node


async def _node_downloader(fixed: bool) -> bool:
    rank, _, store = await _init()
    node, _ = await dist.new_subgroups(group_size=2)  # two "GPUs" per node
    assert node is not None
    key = f"node{rank // 2}/downloader"
    if fixed:
        won = await store.compare_set(key, b"", str(rank)) == str(rank).encode()
    else:
        won = False
        if not await store.check([key]):  # nobody is downloading yet: I will
            await store.set(key, str(rank))
            won = True
    if won:
        await asyncio.sleep(0.01)  # fetch the dataset to the node's disk
        await store.add(f"node{rank // 2}/downloads", 1)
    flags = await dist.all_gather_object(won, group=node)
    assert sum(flags) == 1, f"expected one downloader on node {rank // 2}, the node's ranks say {flags}"
    await _finish()
    return won


check_then_act, check_then_act_fixed = _twins("check_then_act", _node_downloader)


# ---------------------------------------------------------------- 3. lease without fencing: checkpoint merge

LOCK = "ckpt/merge_lock"
TTL = 0.25  # seconds a lease lasts; a merge takes ~0.1 s
PARTS = 4
JOBS = 2  # merges per rank
WRITE, ACK = 31, 32


async def _acquire(store: dist.Store, rank: int) -> int:
    """Take the lease; the lock's value is ``token:holder:expiry`` (holder -1: free). Returns the token."""
    while True:
        first = f"1:{rank}:{time.time() + TTL!r}"
        cur = await store.compare_set(LOCK, b"", first)
        if cur == first.encode():
            return 1
        token, holder, expiry = cur.decode().split(":")
        if int(holder) < 0 or time.time() > float(expiry):  # free, or its holder's lease ran out
            mine = f"{int(token) + 1}:{rank}:{time.time() + TTL!r}"
            if await store.compare_set(LOCK, cur, mine) == mine.encode():
                return int(token) + 1
        await asyncio.sleep(0.01)


async def _release(store: dist.Store, rank: int, token: int) -> None:
    cur = await store.get(LOCK)
    t, holder, _ = cur.decode().split(":")
    if int(t) == token and int(holder) == rank:
        await store.compare_set(LOCK, cur, f"{token}:-1:0")


async def _storage(world: int, fixed: bool) -> list[tuple[int, int, int]]:
    """Rank 0: the checkpoint storage. Accepts part writes ``[writer, token, part]``; ``[writer, -1, -1]``: bye."""
    accepted: list[tuple[int, int, int]] = []
    highest = 0
    byes = 0
    buf = _i64(0, 0, 0)
    while byes < world - 1:
        src = await dist.recv(buf, src=None, tag=WRITE)
        writer, token, part = (int(v) for v in buf)
        if token < 0:
            byes += 1
            continue
        ok = True
        if fixed:
            ok = token >= highest  # fencing: a write under an older lease is refused
        if ok:
            highest = max(highest, token)
            accepted.append((writer, token, part))
        await dist.send(_i64(int(ok)), dst=src, tag=ACK)
    tokens = [t for _, t, _ in accepted]
    for a, b in itertools.pairwise(accepted):
        assert b[1] >= a[1], (
            f"stale lease holder: rank {b[0]} wrote part {b[2]} under token {b[1]} after "
            f"rank {a[0]} wrote under token {a[1]} (tokens in order: {tokens})")
    return accepted


async def _merger(store: dist.Store, rank: int) -> int:
    ack = _i64(0)
    done = 0
    while done < JOBS:
        token = await _acquire(store, rank)
        ok = True
        for part in range(PARTS):
            await asyncio.sleep(0.02)  # serialize this part of the shard
            await dist.send(_i64(rank, token, part), dst=0, tag=WRITE)
            await dist.recv(ack, src=0, tag=ACK)
            if not ack[0]:
                ok = False  # fenced off: someone else holds the lease now; redo the merge later
                break
        await _release(store, rank, token)
        if ok:
            done += 1
        await asyncio.sleep(0.005)
    await dist.send(_i64(rank, -1, -1), dst=0, tag=WRITE)
    return done


async def _ckpt_merge(fixed: bool) -> Any:
    rank, world, store = await _init()
    await dist.barrier()
    out: Any = await _storage(world, fixed) if rank == 0 else await _merger(store, rank)
    await _finish()
    return out


lease, lease_fixed = _twins("lease", _ckpt_merge)


# ---------------------------------------------------------------- 4. lost wake-up: an evaluator's doorbell

PUBLISHED, BELL = "eval/published", "eval/doorbell"
CHECKPOINTS = 5  # per trainer


async def _evaluator(fixed: bool) -> int:
    rank, world, store = await _init()
    evaluator = world - 1
    await dist.barrier()
    if rank != evaluator:
        for i in range(CHECKPOINTS):
            await asyncio.sleep(0.01 * (1 + (rank + i) % 3))  # train a little
            await store.add(PUBLISHED, 1)
            await store.set(BELL, b"1")  # ring
        await _finish()
        return CHECKPOINTS
    total = (world - 1) * CHECKPOINTS
    evaluated = 0
    while evaluated < total:
        await store.wait([BELL], timeout=5.0)
        if fixed:
            await store.delete_key(BELL)  # clear first: a ring from now on is kept
        published = int(await store.get(PUBLISHED))
        for _ in range(evaluated, published):
            await asyncio.sleep(0.003)  # evaluate one checkpoint
        evaluated = published
        if not fixed:
            await store.delete_key(BELL)  # done with the bell
    await _finish()
    return evaluated


lost_wakeup, lost_wakeup_fixed = _twins("lost_wakeup", _evaluator)


# ---------------------------------------------------------------- 5. causal order: vocab pushes and a tokenizer

VOCAB, BATCH = 51, 52
VERSIONS = 8


async def _vocab(fixed: bool) -> int:
    rank, _, _ = await _init()
    await dist.barrier()
    if rank == 0:  # the coordinator pushes each new vocabulary version to the trainer and the tokenizer
        for v in range(1, VERSIONS + 1):
            works = [dist.isend(_i64(v), dst=2, tag=VOCAB), dist.isend(_i64(v), dst=1, tag=VOCAB)]
            for w in works:
                await w
            await asyncio.sleep(0.004)
    elif rank == 1:  # the tokenizer: each new vocabulary, a batch tokenized with it for the trainer
        buf = _i64(0)
        for _ in range(VERSIONS):
            await dist.irecv(buf, src=0, tag=VOCAB)
            await dist.isend(_i64(int(buf[0]), 1000 + int(buf[0])), dst=2, tag=BATCH)
    elif rank == 2:  # the trainer
        have = [0]
        changed = asyncio.Condition()

        async def follow_vocab() -> None:
            buf = _i64(0)
            for _ in range(VERSIONS):
                await dist.irecv(buf, src=0, tag=VOCAB)
                async with changed:
                    have[0] = int(buf[0])
                    changed.notify_all()

        follower = asyncio.create_task(follow_vocab())
        batch = _i64(0, 0)
        for _ in range(VERSIONS):
            await dist.irecv(batch, src=1, tag=BATCH)
            stamp = int(batch[0])
            if fixed:
                async with changed:  # the vocab comes from another sender: wait for it
                    while have[0] < stamp:
                        await changed.wait()
            assert have[0] >= stamp, (
                f"a batch tokenized with vocab {stamp} arrived before that vocab (trainer has {have[0]})")
        await follower
    await _finish()
    return rank


causal_order, causal_order_fixed = _twins("causal_order", _vocab)


# ---------------------------------------------------------------- 6. any-source: schema first, rows after store lookups

TABLE = 61


async def _table_reader(fixed: bool) -> int:
    rank, _, store = await _init()
    if rank == 0:
        await store.set("table/offset", b"4096")
        await store.set("table/length", b"128")
    await dist.barrier()
    if rank == 0:
        first: list[Any] = [None]
        rows: list[Any] = [None]
        if fixed:
            await dist.recv_object_list(first, src=1, tag=TABLE)
            await dist.recv_object_list(rows, src=2, tag=TABLE)
        else:  # whoever comes first: the schema owner sends at once, the row reader looks things up first
            await dist.recv_object_list(first, src=None, tag=TABLE)
            await dist.recv_object_list(rows, src=None, tag=TABLE)
        schema, data = first[0], rows[0]
        assert schema["kind"] == "schema", f"rows arrived before the schema: took {schema} for the schema"
        decoded = [dict(zip(schema["columns"], row, strict=True)) for row in data["rows"]]
        await _finish()
        return len(decoded)
    if rank == 1:
        await dist.send_object_list([{"kind": "schema", "columns": ["id", "len"]}], dst=0, tag=TABLE)
    elif rank == 2:
        offset = int(await store.get("table/offset"))
        length = int(await store.get("table/length"))
        rows = [[offset + i, length] for i in range(3)]
        await dist.send_object_list([{"kind": "rows", "rows": rows}], dst=0, tag=TABLE)
    await _finish()
    return 0


any_source, any_source_fixed = _twins("any_source", _table_reader)


# ---------------------------------------------------------------- 7. tight timeout: rollouts per round

WEIGHTS, ROLLOUT = 71, 72
ROUNDS = 12
ROLLOUT_TIMEOUT = 0.02  # a rollout takes ~4 ms: 20 ms "is plenty"


async def _rollouts(fixed: bool) -> int:
    rank, world, _ = await _init()
    await dist.barrier()
    actors = range(1, world)
    used = 0
    if rank == 0:  # the learner
        buf = _i64(0, 0)
        for r in range(ROUNDS):
            for w in [dist.isend(_i64(r), dst=a, tag=WEIGHTS) for a in actors]:
                await w
            for a in actors:
                try:
                    await dist.recv(buf, src=a, tag=ROLLOUT, timeout=ROLLOUT_TIMEOUT)
                    if fixed:
                        while buf[0] < r:  # a late rollout of an earlier round: drop it
                            await dist.recv(buf, src=a, tag=ROLLOUT, timeout=ROLLOUT_TIMEOUT)
                except TimeoutError:
                    continue  # actor too slow this round: go on without it
                assert buf[0] == r, f"rollout of round {buf[0]} used in round {r} (actor {a})"
                used += 1
        for w in [dist.isend(_i64(-1), dst=a, tag=WEIGHTS) for a in actors]:
            await w
        for a in actors:  # drain until each actor's goodbye
            while True:
                await dist.recv(buf, src=a, tag=ROLLOUT)
                if buf[0] < 0:
                    break
    else:
        weights = _i64(0)
        while True:
            await dist.recv(weights, src=0, tag=WEIGHTS)
            r = int(weights[0])
            if r < 0:
                await dist.send(_i64(-1, 0), dst=0, tag=ROLLOUT)
                break
            await asyncio.sleep(0.004)  # play an episode
            await dist.send(_i64(r, 10 * rank + r), dst=0, tag=ROLLOUT)
            used += 1
    await _finish()
    return used


tight_timeout, tight_timeout_fixed = _twins("tight_timeout", _rollouts)


# ---------------------------------------------------------------- 8. barrier reuse: per-epoch evaluation scores

EPOCHS = 6
BARRIER_TIMEOUT = 10.0


async def _store_barrier(store: dist.Store, world: int, epoch: int, fixed: bool) -> None:
    prefix = f"sync/{epoch}" if fixed else "sync"  # fixed: a generation per use
    n = await store.add(f"{prefix}/arrived", 1)
    if n == world:
        await store.set(f"{prefix}/open", b"1")
    try:
        await store.wait([f"{prefix}/open"], timeout=BARRIER_TIMEOUT)
    except TimeoutError:
        raise AssertionError(f"store barrier of epoch {epoch} never opened: an arrival was lost") from None
    if n == world:
        if fixed:  # every rank has left the previous generation's barrier: drop its keys
            await store.delete_key(f"sync/{epoch - 1}/arrived")
            await store.delete_key(f"sync/{epoch - 1}/open")
        else:  # reset for the next epoch
            await store.delete_key("sync/open")
            await store.set("sync/arrived", b"0")


async def _epoch_scores(fixed: bool) -> list[float]:
    rank, world, store = await _init()
    await dist.barrier()
    means = []
    for epoch in range(EPOCHS):
        await asyncio.sleep(0.001 * ((rank + epoch) % 3))  # evaluate this rank's shard
        await store.set(f"eval/{epoch}/{rank}", str(0.5 + 0.01 * rank + epoch))
        await _store_barrier(store, world, epoch, fixed)
        keys = [f"eval/{epoch}/{r}" for r in range(world)]
        assert await store.check(keys), (
            f"store barrier of epoch {epoch} let rank {rank} through before every rank wrote its score")
        means.append(sum(float(v) for v in await store.multi_get(keys)) / world)
    await _finish()
    return means


barrier_reuse, barrier_reuse_fixed = _twins("barrier_reuse", _epoch_scores)


# ---------------------------------------------------------------- 9. restart amnesia: tokenizer workers' journals

SHARDS = 15


def _journal_entries(raw: bytes) -> list[int]:
    return [int(s) for s in raw.decode().split(";") if s]


async def _commit_once(store: dist.Store, journal: str, shard: int) -> None:
    """Append ``shard`` to the journal unless it is there: compare_set, so a request of a previous process
    still in flight when this one resumed cannot add it a second time."""
    raw = await store.get(journal) if await store.check([journal]) else b""
    while shard not in _journal_entries(raw):
        new = raw + f"{shard};".encode()
        cur = await store.compare_set(journal, raw, new)
        if cur == new:
            return
        raw = cur


async def _tokenize(fixed: bool) -> Any:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    server = await dist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await dist.TCPStore.connect(host, port, timeout=60.0)
    if rank == 0:  # the coordinator: wait for the workers, then check the output
        await store.wait([f"tok/done/{r}" for r in range(1, world)], timeout=120.0)
        for r in range(1, world):
            written = _journal_entries(await store.get(f"tok/journal/{r}"))
            mine = list(range(r - 1, SHARDS, world - 1))
            for shard in mine:
                assert written.count(shard) <= 1, (
                    f"shard {shard} tokenized again: written {written.count(shard)} times by rank {r}: {written}")
                assert written.count(shard) == 1, f"shard {shard} missing from rank {r}'s journal: {written}"
        await store.set("tok/audited", b"1")
        await store.wait([f"tok/left/{r}" for r in range(1, world)], timeout=120.0)  # the store outlives them
        await store.close()
        assert server is not None
        await server.close()
        return "audited"
    journal = f"tok/journal/{rank}"
    mine = list(range(rank - 1, SHARDS, world - 1))
    done: set[int] = set()  # progress: the shards this worker finished
    if fixed and await store.check([journal]):  # resume from the journal, which outlives the process
        done.update(_journal_entries(await store.get(journal)))
    for shard in mine:
        if shard in done:
            continue
        await asyncio.sleep(0.05 + 0.01 * (shard % 4))  # tokenize the shard
        if fixed:
            await _commit_once(store, journal, shard)
        else:
            await store.append(journal, f"{shard};")
        done.add(shard)
    await store.set(f"tok/done/{rank}", str(len(done)))
    await store.wait(["tok/audited"], timeout=120.0)
    await store.set(f"tok/left/{rank}", b"1")
    await store.close()
    return len(done)


restart_amnesia, restart_amnesia_fixed = _twins("restart_amnesia", _tokenize)


# ---------------------------------------------------------------- 10. split brain: primary/standby log writers

HB = 101
HB_EVERY = 0.04  # the primary writes an entry and heartbeats this often
PROMOTE_AFTER = 0.4  # seconds of silence after which the standby takes over
ENTRIES, TAKEOVER_ENTRIES = 50, 10
HEAD = "log/head"  # fixed: "epoch:seq", changed only by compare_set


async def _fenced_append(store: dist.Store, epoch: int, writer: int) -> bool:
    """Append one entry if ``epoch`` is still the log's epoch; False: a newer writer fenced us off."""
    while True:
        cur = await store.get(HEAD)
        e, seq = (int(v) for v in cur.decode().split(":"))
        if e != epoch:
            return False
        new = f"{epoch}:{seq + 1}"
        if await store.compare_set(HEAD, cur, new) == new.encode():
            await store.append("log", f"{writer}:{seq + 1};")
            return True


async def _append(store: dist.Store, epoch: int, writer: int, fixed: bool) -> bool:
    if fixed:
        return await _fenced_append(store, epoch, writer)
    seq = await store.add("log/seq", 1)
    await store.append("log", f"{writer}:{seq};")
    return True


async def _log_writers(fixed: bool) -> Any:
    rank, _, store = await _init()
    if rank == 0:
        await store.set(HEAD, b"1:0")
    await dist.barrier()
    if rank == 1:  # the primary
        for i in range(ENTRIES):
            await asyncio.sleep(HB_EVERY)
            await dist.isend(_i64(i), dst=2, tag=HB)
            if not await _append(store, 1, rank, fixed):
                break  # fenced: step down
        await dist.send(_i64(-1), dst=2, tag=HB)
        await store.set("log/done/1", b"1")
    elif rank == 2:  # the standby
        last = [time.monotonic()]
        finished = asyncio.Event()

        async def listen() -> None:
            buf = _i64(0)
            while True:
                await dist.recv(buf, src=1, tag=HB)
                last[0] = time.monotonic()
                if buf[0] < 0:
                    finished.set()
                    return

        listener = asyncio.create_task(listen())
        promoted = False
        while not finished.is_set():
            await asyncio.sleep(HB_EVERY)
            if not finished.is_set() and time.monotonic() - last[0] > PROMOTE_AFTER:
                promoted = True
                break
        if promoted:
            epoch = 1
            if fixed:  # fence: a new epoch, set atomically on the log's head
                while True:
                    cur = await store.get(HEAD)
                    e, seq = (int(v) for v in cur.decode().split(":"))
                    new = f"{e + 1}:{seq}"
                    if await store.compare_set(HEAD, cur, new) == new.encode():
                        epoch = e + 1
                        break
            for _ in range(TAKEOVER_ENTRIES):
                await asyncio.sleep(HB_EVERY)
                await _append(store, epoch, rank, fixed)
        await listener
        await store.set("log/done/2", b"1")
    else:  # rank 0: the log server's auditor
        await store.wait(["log/done/1", "log/done/2"], timeout=60.0)
        entries = [tuple(int(v) for v in e.split(":")) for e in (await store.get("log")).decode().split(";") if e]
        by1 = [s for w, s in entries if w == 1]
        by2 = [s for w, s in entries if w == 2]
        if by1 and by2:
            assert max(by1) < min(by2), (
                f"split brain: the primary wrote seq {max(by1)} after the standby took over at seq {min(by2)}")
    await _finish()
    return rank


split_brain, split_brain_fixed = _twins("split_brain", _log_writers)


PROGRAMS = {
    "lost_update": "lost update (get, then set)",
    "check_then_act": "check-then-act leader election",
    "lease": "lease without fencing, slow holder",
    "lost_wakeup": "lost wake-up (doorbell cleared after reading)",
    "causal_order": "causal order across two senders",
    "any_source": "any-source order after store round trips",
    "tight_timeout": "receive timeout too tight for the tail",
    "barrier_reuse": "store barrier reused without generations",
    "restart_amnesia": "restart amnesia",
    "split_brain": "split brain, one-way partition",
}
WORLD = {"lost_update": 3, "check_then_act": 4, "lease": 4, "lost_wakeup": 4, "causal_order": 3,
         "any_source": 3, "tight_timeout": 3, "barrier_reuse": 4, "restart_amnesia": 4, "split_brain": 3}
SWARM_KINDS = {"restart_amnesia": frozenset({"restart"}), "split_brain": frozenset({"partition"})}
SYMPTOM = {
    "lost_update": ("AssertionError", "lost update"),
    "check_then_act": ("AssertionError", "expected one downloader"),
    "lease": ("AssertionError", "stale lease holder"),
    "lost_wakeup": ("StoreTimeoutError", "eval/doorbell"),
    "causal_order": ("AssertionError", "arrived before that vocab"),
    "any_source": ("AssertionError", "rows arrived before the schema"),
    "tight_timeout": ("AssertionError", "used in round"),
    "barrier_reuse": ("AssertionError", "store barrier of epoch"),
    "restart_amnesia": ("AssertionError", "tokenized again"),
    "split_brain": ("AssertionError", "split brain"),
}
