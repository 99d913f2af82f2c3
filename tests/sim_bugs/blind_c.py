"""Third blind set: ten bug programs, one per class of issue 12, each with its fixed twin.

Written from the public docs only (README.md, sim/README.md, /work/shared/API.md, examples/,
docstrings), without reading the other programs of tests/sim_bugs or the simulator's source, and
not changed after measuring. ``<name>`` raises when its bug bites (SYMPTOM: the exception type
and a marker its message holds); ``<name>_fixed`` runs the same body, the fix being the lines
under ``if fixed``. The programs: (1) an async parameter server's global step, (2) who writes an
epoch's checkpoint, (3) a compaction lease and a segment server that checks fencing tokens or
not, (4) RL actors ringing a learner's doorbell, (5) plan epochs a coordinator announces while a
worker hands shards on, (6) a batch assembled from two readers, one of which looks its offsets up
in the store, (7) per-step metrics received with a 50 ms timeout, (8) a store barrier reused every
epoch, (9) preprocessing workers whose output survives a restart but whose progress does not,
(10) a primary/standby pair: heartbeats rank 1 -> 2, the log in rank 0's store.

Measured on 698fea2 (``sim.run(prog, world_size=WORLD[name], seed=s, trace=False, **run)``, seeds
0..199). bug: runs failing with SYMPTOM; other: runs failing another way; fixed timing: the same
with ``explore=False``.

| program | W | run | first bug seed | bug of 200 | other of 200 | fixed timing: bug of 200 (first) |
|---|---:|---|---:|---:|---:|---:|
| lost_update | 4 | defaults | 0 | 200 | 0 | 200 (0) |
| check_then_act | 3 | defaults | 0 | 160 | 0 | 163 (0) |
| lease | 4 | defaults | 1 | 22 | 0 | 0 |
| lost_wakeup | 4 | defaults | 0 | 139 | 0 | 163 (0) |
| causal_order | 4 | defaults | 2 | 90 | 0 | 15 (13) |
| any_source | 3 | defaults | 1 | 107 | 0 | 1 (65) |
| tight_timeout | 4 | defaults | 6 | 66 | 0 | 0 |
| barrier_reuse | 4 | defaults | 0 | 165 | 1 (a) | 8 (16) |
| restart_amnesia | 4 | defaults | - | 0 | 0 | |
| restart_amnesia | 4 | Swarm() | 11 | 12 | 88 (b) | 13 (29) |
| restart_amnesia | 4 | Swarm(kinds={"restart"}) | 1 | 81 | 0 | 89 (0) |
| split_brain | 3 | defaults | - | 0 | 0 | |
| split_brain | 3 | Swarm() | 7 | 3 | 140 (b) | 2 (103) |
| split_brain | 3 | Swarm(kinds={"partition"}) | 0 | 18 | 1 (c) | 19 (1) |

Twins, failures of seeds 0..99 under the defaults: 0 for nine; tight_timeout_fixed 4 (seeds 15,
26, 70, 82; (d)). Under the swarm restricted to their kind: restart_amnesia_fixed 0 of 200 (seeds
0..199); split_brain_fixed 0 of 100, and 1 of seeds 100..199 (seed 139, (c)). For information,
under ``Swarm()`` (kinds they do not claim to tolerate): 48 and 72 of 100 fail, none with SYMPTOM.

(a) seed 62: StoreTimeoutError waiting for 'sync/open': the same reset race, its deadlock face (the
    last one out deleted a fast rank's arrival at the next epoch's barrier).
(b) the store, crash and pause kinds: StoreConnectionLost, RendezvousError, PeerFailureError...
(c) seed 139: three partitions of the swarm, each shorter than the failure detector's 3 s, overlap
    (2.356-4.037 both ways, 3.762-4.697 one way {0,2}->1, 4.089-6.063 both ways): rank 1 hears
    nothing from rank 2 for 3.7 s and declares it failed (EvictedError / PeerFailureError).
(d) aiodist, not the twin: a ``recv(..., timeout=)`` whose message arrives while the rank is paused
    (an explored pause) and whose timeout falls due in the same stretch raises
    CollectiveTimeoutError after writing the message into the buffer; the message is consumed, so
    the report the twin counts as late never comes and its final drain times out. The same happens
    for real (``aiodist run -n 2``, the loop blocked by ``time.sleep`` across both).

Both causes were fixed after this measurement, without changing these programs: (c) a swarm plan's
partitions together now stay within 40% of the detector's budget (sim/swarm.py PARTITION_SHARE);
(d) a receive whose message was matched by the time its deadline is handled returns it (aiodist/p2p.py,
tests/test_recv_deadline_race.py). Since then: tight_timeout_fixed 0 of 100 under the defaults,
split_brain_fixed 0 of 300 under ``Swarm(kinds={"partition"})``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from datetime import timedelta

import numpy as np

import aiodist as dist

from .twins import twins as _twins


# ---------------------------------------------------------------- helpers


async def _init() -> dist.Store:
    """torch-style start: env:// from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; the group's store for our keys."""
    pg = await dist.init_process_group("gloo", "env://", timeout=timedelta(seconds=60))
    store: dist.Store = pg.store
    return store


