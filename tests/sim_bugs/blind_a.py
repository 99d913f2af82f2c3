"""Bug programs written blind (without reading the simulator's own ones), classes A of issue 12.

Five classes, two programs each, every program with its fixed twin:

* lost update (get, then set): :func:`samples_seen` (store only, a progress
  counter) and :func:`work_cursor` (a process group, a shared work cursor);
* check-then-act leader election: :func:`index_builder` (store only) and
  :func:`epoch_evaluator` (a training loop, "the first to finish evaluates");
* a lease without fencing held by a rank that becomes slow:
  :func:`model_lock` (a lock with a lease guarding a read-modify-write) and
  :func:`task_leases` (work items with a visibility timeout);
* lost wake-up (a doorbell cleared after reading the counter):
  :func:`job_board` (store only) and :func:`shard_uploader` (a background
  task beside a training loop);
* restart amnesia (progress kept in memory only): :func:`row_totals` and
  :func:`message_sequence` (store only: a restarted rank reconnects).

Each program is an ``async def`` without arguments, run as every rank's
``main``; it raises ``AssertionError`` (or lets a timeout surface) when its
bug bites. ``<name>`` is the buggy program, ``<name>_fixed`` its twin; both
share one body with a ``fixed`` switch, so the fix is exactly the lines under
``if fixed``. The store-only programs read the launcher's environment
(``os.environ``) and rank 0 serves the store; the others use a process group
the torch way (``import aiodist as dist``) and its store.

World sizes (:data:`WORLD`) and the fault model each program needs
(:data:`SWARM_KINDS`: the restart-amnesia programs are found with
``faults=[sim.Swarm()]``, the others under the defaults) are listed below.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import numpy as np

import aiodist
import aiodist as dist

TIMEOUT = 30.0
"""Seconds any store call of these programs may wait."""


# --------------------------------------------------------------- common parts


def _launcher_env() -> tuple[int, int, str, int]:
    """RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as ``aiodist run`` (or the simulator) sets them."""
    env = os.environ
    return int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])


@contextlib.asynccontextmanager
async def _job_store() -> AsyncIterator[aiodist.TCPStore]:
    """The job's store: rank 0 serves it and keeps it up until every rank said goodbye."""
    rank, world, host, port = _launcher_env()
    server = await aiodist.StoreServer.start(host=host, port=port) if rank == 0 else None
    try:
        store = await aiodist.TCPStore.connect(host, port, timeout=TIMEOUT)
        try:
            yield store
            await store.set(f"bye/{rank}", "")
            if server is not None:
                await store.wait([f"bye/{r}" for r in range(world)], timeout=TIMEOUT)
        finally:
            await store.close()
    finally:
        if server is not None:
            await server.close()


async def _all_arrive(store: aiodist.Store, name: str, world: int) -> None:
    """A store barrier used once: the last rank to arrive opens it."""
    if await store.add(f"{name}/count", 1) == world:
        await store.set(f"{name}/open", "")
    await store.wait([f"{name}/open"], timeout=TIMEOUT)


# ---------------------------------------------------------------- lost update


BATCHES = 8
BATCH_SIZE = 32


async def _samples_seen(*, fixed: bool) -> int:
    """Every rank trains BATCHES batches and adds its samples to a job-wide counter in the store.

    Bug: the counter is read, then written back (``get`` then ``set``): two
    ranks that finish a batch at about the same time both read the same
    value and one increment is lost. Fix: ``store.add``.
    """
    rank, world, _, _ = _launcher_env()
    async with _job_store() as store:
        if rank == 0:
            await store.set("samples_seen", "0")
        await store.wait(["samples_seen"], timeout=TIMEOUT)
        for _ in range(BATCHES):
            await asyncio.sleep(0.001)  # simulate work: one training batch
            if fixed:
                await store.add("samples_seen", BATCH_SIZE)
            else:
                seen = int(await store.get("samples_seen"))
                await store.set("samples_seen", str(seen + BATCH_SIZE))
        await _all_arrive(store, "trained", world)
        seen = int(await store.get("samples_seen"))
        expected = world * BATCHES * BATCH_SIZE
        if seen != expected:
            raise AssertionError(f"rank {rank}: samples_seen is {seen}, expected {expected} (lost update)")
        return seen


