"""abort(): fail everything at once, tear down without waiting, rebuild a group of the survivors."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import aiodist.api as dist
import sim
from aiodist.errors import AbortedError, GroupError, PeerFailureError
from aiodist.rendezvous import STORE_GOODBYE_GRACE
from aiodist.store.client import TCPStore
from aiodist.store.server import StoreServer


async def test_abort_fails_pending_operations_at_once_and_the_process_lives_on() -> None:
    async def rank(r: int) -> Any:
        loop = asyncio.get_running_loop()
        pg = await dist.init_process_group(timeout=30)
        if r == 1:
            await asyncio.sleep(1.5)  # never joins: rank 0's all_reduce stays pending
            return None
        h = pg.all_reduce(np.ones(4))
        await asyncio.sleep(0.1)
        start = loop.time()
        await dist.abort()
        took = loop.time() - start
        with pytest.raises(AbortedError, match="aborted"):
            await h
        with pytest.raises(AbortedError):
            pg.all_reduce(np.ones(4))
        with pytest.raises(GroupError, match="not initialized"):
            dist.all_reduce(np.ones(4))
        await dist.abort()  # idempotent
        return took

    results = await run_ranks(2, rank, return_exceptions=True, timeout=10)
    assert isinstance(results[0], float) and results[0] < 0.5, results


async def _survivor_loop(store: Any, r: int, victim: int, world: int) -> Any:
    loop = asyncio.get_running_loop()
    await dist.init_process_group(store=store, rank=r, world_size=world, timeout=30)
    x = np.ones(16)
    try:
        for i in range(1000):
            if r == victim and i == 20:
                await dist.abort()  # looks like a crash to the others
                return "victim"
            await dist.all_reduce(x)
            x[:] = 1
    except PeerFailureError as e:
        assert e.rank == victim, e
        t0 = loop.time()
        await dist.abort()
        survivors = [q for q in range(world) if q != victim]
        pg = await dist.init_process_group(store=store, rank=survivors.index(r), world_size=len(survivors), timeout=10)
        y = np.full(4, float(r))
        await dist.all_reduce(y)
        await dist.destroy_process_group()
        return pg.rank, float(y[0]), loop.time() - t0
    raise AssertionError("no failure")


@pytest.mark.parametrize("victim", [0, 2])
async def test_survivors_abort_and_rebuild_a_group_in_the_same_process(victim: int) -> None:
    server = await StoreServer.start(host="127.0.0.1", port=0)
    stores = [await TCPStore.connect("127.0.0.1", server.port, timeout=5) for _ in range(4)]
    try:
        results = await run_ranks(4, lambda r: _survivor_loop(stores[r], r, victim, 4), timeout=20)
    finally:
        for s in stores:
            await s.close()
        await server.close()
    expected = float(sum(q for q in range(4) if q != victim))
    new_ranks = []
    for r, out in enumerate(results):
        if r == victim:
            assert out == "victim"
            continue
        new_rank, value, took = out
        new_ranks.append(new_rank)
        assert value == expected
        assert took < 2.0
    assert sorted(new_ranks) == [0, 1, 2]


async def env_survivors_main() -> Any:
    """env://: rank 0 hosts the store; after a crash the survivors (rank 0 among them) rendezvous again."""
    pg = await dist.init_process_group(timeout=30)
    r, world = pg.rank, pg.size
    x = np.ones(8)
    try:
        while True:
            await dist.all_reduce(x)
    except PeerFailureError as e:
        victim = e.global_rank
    await dist.abort()
    survivors = [q for q in range(world) if q != victim]
    await dist.init_process_group(rank=survivors.index(r), world_size=len(survivors), timeout=30)
    y = np.full(4, float(r))
    await dist.all_reduce(y)
    await dist.destroy_process_group()
    return victim, float(y[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_survivors_rebuild_in_the_simulator(seed: int) -> None:
    # Fixed timing: the crash at 0.05 s must come after every pair is connected (a survivor whose dial
    # the dead rank refused before that waits for the collective's timeout instead).
    res = sim.run(env_survivors_main, world_size=4, seed=seed, faults=[sim.Crash(3, at=0.05)], explore=False)
    assert res.ok, res.summary()
    assert res.rank_results[:3] == [(3, 3.0)] * 3
    assert res.virtual_time < 5
    again = sim.run(env_survivors_main, world_size=4, seed=seed, faults=[sim.Crash(3, at=0.05)], explore=False)
    assert again.digest == res.digest


async def destroy_after_crash_main() -> Any:
    loop = asyncio.get_running_loop()
    await dist.init_process_group(timeout=60)
    x = np.ones(8)
    try:
        while True:
            await dist.all_reduce(x)
    except PeerFailureError as e:
        t = loop.time()
        await dist.destroy_process_group()
        return e.global_rank, loop.time() - t


@pytest.mark.parametrize("silent", [False, True])
def test_destroy_after_a_crash_does_not_wait_for_the_dead(silent: bool) -> None:
    """Rank 0 hosts the store: it must not wait 10 s for the dead rank to leave (nor for a vanished one)."""
    res = sim.run(destroy_after_crash_main, world_size=4, seed=0, faults=[sim.Crash(2, at=0.05, silent=silent)],
                  stop_on_error=False, explore=False)  # (fixed timing: every pair connected before the crash)
    assert res.ok, res.summary()
    for r in (0, 1, 3):
        culprit, took = res.rank_results[r]
        assert culprit == 2
        assert took < 1.0, res.rank_results
    assert res.virtual_time < 5, res.summary()


async def leave_a_cut_off_store_main(how: str) -> float:
    """Measure how long this rank's abort / destroy takes once the store host is cut off."""
    loop = asyncio.get_running_loop()
    await dist.init_process_group(timeout=60)
    await dist.barrier()
    await asyncio.sleep(1.0)  # the store host is cut off at 0.5 s
    start = loop.time()
    if how == "abort":
        await dist.abort()
    else:
        await dist.destroy_process_group()
    return loop.time() - start


@pytest.mark.parametrize("how", ["abort", "destroy"])
def test_leaving_does_not_sit_out_the_store_timeout_when_the_store_is_cut_off(how: str) -> None:
    # Before: saying goodbye to the store waited for the store client's whole timeout (60 s here).
    res = sim.run(leave_a_cut_off_store_main, world_size=2, seed=0, store_host="separate", explore=False, args=(how,),
                  faults=[sim.Partition(("store",), ("rank0", "rank1"), at=0.5)])
    assert res.ok, res.summary()
    bound = STORE_GOODBYE_GRACE + (0 if how == "abort" else dist.STORE_LEAVE_WAIT)
    assert all(0 <= took <= bound + 0.01 for took in res.rank_results), res.rank_results
