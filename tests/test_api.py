"""The module-level API on the default group (real TCP)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from conftest import run_ranks, run_world

import aiodist.api as dist
from aiodist.collectives.ops import ReduceOp
from aiodist.errors import GroupError


async def test_api_md_example_handles_awaited_later() -> None:
    async def body(pg: Any) -> Any:
        a = np.full(3, pg.rank + 1.0)
        b = np.full(2, pg.rank + 1, np.int64)
        h1 = dist.all_reduce(a)
        h2 = dist.all_reduce(b, op=ReduceOp.PRODUCT)
        await h1
        await h2
        objs = await dist.all_gather_object({"r": pg.rank})
        lst = ["x", pg.rank] if pg.rank == 1 else [None, None]
        await dist.broadcast_object_list(lst, src=1)
        g = await dist.gather_object(pg.rank * 10, dst=2)
        out = [None]
        await dist.scatter_object_list(out, ["a", "b", "c"] if pg.rank == 0 else None, src=0)
        await dist.barrier()
        return a.tolist(), b.tolist(), objs, lst, g, out[0], dist.get_process_group_ranks()

    res = await run_world(3, body)
    for r, (a, b, objs, lst, g, o, ranks) in enumerate(res):
        assert a == [6.0] * 3 and b == [6, 6]
        assert objs == [{"r": 0}, {"r": 1}, {"r": 2}] and lst == ["x", 1]
        assert g == ([0, 10, 20] if r == 2 else None)
        assert o == "abc"[r] and ranks == [0, 1, 2]


async def test_world_of_one() -> None:
    async def body(pg: Any) -> Any:
        x = np.arange(4.0)
        await dist.all_reduce(x, op=ReduceOp.AVG)
        gl = [np.empty(4)]
        await dist.all_gather(gl, x)
        await dist.barrier()
        return x.tolist(), gl[0].tolist(), dist.get_rank(), dist.get_world_size()

    assert await run_world(1, body) == [([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0], 0, 1)]


async def test_each_rank_has_its_own_default_group() -> None:
    async def rank(r: int) -> Any:
        assert not dist.is_initialized()
        await dist.init_process_group(timeout=10)
        await asyncio.sleep(0.01)  # the other ranks initialize meanwhile, in the same process
        try:
            return dist.get_rank()
        finally:
            await dist.destroy_process_group()

    assert await run_ranks(3, rank) == [0, 1, 2]


async def test_using_the_api_before_init_or_after_destroy_is_a_group_error() -> None:
    async def rank(r: int) -> None:
        with pytest.raises(GroupError, match="not initialized"):
            dist.barrier()
        with pytest.raises(GroupError):
            await dist.destroy_process_group()
        with pytest.raises(GroupError):
            await dist.new_group([0])
        pg = await dist.init_process_group(timeout=10)
        await dist.destroy_process_group()
        with pytest.raises(GroupError, match="destroyed"):
            pg.all_reduce(np.ones(1))
        with pytest.raises(GroupError, match="not initialized"):
            dist.get_world_size()
        with pytest.raises(ValueError, match="not initialized"):  # (torch24 probe: torch's is a ValueError)
            dist.get_rank()

    await run_ranks(2, rank)


async def test_destroy_fails_operations_still_running_with_a_group_error() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        if r == 0:
            h = pg.recv(np.empty(1), src=1)  # rank 1 never sends
            await asyncio.sleep(0.05)
            h2 = pg.all_reduce(np.ones(2))  # not even started when the group goes
            await dist.destroy_process_group()
            with pytest.raises(GroupError, match="destroyed"):
                await h
            with pytest.raises(GroupError, match="destroyed"):
                await h2.wait()
        else:
            await asyncio.sleep(0.5)  # (stays while rank 0 destroys: its leaving would fail the receive first)
            await dist.destroy_process_group()

    await run_ranks(2, rank)


async def _process_main(n: int) -> Any:
    pg = await dist.init_process_group(timeout=30)
    try:
        x = np.full(200_000, pg.rank + 1.0)
        h = dist.all_reduce(x)
        objs = await dist.all_gather_object(pg.rank)
        await h
        return float(x[0]), objs, dist.get_world_size()
    finally:
        await dist.destroy_process_group()


def _spawned(n: int) -> Any:
    from aiodist.eventloop import run  # uvloop when available, as `aiodist run` does

    return run(_process_main(n))


def test_real_processes_over_env_rendezvous() -> None:
    from aiodist.launch.spawn import spawn

    res = spawn(_spawned, 3, args=(3,), timeout=60)
    assert res == [(6.0, [0, 1, 2], 3)] * 3
