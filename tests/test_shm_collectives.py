"""The intra-node engine: every collective it runs, on plain and shared arrays, in rounds, across fake hosts.

Ranks run as tasks of this process (``conftest.run_ranks``) over real
transports; the engine maps the other ranks' segments through
``/proc/self/fd`` exactly as it maps another process's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import pytest
from conftest import free_port, rank_context, rank_env

import aiodist
import aiodist.api as dist
from aiodist.collectives import intranode, intranode_ops
from aiodist.comm.channel import GroupComm
from aiodist.errors import GroupError
from aiodist.net import shmpeer
from aiodist.net.shm import ShmConnection
from aiodist.net.tcp import TCPConnection


async def ranks_with(envs: list[Mapping[str, str]], fn: Callable[[int], Awaitable[Any]], timeout: float = 60) -> list[Any]:
    """run_ranks with an environment of its own for each rank."""
    port = free_port()
    n = len(envs)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(fn(r), context=rank_context(rank_env(r, n, port, envs[r]))) for r in range(n)]
    try:
        async with asyncio.timeout(timeout):
            return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def engine_of(pg: Any) -> intranode.GroupEngine | None:
    comm: GroupComm = pg._comm
    return intranode._ENGINES.get(comm)


@pytest.fixture
def small_rounds(monkeypatch: Any) -> None:
    """Rounds of 64 KiB and the engine from 16 KiB: a few hundred KiB take several rounds."""
    monkeypatch.setattr(intranode, "ROUND_BYTES", 64 << 10)
    monkeypatch.setattr(intranode, "ENGINE_MIN_BYTES", 16 << 10)
    monkeypatch.setattr(intranode, "ENGINE_MIN_BYTES_MANY", 16 << 10)
    monkeypatch.setattr(intranode, "CHUNK_BYTES", 4 << 10)
    from aiodist.collectives import intranode_ops

    monkeypatch.setattr(intranode_ops, "ROUND_BYTES", 64 << 10)


async def every_op(r: int, p: int, make: Callable[[np.ndarray], np.ndarray], n: int) -> dict[str, Any]:
    """Run each engine collective once on arrays from ``make``; return what each produced (checked by the caller)."""
    rng = np.random.default_rng(100 + r)
    out: dict[str, Any] = {}
    x = make(rng.standard_normal(n).astype(np.float32))
    out["input"] = x.copy()
    await dist.all_reduce(x)
    out["all_reduce"] = x.copy()
    a = make(np.full(n, r + 1, np.int64))
    await dist.all_reduce(a, op=dist.ReduceOp.MAX)
    out["max"] = a.copy()
    v = make(np.full(n, 2.0 * r, np.float64))
    await dist.all_reduce(v, op=dist.ReduceOp.AVG)
    out["avg"] = v.copy()
    b = make(np.full(n, r, np.int64) if r == p - 1 else np.zeros(n, np.int64))
    await dist.broadcast(b, src=p - 1)
    out["broadcast"] = b.copy()
    c = make(np.arange(n, dtype=np.int32) * (r + 1))
    await dist.reduce(c, dst=1)
    out["reduce"] = c.copy()
    m = n // p
    g = make(np.full(m, r, np.float32))
    whole = np.zeros(m * p, np.float32)
    await dist.all_gather_into_tensor(whole, g)
    out["all_gather_into_tensor"] = whole
    outs = [np.zeros(m, np.float32) for _ in range(p)]
    await dist.all_gather(outs, g)
    out["all_gather"] = np.concatenate(outs)
    big = make(np.arange(m * p, dtype=np.float32) + r)
    mine = np.zeros(m, np.float32)
    await dist.reduce_scatter_tensor(mine, big)
    out["reduce_scatter_tensor"] = mine
    lst = [make(np.full(m, 10 * j + r, np.float64)) for j in range(p)]
    one = np.zeros(m, np.float64)
    await dist.reduce_scatter(one, lst)
    out["reduce_scatter"] = one
    return out


def check_every_op(results: list[dict[str, Any]], p: int, n: int) -> None:
    inputs = [res["input"] for res in results]
    total = inputs[0].astype(np.float32).copy()
    for x in inputs[1:]:
        total = total + x  # the engine adds in rank order, as here
    m = n // p
    for r, res in enumerate(results):
        assert np.array_equal(res["all_reduce"], total), r
        assert res["all_reduce"].tobytes() == results[0]["all_reduce"].tobytes()  # bit-identical everywhere
        assert (res["max"] == p).all()
        assert np.allclose(res["avg"], (p - 1.0))
        assert (res["broadcast"] == p - 1).all()
        expect_reduce = np.arange(n, dtype=np.int32) * (p * (p + 1) // 2 if r == 1 else r + 1)
        assert np.array_equal(res["reduce"], expect_reduce), r
        assert np.array_equal(res["all_gather_into_tensor"], np.repeat(np.arange(p, dtype=np.float32), m))
        assert np.array_equal(res["all_gather"], np.repeat(np.arange(p, dtype=np.float32), m))
        expect_rs = (np.arange(m * p, dtype=np.float32).reshape(p, m)[r] * p) + sum(range(p))
        assert np.array_equal(res["reduce_scatter_tensor"], expect_rs), r
        assert (res["reduce_scatter"] == 10 * r * p + sum(range(p))).all()


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize(
    ("shared", "direct"),
    [(False, True), (False, False), (True, False)],
    ids=["plain-direct", "plain-staging", "shared"],
)
async def test_every_engine_collective_gives_the_right_bits_on_every_rank(
    p: int, shared: bool, direct: bool, small_rounds: None, monkeypatch: Any
) -> None:
    """plain-direct: ordinary arrays, read and written in the peers' memory (cross-memory attach);
    plain-staging: the same where that is not allowed (through the staging buffers); shared: arrays
    in shared memory, read and written in place."""
    n = 6 * 64 * 1024 // 4 + 7  # six rounds of float32 and a bit (more than the staging buffers), not divisible by p
    if not direct:
        monkeypatch.setattr(shmpeer, "probe", lambda *a: False)
    if shared or direct:
        # In place: the staging buffers are never touched.
        def no_staging(*a: Any, **k: Any) -> Any:
            raise AssertionError("a collective on arrays reachable in place used the staging buffers")

        monkeypatch.setattr(intranode.GroupEngine, "staging", no_staging)

    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            make = aiodist.shared_array if shared else (lambda a: a)
            res = await every_op(r, p, make, n - n % p if shared else n)
            eng = engine_of(dist._world())
            assert repr(eng).endswith(" on>") and eng is not None and eng.direct == direct
            return res
        finally:
            await dist.destroy_process_group()

    results = await ranks_with([{}] * p, rank)
    check_every_op(results, p, n - n % p if shared else n)


@pytest.mark.parametrize("direct", [False, True])
async def test_mixed_plain_and_shared_arrays(direct: bool, small_rounds: None, monkeypatch: Any) -> None:
    """Without direct access the plain array forces the staging path; with it, every array is reached in place."""
    if not direct:
        monkeypatch.setattr(shmpeer, "probe", lambda *a: False)

    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            x = np.arange(100_000, dtype=np.float64) * (r + 1)
            if r == 1:
                x = aiodist.shared_array(x)
            await dist.all_reduce(x)
            y = aiodist.shared_array(np.full(50_000, r, np.int64)) if r == 0 else np.full(50_000, r, np.int64)
            await dist.broadcast(y, src=0)
            return x, y
        finally:
            await dist.destroy_process_group()

    for x, y in await ranks_with([{}] * 2, rank):
        assert np.array_equal(x, np.arange(100_000, dtype=np.float64) * 3)
        assert (y == 0).all()


async def test_forced_tcp_on_one_rank_turns_the_engine_off_for_the_group(small_rounds: None) -> None:
    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            x = np.full(200_000, r + 1, np.float32)
            await dist.all_reduce(x)
            await dist.all_reduce(x)
            return float(x[0]), repr(engine_of(dist._world()))
        finally:
            await dist.destroy_process_group()

    got = await ranks_with([{}, {"AIODIST_TRANSPORT": "tcp"}], rank)
    assert [v for v, _ in got] == [6.0, 6.0]
    assert all(state.endswith(" off>") for _, state in got), got


async def test_init_process_group_transport_tcp_connects_over_tcp() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=20, transport="tcp")
        try:
            await pg.all_reduce(np.ones(4))
            return type(pg.transport._peers[1 - r].conn).__name__
        finally:
            await dist.destroy_process_group()

    assert set(await ranks_with([{}] * 2, rank)) <= {"TCPConnection", "_ServerConnection"}

    async def bad(r: int) -> Any:
        with pytest.raises(ValueError, match="transport"):
            await dist.init_process_group(timeout=5, transport="carrier pigeon")

    await ranks_with([{}], bad)


async def test_two_hosts_of_two_ranks_use_shared_memory_inside_a_host_and_tcp_across(small_rounds: None) -> None:
    hosts = ["A", "A", "B", "B"]

    async def rank(r: int) -> Any:
        world = await dist.init_process_group(timeout=30)
        try:
            a = await dist.new_group([0, 1])
            b = await dist.new_group([2, 3])
            across = await dist.new_group([1, 2])
            x = np.arange(100_000, dtype=np.float64) + r
            await dist.all_reduce(x)  # the world spans both hosts
            mine = a if r < 2 else b
            y = np.full(100_000, r, np.int64)
            await dist.all_reduce(y, group=mine)
            z = np.full(100_000, r, np.int64)
            if r in (1, 2):
                await dist.all_reduce(z, group=across)
            kinds = {q: type(p.conn).__name__ for q, p in world.transport._peers.items() if p.conn is not None}
            states = {
                name: repr(engine_of(g)).split()[-1].rstrip(">")
                for name, g in (("world", world), ("host", mine), ("across", across))
                if engine_of(g) is not None
            }
            await dist.barrier()  # (a rank that leaves ends its groups' shared memory on the others)
            return x, y, z, kinds, states
        finally:
            await dist.destroy_process_group()

    results = await ranks_with([{"AIODIST_HOST_ID": h} for h in hosts], rank)
    for r, (x, y, z, kinds, states) in enumerate(results):
        assert np.array_equal(x, np.arange(100_000, dtype=np.float64) * 4 + 6)
        assert (y == (1 if r < 2 else 5)).all()
        if r in (1, 2):
            assert (z == 3).all()
        for q, kind in kinds.items():
            same_host = hosts[q] == hosts[r]
            assert (kind == ShmConnection.__name__) == same_host, (r, q, kind)
            assert same_host or kind in (TCPConnection.__name__, "_ServerConnection")
        assert states["world"] == "off" and states["host"] == "on", (r, states)
        if r in (1, 2):
            assert states["across"] == "off"


async def test_concurrent_engine_operations_run_in_call_order(small_rounds: None) -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=20)
        try:
            xs = [np.full(50_000, i + r, np.float64) for i in range(5)]
            works = [pg.all_reduce(x) if i % 2 == 0 else pg.broadcast(x, src=i % 2) for i, x in enumerate(xs)]
            await asyncio.gather(*works)
            return [float(x[0]) for x in xs]
        finally:
            await dist.destroy_process_group()

    got = await ranks_with([{}] * 2, rank)
    assert got[0] == got[1] == [1.0, 2.0, 5.0, 4.0, 9.0]


async def test_a_destroyed_group_unmaps_its_engine_at_once(small_rounds: None) -> None:
    """Before (shm probe): every destroyed group kept its engine and mappings (the weak table's value held
    its key): 3 memfd mappings and 6 descriptors per rank per group, for the process's life."""
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            counts = []
            for i in range(4):
                g = await dist.new_group([0, 1])
                x = np.full(200_000, r + i, np.float32)
                await g.all_reduce(x)
                eng = engine_of(g)
                assert eng is not None and repr(eng).endswith(" on>") and float(x[0]) == 2 * i + 1
                await dist.barrier()
                await g.destroy()
                assert g._comm not in intranode._ENGINES and repr(eng).endswith(" off>") and not eng._staging
                await dist.barrier()
                counts.append(fds())
            return counts
        finally:
            await dist.destroy_process_group()

    counts = (await ranks_with([{}] * 2, rank))[0]
    assert counts[-1] <= counts[0], counts  # (both ranks live in this process: its descriptors stay level)