async def _finish() -> None:
    await dist.barrier()
    await dist.destroy_process_group()


def _msg(*fields: int) -> np.ndarray:
    out = np.zeros(6, dtype=np.int64)
    out[: len(fields)] = fields
    return out


# ------------------------------------------- 1. lost update: an async parameter server's global step

PS_STEPS = 6


async def _param_server(fixed: bool) -> int:
    store = await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        await store.set("ps/global_step", "0")
        await store.set("ps/weights", np.zeros(8).tobytes())
    await dist.barrier()
    for _ in range(PS_STEPS):
        w = np.frombuffer(await store.get("ps/weights"), dtype=np.float64).copy()
        await asyncio.sleep(random.uniform(0.5e-3, 2e-3))  # forward/backward on the local batch
        await store.set(f"ps/grad/{rank}", (w + 0.1).tobytes())
        if fixed:
            await store.add("ps/global_step", 1)
        else:
            step = int(await store.get("ps/global_step"))
            await store.set("ps/global_step", str(step + 1))  # drives the LR schedule
    await dist.barrier()
    total = int(await store.get("ps/global_step"))
    if rank == 0 and total != world * PS_STEPS:
        raise AssertionError(f"global step is {total} after {world * PS_STEPS} worker steps: a step was lost")
    await _finish()
    return total


lost_update, lost_update_fixed = _twins("lost_update", _param_server)


# ------------------------------------------- 2. check-then-act: who writes this epoch's checkpoint

CKPT_EPOCHS = 3


async def _ckpt_writer(fixed: bool) -> int:
    store = await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = 0
    for epoch in range(CKPT_EPOCHS):
        await asyncio.sleep(random.uniform(0.2e-3, 1.5e-3))  # the epoch's last steps
        key = f"ckpt/{epoch}/writer"
        if fixed:
            writer = (await store.compare_set(key, "", str(rank))).decode() == str(rank)
        else:
            writer = not await store.check([key])
            if writer:
                await store.set(key, str(rank))
        if writer:
            mine += 1
            await store.add(f"ckpt/{epoch}/shards_written", 1)  # write the checkpoint
        await dist.barrier()
        if rank == 0:
            n = int(await store.add(f"ckpt/{epoch}/shards_written", 0))
            if n != 1:
                raise AssertionError(f"checkpoint of epoch {epoch} was written by {n} ranks, expected one writer")
    await _finish()
    return mine


check_then_act, check_then_act_fixed = _twins("check_then_act", _ckpt_writer)


# ------------------------------------------- 3. lease without fencing: a compaction lease and a segment server

LEASE = "compact/lease"
LEASE_TTL = 0.2
SEGMENTS = 24
REQ, REP = 31, 32
HELLO, WRITE, BYE = 1, 2, 3


async def _acquire(store: dist.Store, rank: int) -> str | None:
    now = time.time()
    mine = f"{rank}:{now + LEASE_TTL:.6f}"
    cur = (await store.compare_set(LEASE, "", mine)).decode()
    if cur == mine:
        return mine
    if now > float(cur.split(":")[1]):  # the holder let it expire: take it over
        if (await store.compare_set(LEASE, cur, mine)).decode() == mine:
            return mine
    return None


async def _segment_server(world: int, fixed: bool) -> list[int]:
    log: list[tuple[int, int]] = []  # (segment, writer)
    max_token, byes, buf = 0, 0, _msg()
    while byes < world - 1:
        src = await dist.recv(buf, src=None, tag=REQ, timeout=60)
        kind, token, seg = int(buf[0]), int(buf[1]), int(buf[2])
        if kind == BYE:
            byes += 1
            continue
        ok = not fixed or token >= max_token
        if ok:
            max_token = max(max_token, token)
        if ok and kind == WRITE:
            done = [w for s, w in log if s == seg]
            if done:
                raise AssertionError(f"segment {seg} compacted twice (ranks {done[0]} and {src}): two lease holders")
            log.append((seg, src))
        await dist.send(_msg(int(ok), len(log)), dst=src, tag=REP)
    return [s for s, _ in log]


