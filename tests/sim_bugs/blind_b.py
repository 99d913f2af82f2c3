"""Blind check of the simulator's bug finding (issue 12), classes B: ten programs, each with its fixed twin.

Written from the outside, the way a user would, without reading the simulator's
own bug programs. Five classes, two programs of different shapes each:

* causal order across two different senders: ``causal_publish_eval`` (a trainer
  publishes weights to a parameter server, then tells an evaluator, whose request
  reaches the server first) and ``causal_read_your_writes`` (a writer updates a
  cache, then acknowledges a client, whose read reaches the cache first);
* any-source arrival order when one sender does a few store round trips first:
  ``anysource_dataset`` (rank 0 assembles two shards in arrival order; rank 2
  reads its dataset's location from the store first) and
  ``anysource_weighted_grads`` (a parameter server weighs gradients by the order
  of its ``irecv`` handles; worker 2 logs metrics to the store every step first);
* a receive timeout too tight for the latency tail: ``timeout_step_results``
  (``asyncio.wait_for`` around ``recv``; a late result is taken for the next
  step's) and ``timeout_store_rpc`` (an RPC over store queues; a late reply is
  popped as the next request's);
* a store barrier reused without generations: ``barrier_gate_reused`` (a
  counter opens a gate, the last one out closes it) and ``barrier_flags_reused``
  (per-rank flags, each deleted by its owner once through);
* split brain, heartbeat promotion without an epoch under a one-way partition:
  ``split_brain_log_server`` (primary and standby write to a log server that
  checks the sequence) and ``split_brain_store_state`` (leader and standby apply
  commands from a store queue and write the state to the store).

Each ``X`` has ``X_fixed``. A program raises ``AssertionError`` (or lets a store
timeout surface) when its bug bites. To run one for real::

    BLIND_B=causal_publish_eval aiodist run -n 3 tests/sim_bugs/blind_b.py
"""

from __future__ import annotations

import asyncio
import os

import numpy as np

import aiodist
import aiodist as dist

# --------------------------------------------------------------------------- causal order (2 senders)
# causal_publish_eval, world 3: rank 0 parameter server, rank 1 trainer, rank 2 evaluator.

TO_SERVER, NOTIFY, SCORE = 1, 2, 3
PUBLISH, EVAL = 1.0, 2.0
DIM = 2048
VERSIONS = 8


async def _publish_eval(fixed: bool) -> int:
    await dist.init_process_group()
    rank = dist.get_rank()
    msg = np.zeros(2 + DIM)  # [kind, version, weights...]
    if rank == 0:
        weights: dict[int, np.ndarray] = {}
        evaluated = 0
        while evaluated < VERSIONS or len(weights) < VERSIONS:
            src = await dist.recv(msg, tag=TO_SERVER)
            kind, version = msg[0], int(msg[1])
            if kind == PUBLISH:
                weights[version] = msg[2:].copy()
                continue
            if fixed:  # the request may overtake the weights: wait for them from the trainer itself
                while version not in weights:
                    pub = np.zeros(2 + DIM)
                    await dist.recv(pub, src=1, tag=TO_SERVER)
                    weights[int(pub[1])] = pub[2:].copy()
            # the trainer sent version v here before it told the evaluator about v
            if version not in weights:
                raise AssertionError(f"evaluation of version {version} requested, but the server has {sorted(weights)}")
            score = float(weights[version].sum())
            await dist.send(np.array([float(version), score]), dst=src, tag=SCORE)
            evaluated += 1
    elif rank == 1:
        w = np.zeros(DIM)
        for version in range(1, VERSIONS + 1):
            await asyncio.sleep(0.001)  # simulate a training step
            w += 0.01
            msg[0], msg[1], msg[2:] = PUBLISH, version, w
            await dist.send(msg, dst=0, tag=TO_SERVER)
            await dist.send(np.array([float(version)]), dst=2, tag=NOTIFY)
    else:
        note, reply = np.zeros(1), np.zeros(2)
        for _ in range(VERSIONS):
            await dist.recv(note, src=1, tag=NOTIFY)
            msg[:] = 0
            msg[0], msg[1] = EVAL, note[0]
            await dist.send(msg, dst=0, tag=TO_SERVER)
            await dist.recv(reply, src=0, tag=SCORE)
    await dist.destroy_process_group()
    return rank


