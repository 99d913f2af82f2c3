"""reduce_scatter (list form) with chunks of different sizes, as torch's gloo accepts it.

``in_list[i]`` has the same size on every rank (sizes may differ between
``i``s) and rank r's ``out`` that of ``in_list[r]``. Semantics in the
simulator over several seeds and world sizes (the all_reduce path for small
inputs, the ring for large ones), sizes the ranks disagree on (a
CollectiveMismatchError on every rank, never a hang or wrong data), an ``out``
of the wrong size (refused before any communication), the same-host
transports with the intra-node engine on (uneven chunks take the generic
path), and real processes over TCP with ``aiodist run``.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import aiodist_run_source, run_ranks

import aiodist
import aiodist.api as dist
from aiodist.collectives import intranode, reducescatter, tuning
from aiodist.collectives.ops import PremulSum

SMALL = [3, 0, 7, 1, 2, 5, 4, 6]
"""Chunk sizes below the ring's threshold (the all_reduce path); the first ``p`` of them."""
LARGE = [5000, 0, 9000, 2000, 700, 3000, 1, 4000]
"""Chunk sizes above it (the ring), int64: 8 bytes each."""


def _chunk(rank: int, i: int, n: int) -> np.ndarray:
    """Rank ``rank``'s ``in_list[i]`` of ``n`` elements: exact in int64 and in float64."""
    return (np.arange(n, dtype=np.int64) * (i + 1) + 10 * rank + i) % 1000


def _want(i: int, n: int, p: int, op: str) -> np.ndarray:
    parts = np.stack([_chunk(q, i, n) for q in range(p)]) if n else np.zeros((p, 0), np.int64)
    if op == "SUM":
        return parts.sum(axis=0)
    if op == "MAX":
        return parts.max(axis=0)
    if op == "AVG":
        return parts.sum(axis=0) / p
    assert op == "PREMUL_SUM"
    return parts.sum(axis=0) * 2.0


async def _uneven_round(sizes: list[int]) -> None:
    """One reduce_scatter of chunks ``sizes`` per op and dtype, checked against numpy (inputs unchanged)."""
    r, p = dist.get_rank(), dist.get_world_size()
    for op, dtype in [("SUM", np.int64), ("MAX", np.int64), ("AVG", np.float64), ("PREMUL_SUM", np.float64)]:
        ins = [_chunk(r, i, sizes[i]).astype(dtype) for i in range(p)]
        before = [a.copy() for a in ins]
        out = np.full(sizes[r], -1, dtype=dtype)
        rop: Any = PremulSum(2.0) if op == "PREMUL_SUM" else getattr(dist.ReduceOp, op)
        await dist.reduce_scatter(out, ins, op=rop)
        np.testing.assert_array_equal(out, _want(r, sizes[r], p, op).astype(dtype), err_msg=f"{op} sizes={sizes}")
        for a, b in zip(ins, before):
            np.testing.assert_array_equal(a, b)
    # in place: out is this rank's own chunk of the list
    ins = [_chunk(r, i, sizes[i]) for i in range(p)]
    await dist.reduce_scatter(ins[r], ins)
    np.testing.assert_array_equal(ins[r], _want(r, sizes[r], p, "SUM"))


@pytest.mark.sim(world_size=4, seeds=range(6))
async def test_uneven_reduce_scatter_in_sim() -> None:
    await dist.init_process_group(timeout=60)
    p = dist.get_world_size()
    assert sum(SMALL[:p]) * 8 < tuning.REDUCE_SCATTER_RING_MIN_BYTES <= sum(LARGE[:p]) * 8
    await _uneven_round(SMALL[:p])
    await _uneven_round(LARGE[:p])
    await _uneven_round([0] * p)  # every chunk empty (even: the usual path)
    # torch's r04 repro: rank r's out has r+1 elements, all of them world size
    out = np.zeros(dist.get_rank() + 1, np.float32)
    await dist.reduce_scatter(out, [np.ones(i + 1, np.float32) for i in range(p)])
    assert out.tolist() == [float(p)] * (dist.get_rank() + 1)
    await dist.destroy_process_group()