async def _compactor(fixed: bool) -> int:
    store = await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        segs = await _segment_server(world, fixed)
        if sorted(segs) != list(range(SEGMENTS)):
            raise AssertionError(f"compacted segments {sorted(segs)}, expected 0..{SEGMENTS - 1}")
        await _finish()
        return len(segs)
    rep, written, deadline = _msg(), 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        lease = await _acquire(store, rank)
        if lease is None:
            if await store.check(["compact/done"]):
                break
            await asyncio.sleep(0.02)
            continue
        token = int(await store.add("compact/token", 1)) if fixed else 0
        await dist.send(_msg(HELLO, token), dst=0, tag=REQ)
        await dist.recv(rep, src=0, tag=REP, timeout=60)
        nxt = int(rep[1])
        while rep[0] and nxt < SEGMENTS:
            await asyncio.sleep(0.01)  # compact segment nxt
            await dist.send(_msg(WRITE, token, nxt), dst=0, tag=REQ)
            await dist.recv(rep, src=0, tag=REP, timeout=60)
            written += int(rep[0])
            nxt = int(rep[1])
            renewed = f"{rank}:{time.time() + LEASE_TTL:.6f}"
            if (await store.compare_set(LEASE, lease, renewed)).decode() != renewed:
                break  # lost the lease
            lease = renewed
        if nxt >= SEGMENTS:
            await store.set("compact/done", "1")
            break
    await dist.send(_msg(BYE), dst=0, tag=REQ)
    await _finish()
    return written


lease, lease_fixed = _twins("lease", _compactor)


# ------------------------------------------- 4. lost wake-up: RL actors, a learner and a doorbell

RL_VERSIONS = 8


async def _rl(fixed: bool) -> int:
    store = await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != 0:  # actor
        for version in range(RL_VERSIONS):
            await store.get(f"rl/policy/{version}", timeout=30)
            await asyncio.sleep(random.uniform(0.5e-3, 3e-3))  # roll out an episode
            await store.queue_push("rl/trajectories", f"{rank}:{version}")
            await store.add("rl/posted", 1)
            await store.set("rl/bell", "1")  # ring the learner
        await _finish()
        return RL_VERSIONS
    consumed = 0
    for version in range(RL_VERSIONS):
        await store.set(f"rl/policy/{version}", np.full(4, float(version)).tobytes())
        while consumed < (world - 1) * (version + 1):
            await store.wait(["rl/bell"], timeout=10)
            if fixed:
                await store.delete_key("rl/bell")  # clear before looking: a later post rings again
            posted = int(await store.get("rl/posted"))
            while consumed < posted:
                await store.queue_pop("rl/trajectories", timeout=10)
                consumed += 1
            if not fixed:
                await store.delete_key("rl/bell")
        # one learner step on the batch
    await _finish()
    return consumed


lost_wakeup, lost_wakeup_fixed = _twins("lost_wakeup", _rl)


# ------------------------------------------- 5. causal order: plan epochs, and shards handed on by a worker

MAILBOX, DONE_TAG = 41, 42
PLAN, ASSIGN = 1, 2
PLAN_EPOCHS = 10


async def _planner(fixed: bool) -> int:
    await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = _msg()
    if rank == 0:  # coordinator: announce the plan to everyone, then give rank 1 the epoch's shards
        for epoch in range(1, PLAN_EPOCHS + 1):
            for r in range(1, world):
                await dist.send(_msg(PLAN, epoch), dst=r, tag=MAILBOX)
            await dist.send(_msg(ASSIGN, epoch, 0, 4 * (world - 1)), dst=1, tag=MAILBOX)
            for _ in range(1, world):
                await dist.recv(buf, src=None, tag=DONE_TAG, timeout=30)
        await _finish()
        return PLAN_EPOCHS
    plan, shards, handled = 0, 0, 0
    pending: list[np.ndarray] = []
    while handled < PLAN_EPOCHS:
        if pending and pending[0][1] <= plan:
            msg = pending.pop(0)
        else:
            await dist.recv(buf, src=None, tag=MAILBOX, timeout=30)
            msg = buf.copy()
        kind, epoch = int(msg[0]), int(msg[1])
        if kind == PLAN:
            plan = epoch
            continue
        if epoch > plan:
            if fixed:
                pending.append(msg)  # the plan is still on its way: keep the shards until it lands
                continue
            raise AssertionError(f"rank {rank}: shards of plan {epoch} arrived before the plan (have plan {plan})")
        lo, hi = int(msg[2]), int(msg[3])
        if rank == 1:  # hand every other worker its share of the range, keep the first
            step = (hi - lo) // (world - 1)
            for r in range(2, world):
                await dist.send(_msg(ASSIGN, epoch, lo + (r - 1) * step, lo + r * step), dst=r, tag=MAILBOX)
            hi = lo + step
        shards, handled = shards + hi - lo, handled + 1
        await asyncio.sleep(0.2e-3)  # load them
        await dist.send(_msg(epoch), dst=0, tag=DONE_TAG)
    await _finish()
    return shards