async def causal_publish_eval() -> int:
    """Bug: the server assumes the trainer's weights reach it before the evaluator's request for them."""
    return await _publish_eval(fixed=False)


async def causal_publish_eval_fixed() -> int:
    """Fixed: a request for weights not yet in waits for them from the trainer."""
    return await _publish_eval(fixed=True)


# causal_read_your_writes, world 4, torch style: rank 0 writer, rank 1 cache, ranks 2.. clients.

TO_CACHE, COMMITTED, REPLY = 11, 12, 13
UPDATE, READ, STOP = 1, 2, 3
WRITES = 12


def _value(version: int) -> int:
    return 1000 + 7 * version


async def _read_your_writes(fixed: bool) -> int:
    await dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    writer, cache, clients = 0, 1, list(range(2, world))
    if rank == writer:
        for version in range(1, WRITES + 1):
            await asyncio.sleep(0.0005)  # the database commits the write
            await dist.send(np.array([UPDATE, version, _value(version)]), dst=cache, tag=TO_CACHE)  # refresh the cache,
            client = clients[version % len(clients)]
            await dist.send(np.array([version]), dst=client, tag=COMMITTED)  # then acknowledge the client
        await dist.send(np.array([STOP, 0, 0]), dst=cache, tag=TO_CACHE)
    elif rank == cache:
        version, value = 0, 0
        stopped = 0
        req = np.zeros(3, dtype=np.int64)
        while stopped < 1 + len(clients):
            src = await dist.recv(req, tag=TO_CACHE)
            if req[0] == UPDATE:
                if req[1] > version:
                    version, value = int(req[1]), int(req[2])
            elif req[0] == READ:
                if fixed:  # a client that saw version v committed must read v or later: catch up with the writer
                    while version < req[1]:
                        upd = np.zeros(3, dtype=np.int64)
                        await dist.recv(upd, src=writer, tag=TO_CACHE)
                        if upd[0] == UPDATE and upd[1] > version:
                            version, value = int(upd[1]), int(upd[2])
                await dist.send(np.array([version, value]), dst=src, tag=REPLY)
            else:
                stopped += 1
    else:
        committed = np.zeros(1, dtype=np.int64)
        reply = np.zeros(2, dtype=np.int64)
        mine = [v for v in range(1, WRITES + 1) if clients[v % len(clients)] == rank]
        for _ in mine:
            await dist.recv(committed, src=writer, tag=COMMITTED)
            await dist.send(np.array([READ, committed[0], 0]), dst=cache, tag=TO_CACHE)
            await dist.recv(reply, src=cache, tag=REPLY)
            # read-your-writes: the writer refreshed the cache before it acknowledged us
            if reply[0] < committed[0]:
                raise AssertionError(f"rank {rank}: write {committed[0]} was committed, the cache returned version {reply[0]}")
        await dist.send(np.array([STOP, 0, 0]), dst=cache, tag=TO_CACHE)
    await dist.destroy_process_group()
    return rank


async def causal_read_your_writes() -> int:
    """Bug: the cache serves requests in arrival order; a client's read can overtake the writer's update."""
    return await _read_your_writes(fixed=False)


async def causal_read_your_writes_fixed() -> int:
    """Fixed: a read names the version the client saw committed; the cache catches up before it answers."""
    return await _read_your_writes(fixed=True)


# --------------------------------------------------------------------------- any-source order after store round trips
# anysource_dataset, world 3: rank 0 assembles the dataset's statistics; rank 1's shard is local,
# rank 2 first looks its shard up in the store.