@pytest.mark.parametrize("gain", [0.0, float("inf")], ids=["rebalanced", "ring"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8])
def test_uneven_reduce_scatter_random_sizes_in_sim(world_size: int, gain: float, sim_run: Any, monkeypatch: Any) -> None:
    """Random sizes (empty blocks, blocks smaller than p, blocks spanning several of the rebalanced parts) on each
    large-input algorithm: REBALANCE_MIN_GAIN 0 always rebalances, infinity never does."""
    monkeypatch.setattr(tuning, "REBALANCE_MIN_GAIN", gain)
    calls: list[int] = []
    real = reducescatter.rebalanced_reduce_scatter

    async def counted(ch: Any, *args: Any) -> None:
        calls.append(ch.rank)
        await real(ch, *args)

    monkeypatch.setattr(reducescatter, "rebalanced_reduce_scatter", counted)

    async def main() -> None:
        await dist.init_process_group(timeout=60)
        for k in range(3):
            rng = random.Random(world_size * 100 + k)  # the same sizes on every rank
            top = rng.choice([8, 4000, 40000])
            await _uneven_round([rng.randrange(top) for _ in range(world_size)])
        await _uneven_round([0] * (world_size - 1) + [30000])  # one block holds everything
        await dist.destroy_process_group()

    sim_run(main, world_size=world_size, seeds=range(3))
    assert bool(calls) == (gain == 0.0 and world_size > 1), len(calls)


@pytest.mark.parametrize("large", [None, 0.0, float("inf")], ids=["small", "rebalanced", "ring"])
@pytest.mark.parametrize("how", ["one-size", "even-vs-uneven"])
def test_chunk_sizes_the_ranks_disagree_on_mismatch_on_every_rank_in_sim(
    large: float | None, how: str, sim_run: Any, monkeypatch: Any
) -> None:
    """Rank 0 thinks chunk 1 has one element fewer (or that every chunk has the same size): every rank raises
    CollectiveMismatchError naming both calls, within a second; no rank hangs or returns."""
    if large is not None:
        monkeypatch.setattr(tuning, "REBALANCE_MIN_GAIN", large)

    async def main() -> str:
        pg = await dist.init_process_group(timeout=30)
        r, p = pg.rank, pg.size
        base = 3 if large is None else 3000
        sizes = [base + i for i in range(p)]
        if r == 0:
            sizes = [base] * p if how == "even-vs-uneven" else [base + i - (i == 1) for i in range(p)]
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(aiodist.CollectiveMismatchError) as info:
            await pg.reduce_scatter(np.zeros(sizes[r], np.float32), [np.ones(s, np.float32) for s in sizes])
            await pg.barrier()  # (a rank whose part completed unawares learns it here)
        assert loop.time() - start < 1.0
        await dist.destroy_process_group()
        return str(info.value)

    for res in sim_run(main, world_size=4, seeds=range(4)):
        assert any("reduce_scatter" in m and "n=[" in m for m in res.rank_results), res.rank_results


@pytest.mark.sim(world_size=3, seeds=range(2))
async def test_an_out_of_the_wrong_size_is_refused_before_any_communication() -> None:
    pg = await dist.init_process_group(timeout=30)
    r, p = pg.rank, pg.size
    with pytest.raises(aiodist.InvalidArrayError) as info:
        pg.reduce_scatter(np.zeros(1, np.float32), [np.ones(i + 2, np.float32) for i in range(p)])
    assert info.value.argument == "out" and info.value.reason == "size"
    assert f"expected {r + 2}" in str(info.value) and f"in_list[{r}]" in str(info.value)
    await pg.barrier()  # the group is still usable: nothing was sent
    await dist.destroy_process_group()


def test_the_ring_or_rebalancing_by_the_bytes_each_moves() -> None:
    assert tuning.choose_uneven_reduce_scatter([0] * 7 + [1000]) == "rebalanced"  # 7000 vs 875 + 1000
    assert tuning.choose_uneven_reduce_scatter([0] * 3 + [1000]) == "ring"  # 3000 vs 750 + 1000: not twice
    assert tuning.choose_uneven_reduce_scatter([i + 1 for i in range(8)]) == "ring"