causal_order, causal_order_fixed = _twins("causal_order", _planner)


# ------------------------------------------- 6. any-source order: a batch assembled from two readers

DATA = 51
BATCHES = 12
RECORDS = 4


async def _assembler(fixed: bool) -> int:
    store = await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    part = np.zeros(RECORDS, dtype=np.int64)
    if rank == 0:
        await store.set("reader/manifest", ",".join(str(r * 1000) for r in range(world)))
        for b in range(BATCHES):
            await store.set(f"batch/{b}/request", "1")
            parts = []
            for r in range(1, world):
                await dist.recv(part, src=r if fixed else None, tag=DATA, timeout=30)
                parts.append(part.copy())
            batch = np.concatenate(parts)
            want = np.concatenate([r * 1000 + b * RECORDS + np.arange(RECORDS) for r in range(1, world)])
            if not np.array_equal(batch, want):
                raise AssertionError(f"batch {b} assembled out of order: starts {batch[0]}, expected {want[0]}")
        await _finish()
        return BATCHES
    for b in range(BATCHES):
        await store.get(f"batch/{b}/request", timeout=30)
        if rank == 1:
            base = 1000  # reader 1 has its offsets cached
        else:  # the others look theirs up
            base = int((await store.get("reader/manifest")).decode().split(",")[rank])
            await store.add(f"reader/{rank}/reads", 1)
        await dist.send(base + b * RECORDS + np.arange(RECORDS, dtype=np.int64), dst=0, tag=DATA)
    await _finish()
    return BATCHES


any_source, any_source_fixed = _twins("any_source", _assembler)


# ------------------------------------------- 7. a receive timeout too tight: per-step metrics to rank 0

METRICS = 61
TRAIN_STEPS = 15
METRICS_TIMEOUT = 0.05  # 50 ms: hundreds of times the network's latency


async def _metrics(fixed: bool) -> float:
    await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    grad, msg, total, late = np.zeros(16), np.zeros(2), 0.0, [0] * world
    for step in range(TRAIN_STEPS):
        grad[:] = rank + step
        await asyncio.sleep(1e-3)  # forward/backward
        await dist.all_reduce(grad, op=dist.ReduceOp.AVG)
        loss = float(grad[0]) / (rank + 1)
        if rank != 0:
            await dist.send(np.array([step, loss]), dst=0, tag=METRICS)
            continue
        for r in range(1, world):
            while True:
                try:
                    await dist.recv(msg, src=r, tag=METRICS, timeout=METRICS_TIMEOUT)
                except TimeoutError:
                    late[r] += 1  # a straggler: log without it this step
                    break
                if fixed and int(msg[0]) < step:
                    late[r] -= 1  # a late report of an earlier step: drop it
                    continue
                if int(msg[0]) != step:
                    raise AssertionError(f"step {step}: rank {r}'s metrics are for step {int(msg[0])}")
                total += float(msg[1])
                break
    if rank == 0 and fixed:
        for r in range(1, world):
            for _ in range(late[r]):  # collect the reports that came too late
                await dist.recv(msg, src=r, tag=METRICS, timeout=30)
    await _finish()
    return total


tight_timeout, tight_timeout_fixed = _twins("tight_timeout", _metrics)


# ------------------------------------------- 8. a store barrier reused every epoch without generations

SYNC_EPOCHS = 6