async def samples_seen() -> int:
    return await _samples_seen(fixed=False)


async def samples_seen_fixed() -> int:
    return await _samples_seen(fixed=True)


ITEMS = 24


async def _work_cursor(*, fixed: bool) -> int:
    """Ranks of a process group take work items from a shared cursor in the group's store.

    Bug: a rank takes the next item by reading the cursor and writing it
    back one higher: two ranks read the same cursor and do the same item
    twice. Fix: ``add`` hands out each item once.
    """
    pg = await dist.init_process_group(timeout=60)
    rank = dist.get_rank()
    store = dist.PrefixStore("cursor/", pg.store)
    if rank == 0:
        await store.set("next", "0")
    await dist.barrier()
    mine = 0
    while True:
        if fixed:
            item = await store.add("next", 1) - 1
        else:
            item = int(await store.get("next"))
            await store.set("next", str(item + 1))
        if item >= ITEMS:
            break
        await asyncio.sleep(0.0005 * (1 + item % 3))  # simulate work: items differ in size
        if await store.add(f"done/{item}", 1) != 1:
            raise AssertionError(f"rank {rank}: item {item} was processed twice (lost update of the cursor)")
        mine += 1
    count = np.array([mine], dtype=np.int64)
    await dist.all_reduce(count)
    if int(count[0]) != ITEMS:
        raise AssertionError(f"rank {rank}: {int(count[0])} items processed, expected {ITEMS}")
    await dist.destroy_process_group()
    return mine


async def work_cursor() -> int:
    return await _work_cursor(fixed=False)


async def work_cursor_fixed() -> int:
    return await _work_cursor(fixed=True)


# ------------------------------------------------------ check-then-act election


async def _index_builder(*, fixed: bool) -> int:
    """Once every rank is up, one of them builds the shared index; the others use it.

    Bug: a rank checks whether a leader is recorded and, if none is,
    records itself: two ranks that check before either sets both lead and
    the index is built twice. Fix: ``compare_set`` decides in one step.
    """
    rank, world, _, _ = _launcher_env()
    async with _job_store() as store:
        await _all_arrive(store, "up", world)
        if fixed:
            leader = int(await store.compare_set("leader", "", str(rank)))
        elif await store.check(["leader"]):
            leader = int(await store.get("leader"))
        else:
            await store.set("leader", str(rank))
            leader = rank
        if leader == rank:
            await asyncio.sleep(0.002)  # simulate work: build the index
            await store.add("index_builds", 1)
            await store.set("index", f"built by rank {rank}")
        await store.wait(["index"], timeout=TIMEOUT)
        await _all_arrive(store, "indexed", world)
        builds = int(await store.get("index_builds"))
        if builds != 1:
            raise AssertionError(f"rank {rank}: the index was built {builds} times (two leaders)")
        return leader


async def index_builder() -> int:
    return await _index_builder(fixed=False)


async def index_builder_fixed() -> int:
    return await _index_builder(fixed=True)


EPOCHS = 4
STEPS_PER_EPOCH = 3