ROWS = 64


def _shard(rank: int, rows: int) -> np.ndarray:
    return np.arange(rows, dtype=np.float64) * rank + rank


async def _dataset(fixed: bool) -> int:
    pg = await aiodist.init_process_group()
    store = pg.store
    buf = np.zeros(ROWS)
    if pg.rank == 0:
        await store.set("dataset/remote/path", "/mnt/data/part-2.npy")
        await store.set("dataset/remote/rows", str(ROWS))
        parts: dict[int, np.ndarray] = {}
        if fixed:
            for _ in (1, 2):
                src = await aiodist.recv(buf)
                parts[src] = buf.copy()
        else:
            for expected in (1, 2):  # rank 1 is first: rank 2 looks its shard up in the store before it starts
                await aiodist.recv(buf)
                parts[expected] = buf.copy()
        full = np.concatenate([parts[1], parts[2]])
        reference = np.concatenate([_shard(1, ROWS), _shard(2, ROWS)])
        if not np.array_equal(full, reference):
            raise AssertionError("the assembled dataset does not match the shards (shards out of order)")
    elif pg.rank == 1:
        buf[:] = _shard(1, ROWS)
        await aiodist.send(buf, dst=0)
    else:
        path = (await store.get("dataset/remote/path")).decode()
        rows = int(await store.get("dataset/remote/rows"))
        await store.add("dataset/readers", 1)
        assert path.endswith(".npy")
        buf[:] = _shard(2, rows)
        await aiodist.send(buf, dst=0)
    await aiodist.destroy_process_group()
    return pg.rank


async def anysource_dataset() -> int:
    """Bug: rank 0 files the first shard to arrive as rank 1's, the second as rank 2's."""
    return await _dataset(fixed=False)


async def anysource_dataset_fixed() -> int:
    """Fixed: rank 0 files each shard under the source ``recv`` returns."""
    return await _dataset(fixed=True)


# anysource_weighted_grads, world 3: rank 0 parameter server, workers 1 and 2 with unequal shards;
# worker 2 also logs its loss to the store every step before it sends its gradient.

GRAD, PARAMS = 21, 22
SAMPLES = {1: 96, 2: 32}
STEPS = 10
LR = 0.1
PDIM = 8


def _target(rank: int) -> np.ndarray:
    return np.linspace(-1.0, 1.0, PDIM) * (rank + 1)


def _grad(params: np.ndarray, rank: int) -> np.ndarray:
    grad: np.ndarray = params - _target(rank)
    return grad


def _reference_params() -> np.ndarray:
    params = np.zeros(PDIM)
    total = sum(SAMPLES.values())
    for _ in range(STEPS):
        g = sum(SAMPLES[w] * _grad(params, w) for w in (1, 2)) / total
        params = params - LR * g
    return params


async def _weighted(fixed: bool) -> float:
    pg = await dist.init_process_group("gloo")
    rank = dist.get_rank()
    params = np.zeros(PDIM)
    if rank == 0:
        total = sum(SAMPLES.values())
        for _ in range(STEPS):
            inbox = [np.zeros(PDIM), np.zeros(PDIM)]
            handles = [dist.irecv(buf, tag=GRAD) for buf in inbox]
            grads: dict[int, np.ndarray] = {}
            for i, (buf, handle) in enumerate(zip(inbox, handles)):
                sender = await handle.wait()
                # worker 1 reports first: worker 2 writes its metrics to the store before it sends
                grads[sender if fixed else i + 1] = buf
            g = sum(SAMPLES[w] * grads[w] for w in (1, 2)) / total
            params -= LR * g
            for work in [dist.isend(params.copy(), dst=w, tag=PARAMS) for w in (1, 2)]:
                await work.wait()
        if not np.allclose(params, _reference_params()):
            raise AssertionError(f"parameters {params[:3]}... differ from the single-process reference {_reference_params()[:3]}...")
    else:
        for step in range(STEPS):
            g = _grad(params, rank)
            if rank == 2:  # the logging rank: its loss goes to the store for the dashboard
                loss = float((g**2).sum() / 2)
                await pg.store.set(f"metrics/step{step}/loss", f"{loss:.6f}")
                await pg.store.add("metrics/points", 1)
            await dist.send(g, dst=0, tag=GRAD)
            await dist.recv(params, src=0, tag=PARAMS)
    await dist.destroy_process_group()
    return float(params.sum())