async def test_peers_unmap_the_shared_arrays_their_owners_freed(small_rounds: None) -> None:
    """A loop that all_reduces a new shared array each step (``shared_array(grad)``) and drops it. Before (shm
    probe): every peer kept every array it had ever mapped until the group's end: 256 MiB more shared memory per
    step at 4 ranks x 64 MiB, and two descriptors per array and peer (a job with ``ulimit -n 1024`` died at
    step 162, "Too many open files"). Now a peer unmaps an owner's freed arrays before it maps the next one."""

    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            sizes = []
            for step in range(12):
                x = aiodist.shared_array(np.full(100_000, r + step, np.float32))
                await dist.all_reduce(x)
                assert float(x[0]) == 2 * step + 1
                eng = engine_of(dist.get_default_group())
                assert eng is not None and repr(eng).endswith(" on>")
                sizes.append(len(eng._attached))
                del x
                await dist.barrier()  # (the owner's array is gone before the next step maps the new one)
            return sizes
        finally:
            await dist.destroy_process_group()

    for sizes in await ranks_with([{}] * 2, rank):
        assert max(sizes) <= 2, sizes  # (the peer's current array, and at most one freed but not yet swept)


@pytest.mark.parametrize("kind", ["op", "size"])
async def test_a_mismatch_on_the_engine_path_raises_on_every_rank_within_a_second(kind: str, small_rounds: None) -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=20)
        loop = asyncio.get_running_loop()
        try:
            x = np.ones(100_000, np.float32)
            await pg.all_reduce(x)  # the engine is on
            start = loop.time()
            with pytest.raises(aiodist.CollectiveMismatchError) as info:
                if kind == "op":
                    await (pg.broadcast(x, src=0) if r == 2 else pg.all_reduce(x))
                else:
                    await pg.all_reduce(np.ones(120_000 if r == 1 else 100_000, np.float32))
                await pg.all_reduce(x)  # (a part that completed unawares learns it here)
            await asyncio.sleep(0.5)  # the others must not see us leave first
            return loop.time() - start - 0.5, str(info.value)
        finally:
            await dist.destroy_process_group()

    results = await ranks_with([{}] * 3, rank)
    for took, msg in results:
        assert took < 1.0, (took, msg)
    words = ("broadcast", "all_reduce") if kind == "op" else ("n=100000", "n=120000")
    assert any(all(w in msg for w in words) for _, msg in results), results