def test_signature_of_chunk_sizes() -> None:
    from aiodist.signatures import CHUNK_SIZES_LISTED, chunk_sizes

    assert chunk_sizes([4, 4, 4]) == "n=4"  # even lists keep their signature
    assert chunk_sizes([1, 2, 3]) == "n=[1,2,3]"
    many = list(range(CHUNK_SIZES_LISTED + 1))
    other = many[:-1] + [many[-1] + 1]
    assert chunk_sizes(many) != chunk_sizes(other)
    assert len(chunk_sizes(many * 100)) < 64  # a frame header stays short however many ranks


async def test_uneven_chunks_take_the_generic_path_while_the_engine_is_on(monkeypatch: Any) -> None:
    """Real same-host transports (ranks as tasks of this process), the intra-node engine on for small arrays:
    uneven chunks give the right result over the generic path, even ones still run on the engine."""
    monkeypatch.setattr(intranode, "ENGINE_MIN_BYTES", 16 << 10)
    monkeypatch.setattr(intranode, "ENGINE_MIN_BYTES_MANY", 16 << 10)
    ran: list[int] = []
    real = intranode.GroupEngine.run

    async def counting(self: Any, ch: Any, body: Any, *args: Any) -> bool:
        ran.append(ch.rank)
        return await real(self, ch, body, *args)

    monkeypatch.setattr(intranode.GroupEngine, "run", counting)
    monkeypatch.setattr(tuning, "REBALANCE_MIN_GAIN", tuning.REBALANCE_MIN_GAIN)

    async def rank(r: int) -> None:
        await dist.init_process_group(timeout=20)
        try:
            p = dist.get_world_size()
            await _uneven_round(LARGE[:p])
            tuning.REBALANCE_MIN_GAIN = 0.0  # (restored by monkeypatch)
            await _uneven_round([0] * (p - 1) + [40000])
            even = [np.full(8000, i + r, np.int64) for i in range(p)]
            out = np.zeros(8000, np.int64)
            await dist.reduce_scatter(out, even)
            assert (out == p * r + p * (p - 1) // 2).all()
            assert repr(intranode._ENGINES.get(dist._world()._comm)).endswith(" on>")
        finally:
            await dist.destroy_process_group()

    await run_ranks(3, rank, timeout=60)
    assert sorted(ran) == [0, 1, 2], ran  # the even call only


PROG = '''
import numpy as np
import aiodist as dist
from aiodist.collectives import tuning

async def main():
    pg = await dist.init_process_group(timeout=30)
    r, p = pg.rank, pg.size
    for gain in (2.0, 0.0):  # the ring over the blocks, then rebalancing
        tuning.REBALANCE_MIN_GAIN = gain
        for sizes in ([r0 + 1 for r0 in range(p)], [3, 0, 200000, 70000][:p], [0] * (p - 1) + [300001]):
            ins = [np.full(s, i + 10 * r, np.float64) for i, s in enumerate(sizes)]
            out = np.zeros(sizes[r])
            await dist.reduce_scatter(out, ins)
            assert (out == p * r + 10 * p * (p - 1) / 2).all(), out[:5]
    bad = [1, 2, 3, 4][:p]
    if r == 0:
        bad[1] = 3
    try:
        await dist.reduce_scatter(np.zeros(bad[r]), [np.ones(s) for s in bad])
        await dist.barrier()
        print(f"rank {r}: no error", flush=True)
    except dist.CollectiveMismatchError:
        print(f"rank {r}: OK", flush=True)
'''


@pytest.mark.slow
def test_uneven_reduce_scatter_over_tcp_with_aiodist_run(tmp_path: Path) -> None:
    res = aiodist_run_source(tmp_path, PROG, 4, timeout=120, env={"AIODIST_TRANSPORT": "tcp"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(line.split(": ", 1)[1] for line in res.stdout.splitlines() if "rank " in line) == [
        f"rank {r}: OK" for r in range(4)
    ], res.stdout + res.stderr


