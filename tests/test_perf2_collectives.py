"""Round 2 of performance: reduce's algorithm at few ranks, all_to_all of large blocks, shared rank tables."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pytest

import sim
from aiodist import api
from aiodist.collectives import all_to_all, all_to_all_single, reduce, tuning
from aiodist.collectives.memory import MemoryFabric
from aiodist.collectives.ops import ReduceOp
from aiodist.comm.channel import rank_table


async def run_ranks(p: int, fn: Any, *, seed: int = 0, eager_limit: int | None = None) -> tuple[list[Any], MemoryFabric]:
    fabric = MemoryFabric(p, rng=random.Random(seed), eager_limit=eager_limit)
    async with asyncio.timeout(20):
        results = await asyncio.gather(*[fn(ch) for ch in fabric.channels()])
    assert fabric.undelivered() == []
    return list(results), fabric


# ------------------------------------------------------------------ reduce: the tree up to 4 ranks


@pytest.mark.parametrize("p", [2, 3, 4])
def test_choose_reduce_uses_the_tree_up_to_four_ranks_at_any_size(p: int) -> None:
    for nbytes in (1, tuning.REDUCE_RS_MIN_BYTES, 16 << 20, 1 << 30):
        assert tuning.choose_reduce(p, nbytes) == "binomial"
    assert tuning.choose_reduce(p + 4, 16 << 20) == "reduce_scatter_gather"


@pytest.mark.parametrize("p", [2, 3, 4])
async def test_large_reduce_at_few_ranks_sends_one_full_message_per_non_root(p: int) -> None:
    n = tuning.REDUCE_RS_MIN_BYTES // 8 + 3
    inputs = [np.full(n, r + 1.0) for r in range(p)]
    arrays = [x.copy() for x in inputs]
    root = p - 1
    _, fabric = await run_ranks(p, lambda ch: reduce(ch, 0, arrays[ch.rank], root, ReduceOp.SUM))
    assert (arrays[root] == p * (p + 1) / 2).all()
    assert fabric.messages == [0 if r == root else 1 for r in range(p)]  # binomial tree: no reduce-scatter


# ------------------------------------------------------------------ all_to_all: everything posted at once


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("rows", [1, 4096])  # 4096 rows of 8 float64 = 256 KiB per peer: the large path
async def test_all_to_all_single_is_exact_small_and_large(p: int, rows: int) -> None:
    rng = np.random.default_rng(p * rows)
    ins = [rng.standard_normal((p * rows, 8)) for _ in range(p)]
    outs = [np.zeros_like(x) for x in ins]
    await run_ranks(p, lambda ch: all_to_all_single(ch, 0, outs[ch.rank], ins[ch.rank]), eager_limit=1 << 16)
    for r in range(p):
        for s in range(p):
            np.testing.assert_array_equal(outs[r][s * rows : (s + 1) * rows], ins[s][r * rows : (r + 1) * rows])


async def test_all_to_all_large_uneven_blocks_are_exact() -> None:
    p = 3
    sizes = [[(40000 * (1 + r + 2 * s)) % 90001 for s in range(p)] for r in range(p)]  # sizes[r][s]: r sends s
    ins = [[np.arange(sizes[r][s], dtype=np.int32) + 1000 * r + s for s in range(p)] for r in range(p)]
    outs = [[np.zeros(sizes[s][r], np.int32) for s in range(p)] for r in range(p)]
    await run_ranks(p, lambda ch: all_to_all(ch, 0, outs[ch.rank], ins[ch.rank]), eager_limit=1 << 16)
    for r in range(p):
        for s in range(p):
            np.testing.assert_array_equal(outs[r][s], ins[s][r])


async def _timed_all_to_all() -> Any:
    pg = await api.init_process_group(timeout=30)
    loop = asyncio.get_running_loop()
    p = pg.size
    rows = 4096  # x 8 float32 = 128 KiB per peer: above the 64 KiB small-message path
    x = (np.arange(p * rows * 8, dtype=np.float32).reshape(p * rows, 8) + 1e6 * pg.rank)
    out = np.zeros_like(x)
    await api.all_to_all_single(out, x)  # connect every pair first
    await api.barrier()
    t0 = loop.time()
    await api.all_to_all_single(out, x)
    took = loop.time() - t0
    for s in range(p):
        expect = np.arange(p * rows * 8, dtype=np.float32).reshape(p * rows, 8)[pg.rank * rows : (pg.rank + 1) * rows]
        np.testing.assert_array_equal(out[s * rows : (s + 1) * rows], expect + np.float32(1e6 * s))
    await api.destroy_process_group()
    return took


def test_large_all_to_all_costs_about_one_latency_not_one_per_step() -> None:
    # 4 ranks, 10 ms per hop, no bandwidth limit: exchanging step after step took 3 hops
    res = sim.run(_timed_all_to_all, world_size=4, seed=1, network=sim.Network.fixed(10e-3), explore=False)
    res.raise_on_failure()
    assert max(res.rank_results) < 0.025, res.rank_results  # (the last to leave the barrier waits one hop)


# ------------------------------------------------------------------ shared rank tables


def test_rank_tables_are_shared_while_in_use() -> None:
    a = rank_table(range(5))
    b = rank_table([0, 1, 2, 3, 4])
    assert a is b and a.ranks == (0, 1, 2, 3, 4) and a.index[3] == 3
    assert rank_table((1, 3)).index == {1: 0, 3: 1}


async def _world_tables() -> Any:
    pg = await api.init_process_group(timeout=30)
    sub = await api.new_group([0, 2])
    comm = pg._comm
    found = (id(comm.ranks), id(comm._index), id(sub._comm.ranks))
    await api.barrier()  # every rank holds its tables at once (shared while in use, not after)
    await api.destroy_process_group()
    return found


def test_every_virtual_rank_shares_one_world_rank_table() -> None:
    res = sim.run(_world_tables, world_size=4, seed=0)
    res.raise_on_failure()
    assert len({r[0] for r in res.rank_results}) == 1  # one ranks tuple for all 4 ranks
    assert len({r[1] for r in res.rank_results}) == 1  # one index dict
    assert len({r[2] for r in res.rank_results}) == 1  # subgroups too (non-members included)