async def anysource_weighted_grads() -> float:
    """Bug: the server takes its first ``irecv`` handle for worker 1's gradient (it weighs it by worker 1's samples)."""
    return await _weighted(fixed=False)


async def anysource_weighted_grads_fixed() -> float:
    """Fixed: each handle's sender weighs its gradient."""
    return await _weighted(fixed=True)


# --------------------------------------------------------------------------- receive timeout too tight for the tail
# timeout_step_results, world 3: rank 0 hands out a task per step and waits 10 ms for each worker's
# result (a result takes well under a millisecond); a worker that misses it is left out of the step.

TASK, RESULT = 31, 32
ROUNDS = 20
RESULT_TIMEOUT = 0.01


def _result(step: int, rank: int) -> float:
    return float(100 * step + rank)


async def _step_results(fixed: bool) -> int:
    await dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    workers = range(1, world)
    loop = asyncio.get_running_loop()
    reply = np.zeros(2)  # [step, result]
    if rank == 0:
        results: dict[tuple[int, int], float] = {}
        skipped = 0
        for step in range(ROUNDS):
            for w in workers:
                await dist.send(np.array([float(step)]), dst=w, tag=TASK)
            for w in workers:
                deadline = loop.time() + RESULT_TIMEOUT
                try:
                    await asyncio.wait_for(dist.recv(reply, src=w, tag=RESULT), timeout=RESULT_TIMEOUT)
                    while fixed and reply[0] != step:  # a late result of an earlier step: drop it
                        await asyncio.wait_for(dist.recv(reply, src=w, tag=RESULT), timeout=max(0.0, deadline - loop.time()))
                    results[(step, w)] = reply[1]
                except asyncio.TimeoutError:
                    skipped += 1  # a straggler: this step goes on without it
        for w in workers:  # stop; each worker says goodbye after its last result, so nothing is left in flight
            await dist.send(np.array([-1.0]), dst=w, tag=TASK)
            for _ in range(ROUNDS + 1):
                await dist.recv(reply, src=w, tag=RESULT)
                if reply[0] < 0:
                    break
        wrong = {key: got for key, got in results.items() if got != _result(*key)}
        if wrong:
            raise AssertionError(f"{len(wrong)} results were filed under the wrong step ({skipped} skipped), e.g. {next(iter(wrong.items()))}")
    else:
        task = np.zeros(1)
        for _ in range(ROUNDS + 1):
            await dist.recv(task, src=0, tag=TASK)
            if task[0] < 0:
                await dist.send(np.array([-1.0, 0.0]), dst=0, tag=RESULT)
                break
            await asyncio.sleep(0.0002)  # simulate work
            step = int(task[0])
            await dist.send(np.array([float(step), _result(step, rank)]), dst=0, tag=RESULT)
    await dist.destroy_process_group()
    return rank


async def timeout_step_results() -> int:
    """Bug: after a timeout the worker's late result is taken as its result for the next step."""
    return await _step_results(fixed=False)


async def timeout_step_results_fixed() -> int:
    """Fixed: results carry their step; a late one is dropped."""
    return await _step_results(fixed=True)


# timeout_store_rpc, world 2, store only: rank 0 calls rank 1 through two store queues and waits
# 50 ms for each reply (it takes well under a millisecond); on a timeout it computes the answer itself.

CALLS = 30
RPC_TIMEOUT = 0.05