async def _epoch_evaluator(*, fixed: bool) -> list[int]:
    """Data-parallel training; after each epoch the first rank to get there evaluates the model.

    Bug: "first" is decided by checking whether the epoch's evaluator key
    exists and setting it if not: ranks leave the epoch's last all_reduce
    together, so two of them often both evaluate. Fix: ``compare_set``.
    """
    pg = await dist.init_process_group(timeout=60)
    rank = dist.get_rank()
    store = dist.PrefixStore("train/", pg.store)
    w = np.zeros(8)
    target = np.linspace(-1.0, 1.0, 8) * (rank + 1)
    evaluated: list[int] = []
    for epoch in range(EPOCHS):
        for _ in range(STEPS_PER_EPOCH):
            grad = w - target
            await dist.all_reduce(grad, op=dist.ReduceOp.AVG)
            w -= 0.1 * grad
        key = f"eval/{epoch}/owner"
        if fixed:
            mine = await store.compare_set(key, "", str(rank)) == str(rank).encode()
        else:
            mine = not await store.check([key])
            if mine:
                await store.set(key, str(rank))
        if mine:
            await asyncio.sleep(0.001)  # simulate work: evaluate on the validation set
            await store.add(f"eval/{epoch}/runs", 1)
            evaluated.append(epoch)
        await dist.barrier()
        runs = int(await store.get(f"eval/{epoch}/runs"))
        if runs != 1:
            raise AssertionError(f"rank {rank}: epoch {epoch} was evaluated {runs} times (two evaluators)")
    await dist.destroy_process_group()
    return evaluated


async def epoch_evaluator() -> list[int]:
    return await _epoch_evaluator(fixed=False)


async def epoch_evaluator_fixed() -> list[int]:
    return await _epoch_evaluator(fixed=True)


# ------------------------------------------------------- lease without fencing


LOCK_LEASE = 0.5
"""Seconds a lock holder may keep the lock before the others presume it dead (its work takes ~2 ms)."""
UPDATES = 4


async def _acquire(store: aiodist.Store, me: str) -> None:
    """Take the lock ``me``; break it if its holder has kept it longer than the lease (by our clock)."""
    loop = asyncio.get_running_loop()
    seen, since = b"", loop.time()
    while True:
        holder = await store.compare_set("lock", "", me)
        if holder == me.encode():
            return
        if holder != seen:
            seen, since = holder, loop.time()
        elif loop.time() - since > LOCK_LEASE:  # the holder is presumed dead: take the lock over
            if await store.compare_set("lock", seen, me) == me.encode():
                return
        await asyncio.sleep(0.005)


async def _model_lock(*, fixed: bool) -> int:
    """Ranks take turns producing the next model version under a store lock with a lease.

    Bug: the holder trusts the lock: it reads the version, works, and writes
    the next one. A holder that stalls past the lease (a long GC pause, a
    stopped VM) loses the lock to another rank and, when it wakes, writes a
    stale version over the new one. Fix: a fencing token taken with the lock
    goes with the write, and the write is refused (``compare_set``) when
    the record moved on: the fenced holder gives up and takes the lock again.
    """
    rank, world, _, _ = _launcher_env()
    async with _job_store() as store:
        if rank == 0:
            await store.set("model", "0 0")  # fencing token of the last write, version
        await store.wait(["model"], timeout=TIMEOUT)
        done = attempt = 0
        while done < UPDATES:
            attempt += 1
            me = f"{rank}.{attempt}"
            await _acquire(store, me)
            token = await store.add("fence", 1)
            record = await store.get("model")
            last_token, version = map(int, record.split())
            await asyncio.sleep(0.002)  # simulate work: produce the next version
            if fixed:
                new = f"{token} {version + 1}"
                if last_token < token and await store.compare_set("model", record, new) == new.encode():
                    done += 1
            else:
                await store.set("model", f"{token} {version + 1}")
                done += 1
            await store.compare_set("lock", me, "")  # release, if it is still ours
        await _all_arrive(store, "updated", world)
        version = int((await store.get("model")).split()[1])
        if version != world * UPDATES:
            raise AssertionError(
                f"rank {rank}: model version is {version} after {world * UPDATES} updates under the lock (lost update)"
            )
        return version


async def model_lock() -> int:
    return await _model_lock(fixed=False)


async def model_lock_fixed() -> int:
    return await _model_lock(fixed=True)


TASKS = 12
TASK_LEASE = 0.2
"""Seconds a rank holds a task it claimed (a task takes ~2 ms): past that, another rank may take it."""


def _task_value(i: int) -> int:
    return 1000 + 37 * i


