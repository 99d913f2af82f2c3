"""Fifth blind set: ten bug programs, one per class of issue 12, each with its fixed twin.

Written from the public docs only (README.md, sim/README.md, /work/shared/API.md, examples/,
docstrings), without reading the other programs of tests/sim_bugs or the simulator's source (of
blind_c.py only its layout: ``_twins`` and the tables at the end; of blind_d.py its docstring), and
not changed after measuring. ``<name>`` raises when its bug bites (SYMPTOM: the exception type and a
marker its message holds); ``<name>_fixed`` runs the same body, the fix being the lines under ``if
fixed``. The programs: (1) ``sample_budget``: two loader tasks per worker count consumed samples in
one store key with get-then-set, the config comes by ``broadcast_object_list`` and the check is an
``all_reduce`` over the workers' subgroup; (2) ``node_writer``: two subgroups of three ranks (W=6)
each pick a checkpoint writer per epoch by check-then-set, verified with ``all_gather_object`` in the
subgroup; (3) ``shard_lease``: a lease with a TTL (token:holder:expiry, taken with compare_set), the
holder writing a shard in parts to a storage rank over p2p (any-source recv), which checks the
token (fencing) or not; (4) ``ingest``: two actor tasks per rank publish episodes and ring a
doorbell; the ingester clears the bell after ingesting the batch it read; (5) ``policy_eval``: the
learner isends each policy's weights to the actors, then notifies a scheduler rank that sends them
evaluation jobs; an actor receives weights and jobs in two tasks; (6) ``ps_rounds``: a parameter
server takes the first any-source message of each of 5 rounds as the chief's config while the other
workers claim a shard in the store (two round trips) before pushing; (7) ``round_metrics``: per-round
metrics received in rank order with a 20 ms timeout, a skipped worker's message landing in the next
round; (8) ``eval_gate``: evaluators (ranks 1..3; rank 0 only hosts the store) meet at a store gate
every epoch, reset by the last to leave; (9) ``tokenize``: workers on a standalone store (no process
group) commit items to a journal with compare_set, their progress kept in memory; (10)
``failover``: a primary (rank 1) logs to rank 0's store and sends p2p heartbeats to a standby
(rank 2) that promotes itself after 0.2 s of silence, with or without an epoch in the log.

Measured on ab7729c (``sim.run(prog, world_size=WORLD[name], seed=s, trace=False, **run)``, seeds
0..199). bug: runs failing with SYMPTOM; other: runs failing another way; fixed timing: the same
with ``explore=False``.

| program | W | run | first bug seed | bug of 200 | other of 200 | fixed timing: bug of 200 (first) |
|---|---:|---|---:|---:|---:|---:|
| sample_budget | 5 | defaults | 0 | 200 | 0 | 200 (0) |
| node_writer | 6 | defaults | 0 | 193 | 0 | 198 (0) |
| shard_lease | 4 | defaults | 1 | 43 | 0 | 0 |
| ingest | 5 | defaults | 0 | 152 | 0 | 200 (0) |
| policy_eval | 4 | defaults | 0 | 51 | 0 | 0 |
| ps_rounds | 4 | defaults | 1 | 60 | 0 | 1 (40) |
| round_metrics | 5 | defaults | 2 | 53 | 0 | 0 |
| eval_gate | 4 | defaults | 0 | 122 | 0 | 0 |
| tokenize | 4 | defaults | - | 0 | 0 | |
| tokenize | 4 | Swarm() | 7 | 16 | 85 (a) | 15 (7) |
| tokenize | 4 | Swarm(kinds={"restart"}) | 1 | 98 | 0 | |
| failover | 3 | defaults | 0 | 25 | 0 | |
| failover | 3 | Swarm() | 24 | 15 | 114 (b) | 3 (19) |
| failover | 3 | Swarm(kinds={"partition"}) | 0 | 41 | 0 | |

Twins, failures of seeds 0..99 under the defaults: 0 for all ten. Under the swarm restricted to their
kind: tokenize_fixed 0 of 200 (seeds 0..199), failover_fixed 0 of 200. For information, under
``Swarm()`` (kinds they do not claim to tolerate): 39 and 62 of 100 fail, none with SYMPTOM. Every
twin also passes for real (``aiodist.spawn``, one run each); for real, the bugs of sample_budget,
node_writer, eval_gate (their AssertionError) and ingest (rank 0: StoreTimeoutError on
'ingest/doorbell') bit in that one run.

failover is found under the defaults too, as blind_d's was: its 0.2 s promotion deadline is far
tighter than aiodist's failure detector, and exploration's pauses and clogs reach it.

(a) the store, crash and pause kinds: StoreConnectionLost 58, StoreTimeoutError 18,
    StoreConnectTimeoutError 7, time limit 2 (seeds 60, 153: a worker crashed for good, and rank 0
    polls for its departure every 5 ms until the 3600 s limit; ~15 s of wall time each).
(b) the store, crash and pause kinds: RendezvousError 50, PeerFailureError 36, StoreConnectionLost
    14, RendezvousTimeoutError 13, EvictedError 1.

``PYTHONPATH=. python -m pytest -q tests/test_sim_bugs.py -k blind_e``: 24 passed, 8.7 s wall (the
machine shared with a CI run).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

import numpy as np

import aiodist as dist

from .twins import twins as _twins


# ---------------------------------------------------------------- helpers


async def _start() -> tuple[int, int, dist.Store]:
    """torchrun-style start (env://); returns rank, world size and the group's store for our own keys."""
    pg = await dist.init_process_group("gloo", "env://", timeout=timedelta(seconds=60))
    return pg.rank, pg.size, pg.store


async def _end() -> None:
    await dist.barrier()
    await dist.destroy_process_group()


def _row(*fields: int) -> np.ndarray:
    out = np.zeros(4, dtype=np.int64)
    out[: len(fields)] = fields
    return out


# ------------------------------ 1. lost update: a sample budget shared by two loader tasks per worker

BUDGET = "budget/consumed"
MICROBATCHES = 4


async def _sample_budget(fixed: bool) -> int:
    """Rank 0 broadcasts the run's config; workers 1..W-1 run two loader tasks each, which count the
    samples they consume in one store key; the workers' subgroup then checks the key against its sum."""
    rank, world, store = await _start()
    workers = await dist.new_group(list(range(1, world)))
    if rank == 0:
        await store.set(BUDGET, "0")
    config: list[Any] = [{"microbatches": MICROBATCHES, "lr": 0.1} if rank == 0 else None]
    await dist.broadcast_object_list(config, src=0)
    local = 0
    if rank > 0:

        async def loader(task: int) -> int:
            used = 0
            for mb in range(config[0]["microbatches"]):
                samples = 1 + (rank + task + mb) % 3
                await asyncio.sleep(0.001)  # decode the microbatch
                if fixed:
                    await store.add(BUDGET, samples)
                else:
                    seen = int(await store.get(BUDGET))
                    await store.set(BUDGET, str(seen + samples))
                used += samples
            return used

        local = sum(await asyncio.gather(loader(0), loader(1)))
        total = np.array([local], dtype=np.int64)
        await dist.all_reduce(total, group=workers)
        if workers.rank == 0:
            recorded = int(await store.get(BUDGET))
            if recorded != int(total[0]):
                raise AssertionError(f"budget says {recorded} samples, the loaders consumed {int(total[0])}: "
                                     "samples were lost")
    await _end()
    return local


sample_budget, sample_budget_fixed = _twins("sample_budget", _sample_budget)


# ------------------------ 2. check-then-act: a checkpoint writer per node and epoch (two subgroups)

NODE = 3
CKPT_EPOCHS = 3


async def _node_writer(fixed: bool) -> int:
    """Two "nodes" of three ranks (subgroups); at each epoch's end one rank of each node writes the
    node's checkpoint: the first to find the epoch's key missing claims it."""
    rank, world, store = await _start()
    nodes = [await dist.new_group(list(range(n, min(n + NODE, world)))) for n in range(0, world, NODE)]
    node = rank // NODE
    mine = nodes[node]
    wrote = 0
    for epoch in range(CKPT_EPOCHS):
        await asyncio.sleep(0.001 * ((rank + epoch) % 2))  # the epoch's last steps
        key = f"ckpt/node{node}/epoch{epoch}"
        if fixed:
            won = (await store.compare_set(key, "", str(rank))).decode() == str(rank)
        else:
            won = not await store.check([key])
            if won:
                await store.set(key, str(rank))
        claims: list[Any] = [None] * mine.size
        await dist.all_gather_object(claims, won, group=mine)
        if sum(bool(c) for c in claims) != 1:
            raise AssertionError(f"expected one checkpoint writer for node {node} at epoch {epoch}, "
                                 f"claims {claims}")
        wrote += int(won)
    await _end()
    return wrote


node_writer, node_writer_fixed = _twins("node_writer", _node_writer)


# --------------------- 3. lease without fencing: a shard lease, writes to a storage rank over p2p

LEASE = "shards/lease"
LEASE_TTL = 0.05
SECTIONS = 3
PARTS = 4
WRITE = 31


async def _acquire(store: dist.Store, rank: int) -> tuple[int, str]:
    """Take the lease (value ``token:holder:expiry``, set with compare_set); returns its token and value."""
    while True:
        mine = f"1:{rank}:{time.time() + LEASE_TTL!r}"
        cur = (await store.compare_set(LEASE, "", mine)).decode()
        if cur == mine:
            return 1, mine
        token, _holder, expiry = cur.split(":")
        if float(expiry) <= time.time():
            mine = f"{int(token) + 1}:{rank}:{time.time() + LEASE_TTL!r}"
            if (await store.compare_set(LEASE, cur, mine)).decode() == mine:
                return int(token) + 1, mine
        await asyncio.sleep(0.005)


async def _shard_lease(fixed: bool) -> int:
    """Ranks 1..W-1 take turns holding a lease on a shard and write it in parts to rank 0, the storage
    rank; the storage rank checks the lease's token on each write (fencing) or not."""
    rank, world, store = await _start()
    applied = 0
    if rank == 0:
        newest = 0
        buf = _row()
        for _ in range((world - 1) * SECTIONS * PARTS):
            await dist.recv(buf, tag=WRITE)
            writer, token = int(buf[0]), int(buf[1])
            if fixed and token < newest:
                continue  # fenced: a write of a holder whose lease has passed to another
            if token < newest:
                raise AssertionError(f"rank {writer} wrote with lease token {token} after token {newest}: "
                                     "a stale lease holder wrote")
            newest = token
            applied += 1
    else:
        for section in range(SECTIONS):
            token, held = await _acquire(store, rank)
            for part in range(PARTS):
                await dist.send(_row(rank, token, section, part), dst=0, tag=WRITE)
                await asyncio.sleep(0.004)  # encode the next part
            await store.compare_set(LEASE, held, f"{token}:-:0")  # release (expiry 0: free)
    await _end()
    return applied


shard_lease, shard_lease_fixed = _twins("shard_lease", _shard_lease)


# ------------------ 4. lost wake-up: actor tasks ring an ingester's doorbell, cleared after the batch

BELL = "ingest/doorbell"
COUNT = "ingest/episodes"
ACTORS = 2
EPISODES = 3


async def _ingest(fixed: bool) -> int:
    """Ranks 1..W-1 run two actor tasks each, which publish episodes and ring a doorbell; rank 0 waits
    for the bell, ingests what was published, and clears the bell."""
    rank, world, store = await _start()
    total = (world - 1) * ACTORS * EPISODES
    consumed = 0
    if rank == 0:
        while consumed < total:
            await store.wait([BELL], timeout=10.0)
            if fixed:
                await store.delete_key(BELL)
            published = int(await store.add(COUNT, 0))
            for i in range(consumed, published):
                await store.get(f"ingest/ep/{i}")
                await asyncio.sleep(0.002)  # a learner update on the episode
            consumed = published
            if not fixed:
                await store.delete_key(BELL)
    else:

        async def actor(k: int) -> None:
            for e in range(EPISODES):
                await asyncio.sleep(0.001 * (1 + (rank + k + e) % 4))  # the rollout
                i = await store.add(COUNT, 1) - 1
                await store.set(f"ingest/ep/{i}", f"{rank}/{k}/{e}")
                await store.set(BELL, "1")

        await asyncio.gather(*(actor(k) for k in range(ACTORS)))
    await _end()
    return consumed


ingest, ingest_fixed = _twins("ingest", _ingest)


# --------- 5. causal order: weights from the learner vs evaluation jobs from a scheduler it notified

WEIGHTS, NOTE, JOB = 51, 52, 53
POLICIES = 5
PARAMS = 16384


async def _policy_eval(fixed: bool) -> int:
    """Rank 0 (learner) sends each policy's weights to the actors (ranks 2..), then tells rank 1 (the
    scheduler), which sends the actors an evaluation job for that policy. An actor receives weights
    and jobs in two tasks and assumes a job's weights are already there."""
    rank, world, _store = await _start()
    actors = list(range(2, world))
    evaluated = 0
    if rank == 0:
        for v in range(1, POLICIES + 1):
            weights = np.full(PARAMS, float(v), dtype=np.float32)
            sends = [dist.isend(weights, dst=a, tag=WEIGHTS) for a in actors]
            await dist.send(_row(v), dst=1, tag=NOTE)
            for s in sends:
                await s
            await asyncio.sleep(0.002)  # train the next policy
    elif rank == 1:
        note = _row()
        for _ in range(POLICIES):
            await dist.recv(note, src=0, tag=NOTE)
            for a in actors:
                await dist.send(_row(int(note[0])), dst=a, tag=JOB)
    else:
        have = 0
        arrived = asyncio.Event()

        async def weights_loop() -> None:
            nonlocal have
            buf = np.zeros(PARAMS, dtype=np.float32)
            for _ in range(POLICIES):
                await dist.recv(buf, src=0, tag=WEIGHTS)
                have = int(buf[0])
                arrived.set()

        async def jobs_loop() -> None:
            nonlocal evaluated
            job = _row()
            for _ in range(POLICIES):
                await dist.recv(job, src=1, tag=JOB)
                want = int(job[0])
                if fixed:
                    while have < want:
                        arrived.clear()
                        await arrived.wait()
                if have < want:
                    raise AssertionError(f"rank {rank}: job for policy v{want} arrived before its weights "
                                         f"(the actor has v{have})")
                await asyncio.sleep(0.001)  # evaluate
                evaluated += 1

        await asyncio.gather(weights_loop(), jobs_loop())
    await _end()
    return evaluated


policy_eval, policy_eval_fixed = _twins("policy_eval", _policy_eval)


# ------------- 6. any-source: a parameter server takes the chief's config as the round's first message

ROUND, PUSH = 60, 61
CONFIG, GRAD = 1, 2
PS_ROUNDS = 5


async def _ps_rounds(fixed: bool) -> float:
    """Rank 0 (parameter server) starts a round with a broadcast; rank 1 (chief) sends the round's
    learning rate at once, the other workers first claim a data shard in the store (two round
    trips), then push a gradient. The server receives from any source and takes the first message
    as the config."""
    rank, world, store = await _start()
    header = _row()
    weight = 0.0
    for r in range(PS_ROUNDS):
        header[0] = r
        await dist.broadcast(header, src=0)
        if rank == 0:
            lr = 0.0
            buf = _row()
            for i in range(world - 1):
                src = await dist.recv(buf, src=1 if fixed and i == 0 else None, tag=PUSH)
                kind, value = int(buf[0]), int(buf[3])
                if i == 0:
                    if kind != CONFIG:
                        raise AssertionError(f"round {r}: a gradient from rank {src} came before the chief's "
                                             "config, applied with a stale learning rate")
                    lr = value / 1000
                else:
                    weight -= lr * value
        elif rank == 1:
            await dist.send(_row(CONFIG, rank, r, 100 - 10 * r), dst=0, tag=PUSH)
        else:
            shard = await store.add(f"ps/round{r}/cursor", 1)
            await store.set(f"ps/round{r}/shard{shard}", str(rank))
            await dist.send(_row(GRAD, rank, r, rank * shard), dst=0, tag=PUSH)
    await _end()
    return weight


ps_rounds, ps_rounds_fixed = _twins("ps_rounds", _ps_rounds)


# ---------------------------- 7. tight timeout: per-round metrics received within 20 ms per worker

METRIC = 71
METRIC_ROUNDS = 6
METRIC_TIMEOUT = 0.02  # 20 ms: a hundred times the network's latency


async def _round_metrics(fixed: bool) -> int:
    """Rank 0 starts each round with a broadcast and receives a metric from each worker in rank order
    with a 20 ms timeout (a worker that misses it is skipped for the round); the message of a
    skipped worker still comes, later."""
    rank, world, _store = await _start()
    header = _row()
    counted = 0
    owed = dict.fromkeys(range(1, world), 0)
    buf = _row()
    for r in range(METRIC_ROUNDS):
        header[0] = r
        await dist.broadcast(header, src=0)
        if rank == 0:
            for w in range(1, world):
                while True:
                    try:
                        await dist.recv(buf, src=w, tag=METRIC, timeout=METRIC_TIMEOUT)
                    except TimeoutError:
                        owed[w] += 1  # skipped this round; its message is still on the way
                        break
                    if fixed and int(buf[1]) < r:
                        owed[w] -= 1  # a late one of a round already closed: drop it
                        continue
                    if int(buf[1]) != r:
                        raise AssertionError(f"rank {w}'s metric of round {int(buf[1])} was counted in "
                                             f"round {r}")
                    counted += 1
                    break
        else:
            await asyncio.sleep(0.001 * ((rank + r) % 3))  # the round's steps
            await dist.send(_row(rank, r, 1000 + r), dst=0, tag=METRIC)
    if rank == 0:
        for w, n in owed.items():
            for _ in range(n):
                await dist.recv(buf, src=w, tag=METRIC)
    await _end()
    return counted


round_metrics, round_metrics_fixed = _twins("round_metrics", _round_metrics)


# ------------------------ 8. barrier reused: an evaluators' store gate, reset by the last to leave

EVAL_EPOCHS = 5


async def _gate(store: dist.Store, epoch: int, n: int, fixed: bool) -> None:
    pre = f"gate/{epoch}" if fixed else "gate"
    if await store.add(f"{pre}/in", 1) == n:
        if not fixed:
            await store.set(f"{pre}/in", "0")
        await store.set(f"{pre}/open", "1")
    await store.wait([f"{pre}/open"], timeout=10.0)
    if not fixed and await store.add(f"{pre}/out", 1) == n:
        await store.set(f"{pre}/out", "0")
        await store.delete_key(f"{pre}/open")


async def _eval_gate(fixed: bool) -> int:
    """Ranks 1..W-1 evaluate each epoch, publish a score and meet at a store gate before reading
    everyone's scores; rank 0 only hosts the store (and meets them at the end)."""
    rank, world, store = await _start()
    evaluators = list(range(1, world))
    best = 0
    if rank > 0:
        for epoch in range(EVAL_EPOCHS):
            await asyncio.sleep(0.001 * ((rank * epoch) % 3))  # evaluate
            await store.set(f"score/{epoch}/{rank}", str(rank * 10 + epoch))
            await _gate(store, epoch, len(evaluators), fixed)
            keys = [f"score/{epoch}/{e}" for e in evaluators]
            if not await store.check(keys):
                raise AssertionError(f"rank {rank} passed the gate of epoch {epoch} before every evaluator "
                                     "had scored")
            best = max(int(v) for v in await store.multi_get(keys))
    await _end()
    return best


eval_gate, eval_gate_fixed = _twins("eval_gate", _eval_gate)


# -------------- 9. restart amnesia: tokenizer workers on a standalone store, progress in memory

JOURNAL_ITEMS = 8


async def _read(store: dist.Store, key: str) -> str:
    return (await store.compare_set(key, "", "")).decode()  # the value, or "" (set) if missing


async def _tokenize(fixed: bool) -> int:
    """Rank 0 serves a store (no process group); ranks 1..W-1 tokenize their items and commit each to
    a journal in the store (compare_set); rank 0 checks that every item is in exactly once."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    workers = list(range(1, world))
    server = await dist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await dist.TCPStore.connect(host, port, timeout=60.0)
    written = 0
    if rank == 0:
        await store.wait([f"tok/done/{w}" for w in workers], timeout=60.0)
        for w in workers:
            items = (await _read(store, f"tok/journal/{w}")).split(",")[:-1]
            for item in sorted(set(items)):
                if items.count(item) != 1:
                    raise AssertionError(f"item {item} of rank {w} was tokenized {items.count(item)} times")
            written += len(items)
        await store.set("tok/verdict", "ok")
        while int(await store.add("tok/left", 0)) < len(workers):
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
    else:
        key = f"tok/journal/{rank}"
        done = set((await _read(store, key)).split(",")) if fixed else set()  # resume from the journal
        for item in (str(rank * 100 + i) for i in range(JOURNAL_ITEMS)):
            if item in done:
                continue
            await asyncio.sleep(0.01)  # tokenize
            while True:
                cur = await _read(store, key)
                if fixed and item in cur.split(","):
                    break  # committed by our previous process (its last frame came late)
                new = f"{cur}{item},"
                if (await store.compare_set(key, cur, new)).decode() == new:
                    break
            written += 1
        await store.set(f"tok/done/{rank}", str(os.getpid()))
        await store.wait(["tok/verdict"], timeout=60.0)
        await store.add("tok/left", 1)
    await store.close()
    if server is not None:
        await server.close()
    return written


tokenize, tokenize_fixed = _twins("tokenize", _tokenize)


# ------------ 10. split brain: heartbeats 1 -> 2 over p2p, a log in the store, promotion without epoch

SB_LOG = "sb/log"
HEARTBEAT = 91
HB_INTERVAL = 0.02
PATIENCE = 0.2  # ten missed heartbeats
LOG_ENTRIES = 30


def _parse(value: str) -> tuple[int, list[str]]:
    epoch, _, entries = value.partition("|")
    return int(epoch), entries.split(",")[:-1]


async def _write_log(store: dist.Store, rank: int, epoch: int, fixed: bool) -> int:
    """Append entries until the log has LOG_ENTRIES; a leader of an older epoch steps down."""
    wrote = 0
    while True:
        cur = (await store.get(SB_LOG)).decode()
        e, entries = _parse(cur)
        if fixed and e != epoch:
            return wrote  # a newer leader took over: step down
        if len(entries) >= LOG_ENTRIES:
            return wrote
        new = f"{cur}{rank}:{len(entries)},"
        if (await store.compare_set(SB_LOG, cur, new)).decode() == new:
            wrote += 1
            await asyncio.sleep(HB_INTERVAL)  # the next request to log


async def _promote(store: dist.Store) -> int:
    while True:
        cur = (await store.get(SB_LOG)).decode()
        e, _ = _parse(cur)
        new = f"{e + 1}|{cur.partition('|')[2]}"
        if (await store.compare_set(SB_LOG, cur, new)).decode() == new:
            return e + 1


async def _failover(fixed: bool) -> int:
    """Rank 1 (primary) appends to a log in rank 0's store and sends heartbeats to rank 2 (standby),
    which promotes itself after PATIENCE without one; rank 0 checks the log at the end."""
    rank, _world, store = await _start()
    wrote = 0
    if rank == 0:
        await store.set(SB_LOG, "1|")
    await dist.barrier()
    if rank == 1:
        stop = asyncio.Event()

        async def heartbeats() -> None:
            n = 1
            while not stop.is_set():
                await dist.send(_row(n, 1), dst=2, tag=HEARTBEAT)
                n += 1
                await asyncio.sleep(HB_INTERVAL)
            await dist.send(_row(n, 0), dst=2, tag=HEARTBEAT)  # bye

        async def serve() -> None:
            nonlocal wrote
            wrote = await _write_log(store, rank, 1, fixed)
            stop.set()

        await asyncio.gather(heartbeats(), serve())
    elif rank == 2:
        hb = _row()
        leader: asyncio.Task[int] | None = None
        while True:
            try:
                await dist.recv(hb, src=1, tag=HEARTBEAT, timeout=None if leader else PATIENCE)
            except TimeoutError:

                async def lead() -> int:
                    epoch = await _promote(store) if fixed else 1
                    return await _write_log(store, rank, epoch, fixed)

                leader = asyncio.ensure_future(lead())
                continue
            if int(hb[1]) == 0:
                break
        if leader is not None:
            wrote = await leader
    await dist.barrier()
    if rank == 0:
        _, entries = _parse((await store.get(SB_LOG)).decode())
        writers = [int(e.split(":")[0]) for e in entries]
        for i in range(1, len(writers)):
            if writers[i] != writers[i - 1] and writers[i] in writers[:i]:
                raise AssertionError(f"split brain: rank {writers[i]} wrote entry {i} after rank "
                                     f"{writers[i - 1]} took over")
        if len(writers) != LOG_ENTRIES:
            raise AssertionError(f"the log has {len(writers)} entries, expected {LOG_ENTRIES}")
    await dist.destroy_process_group()
    return wrote


failover, failover_fixed = _twins("failover", _failover)


PROGRAMS = {
    "sample_budget": "lost update (get, then set)",
    "node_writer": "check-then-act leader election",
    "shard_lease": "lease without fencing, slow holder",
    "ingest": "lost wake-up (doorbell cleared after reading)",
    "policy_eval": "causal order across two senders",
    "ps_rounds": "any-source order after store round trips",
    "round_metrics": "receive timeout too tight for the tail",
    "eval_gate": "store barrier reused without generations",
    "tokenize": "restart amnesia",
    "failover": "split brain, one-way partition",
}
WORLD = {"sample_budget": 5, "node_writer": 6, "shard_lease": 4, "ingest": 5, "policy_eval": 4,
         "ps_rounds": 4, "round_metrics": 5, "eval_gate": 4, "tokenize": 4, "failover": 3}
SWARM_KINDS = {"tokenize": frozenset({"restart"}), "failover": frozenset({"partition"})}
SYMPTOM = {
    "sample_budget": ("AssertionError", "samples were lost"),
    "node_writer": ("AssertionError", "expected one checkpoint writer"),
    "shard_lease": ("AssertionError", "a stale lease holder wrote"),
    "ingest": ("StoreTimeoutError", "ingest/doorbell"),
    "policy_eval": ("AssertionError", "arrived before its weights"),
    "ps_rounds": ("AssertionError", "came before the chief's config"),
    "round_metrics": ("AssertionError", "was counted in round"),
    "eval_gate": ("AssertionError", "before every evaluator had scored"),
    "tokenize": ("AssertionError", "was tokenized"),
    "failover": ("AssertionError", "split brain"),
}