async def _store_rpc(fixed: bool) -> int:
    rank = int(os.environ["RANK"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    server = await aiodist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await aiodist.TCPStore.connect(host, port, timeout=30.0)
    try:
        if rank == 0:
            answers: list[tuple[int, int]] = []
            for call in range(CALLS):
                await store.queue_push("rpc/requests", str(call))
                try:
                    reply = (await store.queue_pop("rpc/replies", timeout=RPC_TIMEOUT)).decode()
                    while fixed and int(reply.split(":")[0]) != call:  # a late reply to an earlier call: drop it
                        reply = (await store.queue_pop("rpc/replies", timeout=RPC_TIMEOUT)).decode()
                    answers.append((call, int(reply.split(":")[1])))
                except aiodist.StoreTimeoutError:
                    answers.append((call, call * call))  # the server is busy: compute it here
            await store.queue_push("rpc/requests", "stop")
            await store.wait(["rpc/server-done"], timeout=30.0)
            wrong = [(call, got) for call, got in answers if got != call * call]
            if wrong:
                raise AssertionError(f"{len(wrong)} calls got another call's reply, e.g. call {wrong[0][0]} got {wrong[0][1]}")
        else:
            for _ in range(CALLS + 1):
                request = (await store.queue_pop("rpc/requests", timeout=30.0)).decode()
                if request == "stop":
                    break
                await asyncio.sleep(0.0002)  # simulate work
                call = int(request)
                await store.queue_push("rpc/replies", f"{call}:{call * call}")
            await store.set("rpc/server-done", "1")
        return rank
    finally:
        await store.close()
        if server is not None:
            await server.close()


async def timeout_store_rpc() -> int:
    """Bug: after a timeout the late reply sits in the queue and is popped as the next call's."""
    return await _store_rpc(fixed=False)


async def timeout_store_rpc_fixed() -> int:
    """Fixed: replies name their call; a late one is dropped."""
    return await _store_rpc(fixed=True)


# --------------------------------------------------------------------------- store barrier reused without generations
# barrier_gate_reused, world 4: every epoch each rank reports its loss to the store, meets the others
# at a store barrier, then reads everyone's loss.

EPOCHS = 6


async def _gate_barrier(store: aiodist.Store, world: int) -> None:
    """The last one in opens the gate; the last one out closes it again for the next time."""
    if await store.add("barrier/arrived", 1) == world:
        await store.set("barrier/arrived", "0")
        await store.set("barrier/open", "1")
    await store.wait(["barrier/open"], timeout=30.0)
    if await store.add("barrier/left", 1) == world:
        await store.set("barrier/left", "0")
        await store.delete_key("barrier/open")


async def _gate_barrier_gen(store: aiodist.Store, world: int, gen: int) -> None:
    """The same gate, a new one for every use."""
    if await store.add(f"barrier/{gen}/arrived", 1) == world:
        await store.set(f"barrier/{gen}/open", "1")
    await store.wait([f"barrier/{gen}/open"], timeout=30.0)


async def _gate_epochs(fixed: bool) -> float:
    pg = await aiodist.init_process_group()
    store, rank, world = pg.store, pg.rank, pg.size
    mean = 0.0
    for epoch in range(EPOCHS):
        await asyncio.sleep(0.001)  # simulate an epoch of training
        await store.set(f"loss/{epoch}/{rank}", f"{1.0 / (epoch + 1) + rank * 0.01:.4f}")
        if fixed:
            await _gate_barrier_gen(store, world, epoch)
        else:
            await _gate_barrier(store, world)
        keys = [f"loss/{epoch}/{r}" for r in range(world)]
        if not await store.check(keys):
            raise AssertionError(f"rank {rank} passed the barrier of epoch {epoch} before every rank reported its loss")
        mean = sum(float(v) for v in await store.multi_get(keys)) / world
    await aiodist.destroy_process_group()
    return mean


async def barrier_gate_reused() -> float:
    """Bug: a rank back at the gate before the last one left finds it still open."""
    return await _gate_epochs(fixed=False)


async def barrier_gate_reused_fixed() -> float:
    """Fixed: one gate per generation."""
    return await _gate_epochs(fixed=True)


# barrier_flags_reused, world 5, torch style: data-parallel steps with all_reduce; at the end of every
# epoch each rank saves its checkpoint shard, names it in the store, and a store barrier (per-rank
# "ready" flags) lets rank 0 write the manifest.

FLAG_EPOCHS = 4
STEPS_PER_EPOCH = 3


async def _flags_barrier(store: aiodist.Store, rank: int, world: int, gen: int | None) -> None:
    prefix = "ready" if gen is None else f"ready/{gen}"
    await store.set(f"{prefix}/{rank}", "1")
    await store.wait([f"{prefix}/{r}" for r in range(world)], timeout=30.0)
    if gen is None:
        await store.delete_key(f"{prefix}/{rank}")  # clean up for the next barrier


async def _flags_epochs(fixed: bool) -> float:
    pg = await dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    weights = np.zeros(4)
    for epoch in range(FLAG_EPOCHS):
        for step in range(STEPS_PER_EPOCH):
            grad = np.full(4, float(rank + step))
            await dist.all_reduce(grad, op=dist.ReduceOp.AVG)
            weights -= 0.1 * grad
        await pg.store.set(f"ckpt/{epoch}/{rank}", f"/ckpt/epoch{epoch}/shard{rank}.npy")
        await _flags_barrier(pg.store, rank, world, epoch if fixed else None)
        if rank == 0:
            keys = [f"ckpt/{epoch}/{r}" for r in range(world)]
            if not await pg.store.check(keys):
                raise AssertionError(f"epoch {epoch}: the barrier let rank 0 write the manifest before every shard was saved")
            await pg.store.set(f"ckpt/{epoch}/manifest", ",".join(v.decode() for v in await pg.store.multi_get(keys)))
    await dist.destroy_process_group()
    return float(weights.sum())


async def barrier_flags_reused() -> float:
    """Bug: a flag deleted by its owner can be missed by a slower rank, and one not yet deleted opens the next barrier."""
    return await _flags_epochs(fixed=False)


async def barrier_flags_reused_fixed() -> float:
    """Fixed: flags per generation, never deleted while someone may still wait for them."""
    return await _flags_epochs(fixed=True)


# --------------------------------------------------------------------------- split brain (heartbeats, no epoch)
# Both programs: rank 1 leads and sends a heartbeat to rank 2 every 10 ms; rank 2 takes over when it
# has heard none for 100 ms. Rank 0 is the shared resource's side.

HB_INTERVAL = 0.01
HB_TIMEOUT = 0.1
ALIVE, DONE = 1, 2


async def _heartbeats(stop: asyncio.Event) -> None:
    """The leader's heartbeat to the standby; a standby that cannot be reached does not stop the leader."""
    beat = np.array([ALIVE], dtype=np.int64)
    while not stop.is_set():
        try:
            await dist.send(beat, dst=2, tag=HEARTBEAT, timeout=1.0)
        except (aiodist.AiodistError, TimeoutError):
            return
        try:
            await asyncio.wait_for(stop.wait(), timeout=HB_INTERVAL)
        except asyncio.TimeoutError:
            pass


async def _lead(work: object) -> None:
    """Run ``work`` (a coroutine) as the leader: heartbeats meanwhile, then a last one saying it is done."""
    stop = asyncio.Event()
    beats = asyncio.create_task(_heartbeats(stop))
    try:
        await work  # type: ignore[misc]
    finally:
        stop.set()
        await beats
    try:
        await dist.send(np.array([DONE], dtype=np.int64), dst=2, tag=HEARTBEAT, timeout=1.0)
    except (aiodist.AiodistError, TimeoutError):
        pass


async def _leader_silent() -> bool:
    """The standby: True when the leader went silent for HB_TIMEOUT, False when it said it is done."""
    beat = np.zeros(1, dtype=np.int64)
    while True:
        try:
            await asyncio.wait_for(dist.recv(beat, src=1, tag=HEARTBEAT), timeout=HB_TIMEOUT)
        except (asyncio.TimeoutError, aiodist.AiodistError):
            return True
        if beat[0] == DONE:
            return False


# split_brain_log_server, world 3: rank 0 keeps an append-only log whose entries must be numbered
# 1, 2, 3...; the leader appends, the standby that takes over first asks where the log is.

TO_LOG, ACK, HEARTBEAT = 41, 42, 43
WRITE, CLAIM, BYE = 1, 2, 3
ACCEPTED, FENCED = 0, 1
ENTRIES = 150


async def _append_entries(epoch: int, last: int) -> None:
    reply = np.zeros(2, dtype=np.int64)
    me = dist.get_rank()
    while last < ENTRIES:
        await asyncio.sleep(0.002)  # prepare the next entry
        await dist.send(np.array([WRITE, epoch, last + 1, me], dtype=np.int64), dst=0, tag=TO_LOG)
        await dist.recv(reply, src=0, tag=ACK)
        if reply[0] == FENCED:
            return  # a newer leader took over: step down
        last += 1


async def _take_over_log(store: aiodist.Store, fixed: bool) -> None:
    """Lead the log: ask the log server where it is, then go on appending."""
    epoch = await store.add("leader/epoch", 1) if fixed else 0
    reply = np.zeros(2, dtype=np.int64)
    await dist.send(np.array([CLAIM, epoch, 0, dist.get_rank()], dtype=np.int64), dst=0, tag=TO_LOG)
    await dist.recv(reply, src=0, tag=ACK)
    if reply[0] == ACCEPTED:
        await _append_entries(epoch, int(reply[1]))


async def _log_server(fixed: bool) -> int:
    msg = np.zeros(4, dtype=np.int64)  # [kind, epoch, seq, writer]
    last, newest_epoch, byes = 0, 0, 0
    while byes < 2:
        src = await dist.recv(msg, tag=TO_LOG)
        kind, epoch, seq = int(msg[0]), int(msg[1]), int(msg[2])
        if kind == BYE:
            byes += 1
            continue
        if fixed and epoch < newest_epoch:
            await dist.send(np.array([FENCED, last], dtype=np.int64), dst=src, tag=ACK)
            continue
        newest_epoch = max(newest_epoch, epoch)
        if kind == WRITE:
            if seq != last + 1:
                raise AssertionError(f"log entry {seq} from rank {src} after entry {last}: two writers")
            last = seq
        await dist.send(np.array([ACCEPTED, last], dtype=np.int64), dst=src, tag=ACK)
    return last


async def _log_writers(fixed: bool) -> int:
    pg = await dist.init_process_group()
    rank = pg.rank
    result = 0
    if rank == 0:
        result = await _log_server(fixed)
    elif rank == 1:
        await _lead(_take_over_log(pg.store, fixed))
        await dist.send(np.array([BYE, 0, 0, rank], dtype=np.int64), dst=0, tag=TO_LOG)
    elif rank == 2:
        if await _leader_silent():
            await _take_over_log(pg.store, fixed)
        await dist.send(np.array([BYE, 0, 0, rank], dtype=np.int64), dst=0, tag=TO_LOG)
    await dist.barrier()  # leave together: a rank that left would fail the others' group
    await dist.destroy_process_group()
    return result


async def split_brain_log_server() -> int:
    """Bug: a standby that misses heartbeats takes over while the old leader goes on appending."""
    return await _log_writers(fixed=False)


async def split_brain_log_server_fixed() -> int:
    """Fixed: each leader gets an epoch from the store; the log server refuses older epochs (a fencing token)."""
    return await _log_writers(fixed=True)


# split_brain_store_state, world 3, torch style: rank 0 pushes commands to a store queue; the leader
# pops them, applies them to its copy of the state, and writes the state to the store. Rank 0 then
# checks that every command is in the state.

COMMANDS = 120


def _encode(epoch: int, total: int, applied: int) -> str:
    return f"{epoch}:{total}:{applied}"


def _decode(raw: bytes) -> tuple[int, int, int]:
    epoch, total, applied = (int(x) for x in raw.decode().split(":"))
    return epoch, total, applied


async def _apply_commands(store: aiodist.Store, epoch: int, fixed: bool) -> None:
    if fixed:  # claim the state for this epoch: an older leader's next write then fails
        while True:
            current = await store.get("state")
            _, total, applied = _decode(current)
            written = _encode(epoch, total, applied)
            if (await store.compare_set("state", current, written)).decode() == written:
                break
    else:
        _, total, applied = _decode(await store.get("state"))
        written = _encode(epoch, total, applied)
    while True:
        try:
            command = await store.queue_pop("commands", timeout=0.05)
        except aiodist.StoreTimeoutError:
            if await store.check(["commands/done"]):
                return
            continue
        total, applied = total + int(command), applied + 1
        new = _encode(epoch, total, applied)
        if fixed:
            if (await store.compare_set("state", written, new)).decode() != new:
                await store.queue_push("commands", command)  # a newer leader: hand the command back, step down
                return
        else:
            await store.set("state", new)
        written = new
        if await store.add("commands/applied", 1) == COMMANDS:
            await store.set("commands/all-applied", "1")


async def _store_state(fixed: bool) -> int:
    pg = await dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    store = pg.store
    total = 0
    if rank == 0:
        await store.set("state", _encode(0, 0, 0))
        await store.set("state/ready", "1")
        for command in range(1, COMMANDS + 1):
            await store.queue_push("commands", str(command))
            await asyncio.sleep(0.003)  # clients' commands trickle in
        await store.wait(["commands/all-applied"], timeout=60.0)
        await store.set("commands/done", "1")
        _, total, applied = _decode(await store.get("state"))
        if total != COMMANDS * (COMMANDS + 1) // 2:
            raise AssertionError(f"the state holds {applied} commands (total {total}): commands were lost between two leaders")
    elif rank == 1:
        await store.wait(["state/ready"], timeout=60.0)
        epoch = await store.add("leader/epoch", 1) if fixed else 0
        await _lead(_apply_commands(store, epoch, fixed))
    elif rank == 2:
        if await _leader_silent():
            epoch = await store.add("leader/epoch", 1) if fixed else 0
            await _apply_commands(store, epoch, fixed)
    await dist.barrier()  # leave together: a rank that left would fail the others' group
    await dist.destroy_process_group()
    return total


async def split_brain_store_state() -> int:
    """Bug: the standby takes over while the old leader goes on writing its own copy of the state."""
    return await _store_state(fixed=False)


async def split_brain_store_state_fixed() -> int:
    """Fixed: a leader claims the state with an epoch from the store and writes it with compare_set only."""
    return await _store_state(fixed=True)


# --------------------------------------------------------------------------- for real: BLIND_B=name aiodist run -n N this file

PROGRAMS = {
    "causal_publish_eval": 3,
    "causal_read_your_writes": 4,
    "anysource_dataset": 3,
    "anysource_weighted_grads": 3,
    "timeout_step_results": 3,
    "timeout_store_rpc": 2,
    "barrier_gate_reused": 4,
    "barrier_flags_reused": 5,
    "split_brain_log_server": 3,
    "split_brain_store_state": 3,
}
"""Each buggy program's world size (its twin is ``<name>_fixed``, same size)."""


async def main() -> object:
    """The program named by ``BLIND_B`` (default ``causal_publish_eval``)."""
    prog = globals()[os.environ.get("BLIND_B", "causal_publish_eval")]
    return await prog()