async def test_the_engine_takes_bfloat16_and_strided_arrays(small_rounds: None) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")

    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            x = np.full(100_000, r + 1, ml_dtypes.bfloat16)
            await dist.all_reduce(x)
            big = np.arange(400_000, dtype=np.float32).reshape(400, 1000) * (r + 1)
            await dist.all_reduce(big[:, ::2])  # strided: the dtype layer stages it, the engine sees a copy
            return x, big, repr(engine_of(dist._world()))
        finally:
            await dist.destroy_process_group()

    base = np.arange(400_000, dtype=np.float32).reshape(400, 1000)
    for r, (x, big, state) in enumerate(await ranks_with([{}] * 2, rank)):
        assert x.dtype == ml_dtypes.bfloat16 and (x.astype(np.float32) == 3).all()
        assert np.array_equal(big[:, ::2], base[:, ::2] * 3) and np.array_equal(big[:, 1::2], base[:, 1::2] * (r + 1))
        assert state.endswith(" on>")


@pytest.mark.parametrize("p", [2, 3])
async def test_all_to_all_reads_large_blocks_in_place_and_sends_small_ones(p: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(intranode, "PAIR_MIN_BYTES", 64 << 10 if p == 3 else 32 << 10)
    read: list[int] = []
    real = intranode_ops._Array.read_into
    monkeypatch.setattr(intranode_ops._Array, "read_into", lambda self, lo, out: (read.append(out.nbytes), real(self, lo, out)))

    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            await dist.all_reduce(np.ones(1 << 20, np.float32))  # an earlier collective turned the engine on
            await dist.barrier()
            read.clear()
            await dist.barrier()
            ins = [(j + 1) * (r + 1) * 5000 for j in range(p)]  # rank r sends rank j this many: uneven
            outs = [(r + 1) * (j + 1) * 5000 for j in range(p)]
            x = np.concatenate([np.full(n, 100 * r + j, np.float32) for j, n in enumerate(ins)])
            out = np.zeros(sum(outs), np.float32)
            await dist.all_to_all_single(out, x, output_split_sizes=outs, input_split_sizes=ins)
            return np.split(out, np.cumsum(outs)[:-1])
        finally:
            await dist.destroy_process_group()

    for r, blocks in enumerate(await ranks_with([{}] * p, rank)):
        assert [set(b.tolist()) for b in blocks] == [{100.0 * j + r} for j in range(p)]
    sizes = [4 * (r + 1) * (j + 1) * 5000 for r in range(p) for j in range(p) if r != j]
    least = intranode.PAIR_MIN_BYTES
    assert sorted(read) == sorted(n for n in sizes if n >= least) and read  # every large block, and only those, in place
    assert any(n < least for n in sizes) or p == 2  # (and some small ones went as messages)


async def test_all_to_all_blocks_of_other_sizes_are_a_mismatch_in_place_too(monkeypatch: Any) -> None:
    monkeypatch.setattr(intranode, "PAIR_MIN_BYTES", 64 << 10)

    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=20)
        try:
            await dist.all_reduce(np.ones(1 << 20, np.float32))
            n = 40_000 if r == 0 else 50_000  # rank 0 sends 160 KB, rank 1 expects 200 KB from it
            x = np.zeros(2 * n, np.float32)
            with pytest.raises(aiodist.CollectiveMismatchError):
                await dist.all_to_all_single(np.zeros(2 * n, np.float32), x)
        finally:
            await dist.destroy_process_group()

    await ranks_with([{}] * 2, rank, timeout=30)