async def _store_barrier(store: dist.Store, world: int, epoch: int, fixed: bool) -> None:
    pre = f"sync/{epoch}" if fixed else "sync"
    if int(await store.add(f"{pre}/arrived", 1)) == world:
        await store.set(f"{pre}/open", "1")
    await store.wait([f"{pre}/open"], timeout=30)
    if not fixed and int(await store.add(f"{pre}/left", 1)) == world:  # the last one out resets it
        await store.delete_key(f"{pre}/arrived")
        await store.delete_key(f"{pre}/left")
        await store.delete_key(f"{pre}/open")


async def _evaluator(fixed: bool) -> int:
    store = await _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    for epoch in range(SYNC_EPOCHS):
        await asyncio.sleep(random.uniform(0.2e-3, 2e-3))  # train the epoch
        await store.set(f"eval/{epoch}/{rank}", str(random.random()))
        await _store_barrier(store, world, epoch, fixed)
        if not await store.check([f"eval/{epoch}/{r}" for r in range(world)]):
            raise AssertionError(f"rank {rank} passed the epoch {epoch} barrier before every rank had evaluated")
    await _finish()
    return SYNC_EPOCHS


barrier_reuse, barrier_reuse_fixed = _twins("barrier_reuse", _evaluator)


# ------------------------------------------- 9. restart amnesia: preprocessing workers and their output files

ITEMS = 18


async def _preprocess(fixed: bool) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    incarnation = int(os.environ.get("AIODIST_RESTART_COUNT", "0"))
    server = await dist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await dist.TCPStore.connect(host, port, timeout=60)
    workers = range(1, world)
    try:
        if rank == 0:  # the coordinator: wait for every worker's output, check it, let them go
            await store.wait([f"pre/finished/{w}" for w in workers], timeout=120)
            counts = [0] * ITEMS
            for w in workers:
                for entry in (await store.get(f"pre/out/{w}")).decode().split("|", 1)[1].split(";")[:-1]:
                    counts[int(entry)] += 1
            wrong = [(i, n) for i, n in enumerate(counts) if n != 1]
            await store.set("pre/checked", "1")
            if wrong:
                raise AssertionError(f"items written other than once (item, times): {wrong}")
            await store.wait([f"pre/left/{w}" for w in workers], timeout=60)
            return ITEMS
        if incarnation:
            print(f"rank {rank}: restarted ({incarnation}), rejoining the pipeline", flush=True)
        key = f"pre/out/{rank}"
        cur = (await store.compare_set(key, "", f"{incarnation}|")).decode()  # open the output file
        done: set[int] = set()
        if fixed:  # fence the predecessor's in-flight writes out, and resume after what it wrote
            while not cur.startswith(f"{incarnation}|"):
                cur = (await store.compare_set(key, cur, f"{incarnation}|{cur.split('|', 1)[1]}")).decode()
            done = {int(i) for i in cur.split("|", 1)[1].split(";")[:-1]}
        for item in range(rank - 1, ITEMS, world - 1):
            if item in done:
                continue
            await asyncio.sleep(random.uniform(2e-3, 8e-3))  # decode, resize, tokenize
            if fixed:
                new = f"{cur}{item};"
                if (await store.compare_set(key, cur, new)).decode() != new:
                    raise AssertionError(f"rank {rank}: output {key} changed under incarnation {incarnation}")
                cur = new
            else:
                await store.append(key, f"{item};")
        await store.set(f"pre/finished/{rank}", str(incarnation))
        await store.wait(["pre/checked"], timeout=120)
        await store.set(f"pre/left/{rank}", "1")
        return ITEMS // (world - 1)
    finally:
        await store.close()
        if server is not None:
            await server.close()


restart_amnesia, restart_amnesia_fixed = _twins("restart_amnesia", _preprocess)


# ------------------------------------------- 10. split brain: a primary, a standby and a log in the store

HB = 71
HB_INTERVAL = 0.1
PROMOTE_AFTER = 1.0  # ten missed heartbeats
LOG_ENTRIES = 40


async def _append_entry(store: dist.Store, rank: int, seq: int, epoch: int, fixed: bool) -> bool:
    """Append entry ``seq``; False when a newer epoch fenced this writer out (only with ``fixed``)."""
    if not fixed:
        await store.append("repl/log", f"{rank}:{seq};")
        return True
    cur = (await store.get("repl/log")).decode()
    while True:
        head, entries = cur.split("|", 1)
        if int(head) != epoch:
            return False
        new = f"{head}|{entries}{rank}:{seq};"
        got = (await store.compare_set("repl/log", cur, new)).decode()
        if got == new:
            return True
        cur = got