async def _task_leases(*, fixed: bool) -> int:
    """Ranks share TASKS work items through the group's store, each claimed with a lease (a visibility timeout).

    A rank claims a task by writing ``"<rank> <deadline>"`` into its lease
    key; a rank finding an expired lease on an unfinished task takes it over.
    Bug: the holder commits its result (adds it to the total, marks the task
    done) without checking it still holds the lease: a holder stalled past
    its deadline commits after the rank that took the task over, and the
    task counts twice. Fix: the commit swaps the holder's own lease for
    "done" (``compare_set``), so only the current holder commits.
    """
    pg = await dist.init_process_group(timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.PrefixStore("tasks/", pg.store)
    loop = asyncio.get_running_loop()
    order = [(rank * TASKS // world + k) % TASKS for k in range(TASKS)]  # start with this rank's share
    committed = 0
    while True:
        remaining = 0
        for i in order:
            if await store.check([f"done/{i}"]):
                continue
            remaining += 1
            lease = f"{rank} {loop.time() + TASK_LEASE:.6f}"
            current = (await store.compare_set(f"lease/{i}", "", lease)).decode()
            if current != lease:
                holder, _, deadline = current.partition(" ")
                if holder == "done" or loop.time() < float(deadline):
                    continue  # finished, or someone holds it
                current = (await store.compare_set(f"lease/{i}", current, lease)).decode()
                if current != lease:
                    continue  # someone else took it over first
            await asyncio.sleep(0.002)  # simulate work: run the task
            if fixed:
                if await store.compare_set(f"lease/{i}", lease, f"done {rank}") != f"done {rank}".encode():
                    continue  # the lease ran out and another rank took the task: drop this result
            await store.add("total", _task_value(i))
            await store.set(f"done/{i}", str(rank))
            committed += 1
        if remaining == 0:
            break
        await asyncio.sleep(0.01)  # tasks held by others: look again later
    await dist.barrier()
    total = int(await store.get("total"))
    expected = sum(_task_value(i) for i in range(TASKS))
    if total != expected:
        raise AssertionError(f"rank {rank}: total is {total}, expected {expected} (a task committed twice)")
    await dist.destroy_process_group()
    return committed


async def task_leases() -> int:
    return await _task_leases(fixed=False)


async def task_leases_fixed() -> int:
    return await _task_leases(fixed=True)


# -------------------------------------------------------------- lost wake-up


JOBS = 4
CONSUMER = 1


async def _job_board(*, fixed: bool) -> int:
    """Producers post jobs on a board in the store and ring a doorbell; one consumer runs them.

    The consumer sleeps on the doorbell key, reads how many jobs were
    posted, runs the new ones and clears the doorbell. Bug: it clears the
    doorbell after reading the counter, so a job posted (and rung for)
    meanwhile has its ring wiped: if it was the last, the consumer sleeps
    forever (here: until its wait times out). Fix: clear the doorbell
    first, then read the counter.
    """
    rank, world, _, _ = _launcher_env()
    async with _job_store() as store:
        if rank == CONSUMER:
            expected = (world - 1) * JOBS
            handled = 0
            while handled < expected:
                await store.wait(["doorbell"], timeout=10.0)
                if fixed:
                    await store.delete_key("doorbell")
                posted = int(await store.add("posted", 0))
                for n in range(handled + 1, posted + 1):
                    await store.get(f"job/{n}")
                    await asyncio.sleep(0.0005)  # simulate work: run the job
                handled = posted
                if not fixed:
                    await store.delete_key("doorbell")  # all caught up
            return handled
        for j in range(JOBS):
            await asyncio.sleep(0.001)  # simulate work: prepare the job
            n = await store.add("posted", 1)
            await store.set(f"job/{n}", f"job {j} of rank {rank}")
            await store.set("doorbell", "1")
        return JOBS


async def job_board() -> int:
    return await _job_board(fixed=False)


async def job_board_fixed() -> int:
    return await _job_board(fixed=True)


TRAIN_STEPS = 12
SAVE_EVERY = 3
UPLOADER = 1


async def _upload_shards(store: aiodist.Store, expected: int, *, fixed: bool) -> int:
    """The uploader: wakes on the bell, uploads every shard saved since last time, until ``expected``."""
    uploaded = 0
    while uploaded < expected:
        await store.wait(["bell"], timeout=TIMEOUT)
        if fixed:
            await store.delete_key("bell")
        saved = int(await store.add("saved", 0))
        for _ in range(uploaded, saved):
            await asyncio.sleep(0.002)  # simulate work: upload one shard
        uploaded = saved
        if not fixed:
            await store.delete_key("bell")  # all uploaded
    return uploaded


async def _shard_uploader(*, fixed: bool) -> int:
    """Training saves a checkpoint shard per rank every SAVE_EVERY steps; a background task uploads them.

    Each rank counts its saved shard in the store and rings a bell; the
    uploader task on rank UPLOADER runs beside that rank's training. Bug:
    the uploader clears the bell after reading the count (and uploading),
    so the shards whose bell rang in between stay unuploaded when they are
    the last: training ends and ``wait_for`` on the uploader times out.
    Fix: clear the bell before reading the count.
    """
    pg = await dist.init_process_group(timeout=60)
    rank, world = pg.rank, pg.size
    store = dist.PrefixStore("ckpt/", pg.store)
    expected = world * (TRAIN_STEPS // SAVE_EVERY)
    uploader = asyncio.create_task(_upload_shards(store, expected, fixed=fixed)) if rank == UPLOADER else None
    uploaded = 0
    try:
        w = np.zeros(16)
        target = np.linspace(0.0, 1.0, 16) + rank
        for step in range(1, TRAIN_STEPS + 1):
            grad = w - target
            await dist.all_reduce(grad, op=dist.ReduceOp.AVG)
            w -= 0.2 * grad
            if step % SAVE_EVERY == 0:
                await asyncio.sleep(0.001)  # simulate work: write this rank's shard to local disk
                await store.add("saved", 1)
                await store.set("bell", "1")
        if uploader is not None:
            try:
                uploaded = await asyncio.wait_for(uploader, timeout=5.0)
            except TimeoutError:
                raise AssertionError(
                    f"rank {rank}: shards still not uploaded 5 s after training ended (lost wake-up)"
                ) from None
    finally:
        if uploader is not None and not uploader.done():
            uploader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await uploader
    await dist.destroy_process_group()
    return uploaded


async def shard_uploader() -> int:
    return await _shard_uploader(fixed=False)


async def shard_uploader_fixed() -> int:
    return await _shard_uploader(fixed=True)


# ----------------------------------------------------------- restart amnesia


FILES = 10


def _rows_in(rank: int, f: int) -> int:
    return 100 + 7 * f + rank


async def _row_totals(*, fixed: bool) -> int:
    """Workers (ranks 1..) count the rows of their FILES files; rank 0 checks the job's total.

    Bug: a worker adds each file's rows to the total in the store and keeps
    the index of its next file in memory only: restarted by its supervisor,
    it starts again from file 0 and counts its first files twice. Fix:
    each file's count is written under its own key (writing it twice is
    harmless) and the worker's progress is kept in the store, where the
    restarted process resumes from.
    """
    rank, world, _, _ = _launcher_env()
    async with _job_store() as store:
        if rank == 0:
            await store.wait([f"finished/{r}" for r in range(1, world)], timeout=TIMEOUT)
            if fixed:
                keys = [f"rows/{r}/{f}" for r in range(1, world) for f in range(FILES)]
                total = sum(int(v) for v in await store.multi_get(keys))
            else:
                total = int(await store.get("rows"))
            expected = sum(_rows_in(r, f) for r in range(1, world) for f in range(FILES))
            if total != expected:
                raise AssertionError(f"the job counted {total} rows, expected {expected} (files counted twice)")
            return total
        start = int(await store.add(f"progress/{rank}", 0)) if fixed else 0
        for f in range(start, FILES):
            await asyncio.sleep(0.002)  # simulate work: parse the file
            if fixed:
                await store.set(f"rows/{rank}/{f}", str(_rows_in(rank, f)))
                await store.set(f"progress/{rank}", str(f + 1))
            else:
                await store.add("rows", _rows_in(rank, f))
        await store.set(f"finished/{rank}", "")
        return FILES - start


async def row_totals() -> int:
    return await _row_totals(fixed=False)


async def row_totals_fixed() -> int:
    return await _row_totals(fixed=True)


MESSAGES = 12


async def _message_sequence(*, fixed: bool) -> int:
    """Producers (ranks 1..) stream numbered messages to rank 0 through a store queue.

    Each message is applied downstream once, so the consumer checks that
    no producer sends the same sequence number twice. Bug: a producer keeps
    its next sequence number in memory: restarted, it numbers from 0 again
    and sends its first messages a second time. Fix: sequence numbers are
    drawn from a counter in the store (``add``), so a restarted producer
    goes on from where its predecessor stopped (a number drawn just before
    a crash is skipped, which the consumer tolerates). The consumer must not
    expect a producer's numbers to arrive in increasing order: what a
    crashed process had sent may still be in flight on its old connection
    when its successor's messages arrive on the new one.
    """
    rank, world, _, _ = _launcher_env()
    async with _job_store() as store:
        if rank == 0:
            seen: dict[int, set[int]] = {r: set() for r in range(1, world)}
            finished: set[int] = set()
            received = 0
            while len(finished) < world - 1:
                sender, _, rest = (await store.queue_pop("inbox", timeout=TIMEOUT)).decode().partition(" ")
                producer = int(sender)
                if rest == "eof":
                    finished.add(producer)
                    continue
                seq = int(rest.split()[0])
                if seq in seen[producer]:
                    raise AssertionError(f"rank {producer} sent message {seq} twice (work redone after a restart)")
                seen[producer].add(seq)
                received += 1
            return received
        sent = 0
        seq = -1
        while True:
            if fixed:
                seq = await store.add(f"seq/{rank}", 1) - 1
            else:
                seq += 1
            if seq >= MESSAGES:
                break
            await asyncio.sleep(0.001)  # simulate work: produce the message
            await store.queue_push("inbox", f"{rank} {seq} payload-{rank}-{seq}")
            sent += 1
        await store.queue_push("inbox", f"{rank} eof")
        return sent


async def message_sequence() -> int:
    return await _message_sequence(fixed=False)


async def message_sequence_fixed() -> int:
    return await _message_sequence(fixed=True)


# ------------------------------------------------------------------- catalogue


PROGRAMS = {
    "samples_seen": "lost update",
    "work_cursor": "lost update",
    "index_builder": "check-then-act election",
    "epoch_evaluator": "check-then-act election",
    "model_lock": "lease without fencing",
    "task_leases": "lease without fencing",
    "job_board": "lost wake-up",
    "shard_uploader": "lost wake-up",
    "row_totals": "restart amnesia",
    "message_sequence": "restart amnesia",
}
"""Buggy program name -> its class; the twin is ``<name>_fixed``."""

WORLD = {
    "samples_seen": 4,
    "work_cursor": 3,
    "index_builder": 5,
    "epoch_evaluator": 4,
    "model_lock": 3,
    "task_leases": 4,
    "job_board": 4,
    "shard_uploader": 3,
    "row_totals": 4,
    "message_sequence": 3,
}
"""World size each program is written for."""

SYMPTOM = {
    "samples_seen": "(lost update)",
    "work_cursor": "processed twice",
    "index_builder": "(two leaders)",
    "epoch_evaluator": "(two evaluators)",
    "model_lock": "under the lock (lost update)",
    "task_leases": "(a task committed twice)",
    "job_board": "['doorbell']",
    "shard_uploader": "not uploaded 5 s after training ended",
    "row_totals": "(files counted twice)",
    "message_sequence": "(work redone after a restart)",
}
"""Text in a failure's message when it is the program's own bug (``job_board``: its store wait times out)."""

SWARM_KINDS = {"row_totals": frozenset({"restart"}), "message_sequence": frozenset({"restart"})}
"""Programs found only with destructive faults, and the swarm kinds their twins claim to tolerate."""