async def _claim(store: dist.Store, epoch: int) -> int:
    """Fixed twin: stamp the log with this primary's epoch (fencing the old one out); the next seq."""
    cur = (await store.get("repl/log")).decode()
    while True:
        new = f"{epoch}|{cur.split('|', 1)[1]}"
        got = (await store.compare_set("repl/log", cur, new)).decode()
        if got == new:
            return got.count(";")
        cur = got


async def _heartbeats(stop: asyncio.Event) -> None:
    while not stop.is_set():
        await dist.send(np.array([1.0]), dst=2, tag=HB)
        try:
            await asyncio.wait_for(stop.wait(), HB_INTERVAL)
        except TimeoutError:
            pass
    await dist.send(np.array([0.0]), dst=2, tag=HB)  # goodbye: the primary is done


async def _replica(fixed: bool) -> int:
    store = await _init()
    rank = dist.get_rank()
    written = 0
    if rank == 0:  # the log's host: check it once both replicas are done
        await store.set("repl/log", "1|")
        await store.set("repl/epoch", "1")
        await store.wait(["repl/done/1", "repl/done/2"], timeout=120)
        log = (await store.get("repl/log")).decode().split("|", 1)[1]
        entries = [tuple(map(int, e.split(":"))) for e in log.split(";")[:-1]]
        writers = [w for w, _ in entries]
        if 2 in writers and 1 in writers[writers.index(2):]:
            raise AssertionError(f"split brain: rank 1 still wrote to the log after rank 2 took over: {writers}")
        if [s for _, s in entries] != list(range(LOG_ENTRIES)):
            raise AssertionError(f"log sequence is {[s for _, s in entries]}")
    elif rank == 1:  # the primary, epoch 1
        await store.wait(["repl/log"], timeout=30)
        stop = asyncio.Event()
        beat = asyncio.ensure_future(_heartbeats(stop))
        for seq in range(LOG_ENTRIES):
            if not await _append_entry(store, rank, seq, 1, fixed):
                break  # fenced out: a newer primary exists
            written += 1
            await asyncio.sleep(0.05)  # serve the next request
        stop.set()
        await beat
        await store.set("repl/done/1", "1")
    elif rank == 2:  # the standby: promote itself after PROMOTE_AFTER without a heartbeat
        await store.wait(["repl/log"], timeout=30)
        loop = asyncio.get_running_loop()
        last, alive, buf = loop.time(), True, np.zeros(1)

        async def watch() -> None:
            nonlocal last, alive
            while alive:
                await dist.recv(buf, src=1, tag=HB, timeout=120)
                last, alive = loop.time(), bool(buf[0])

        watcher = asyncio.ensure_future(watch())
        while alive and loop.time() - last <= PROMOTE_AFTER:
            await asyncio.sleep(HB_INTERVAL)
        if alive:  # the primary is gone: take over
            epoch = int(await store.add("repl/epoch", 1)) if fixed else 1
            seq = await _claim(store, epoch) if fixed else (await store.get("repl/log")).decode().count(";")
            for seq in range(seq, LOG_ENTRIES):
                if not await _append_entry(store, rank, seq, epoch, fixed):
                    break
                written += 1
                await asyncio.sleep(0.05)
        await watcher  # the old primary's heartbeats, until its goodbye
        await store.set("repl/done/2", "1")
    await _finish()
    return written


split_brain, split_brain_fixed = _twins("split_brain", _replica)


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
WORLD = {"lost_update": 4, "check_then_act": 3, "lease": 4, "lost_wakeup": 4, "causal_order": 4,
         "any_source": 3, "tight_timeout": 4, "barrier_reuse": 4, "restart_amnesia": 4, "split_brain": 3}
SWARM_KINDS = {"restart_amnesia": frozenset({"restart"}), "split_brain": frozenset({"partition"})}
SYMPTOM = {
    "lost_update": ("AssertionError", "a step was lost"),
    "check_then_act": ("AssertionError", "expected one writer"),
    "lease": ("AssertionError", "compacted twice"),
    "lost_wakeup": ("StoreTimeoutError", "rl/bell"),
    "causal_order": ("AssertionError", "arrived before the plan"),
    "any_source": ("AssertionError", "assembled out of order"),
    "tight_timeout": ("AssertionError", "metrics are for step"),
    "barrier_reuse": ("AssertionError", "before every rank had evaluated"),
    "restart_amnesia": ("AssertionError", "written other than once"),
    "split_brain": ("AssertionError", "split brain"),
}
