"""Rendezvous: env://, tcp://, store=, and the errors of bad setups (real TCP)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from conftest import free_port, rank_context, rank_env, run_ranks

import aiodist.api as dist
import sim
from aiodist.context import getenv
from aiodist.errors import GroupError, RendezvousError, RendezvousTimeoutError
from aiodist.store.client import TCPStore
from aiodist.store.server import StoreServer


async def test_env_rendezvous_sets_rank_world_and_a_usable_store() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group("env://", timeout=10)
        try:
            assert dist.get_rank() == r == pg.rank and dist.get_world_size() == 3 == pg.size
            assert pg.local_rank == r and pg.local_world_size == 3
            assert dist.is_initialized()
            await pg.store.set(f"user/{r}", f"hello {r}")
            other = await pg.store.get(f"user/{(r + 1) % 3}", timeout=5)
            await pg.barrier()
            return other, pg.job_id
        finally:
            await dist.destroy_process_group()
        assert not dist.is_initialized()

    res = await run_ranks(3, rank)
    assert [o for o, _ in res] == [b"hello 1", b"hello 2", b"hello 0"]
    assert len({j for _, j in res}) == 1  # one job id for all


async def test_tcp_rendezvous_and_backend_name_alias() -> None:
    port = free_port()

    async def rank(r: int) -> Any:
        if r == 0:
            pg = await dist.init_process_group(f"tcp://127.0.0.1:{port}", rank=0, world_size=2, timeout=10)
        else:
            pg = await dist.init_process_group("gloo", timeout=10)  # torch-style backend name: env://
        try:
            return (await pg.all_reduce(np.array([r + 1]))).tolist()
        finally:
            await dist.destroy_process_group()

    assert await run_ranks(2, rank, port=port) == [[3], [3]]


async def test_given_store_and_reinitialization_on_the_same_store() -> None:
    async with await StoreServer.start(host="127.0.0.1", port=0) as server:

        async def rank(r: int) -> Any:
            store = await TCPStore.connect("127.0.0.1", server.port, timeout=10)
            try:
                jobs = []
                for round_ in range(2):
                    pg = await dist.init_process_group(store=store, rank=r, world_size=3, timeout=10)
                    with pytest.raises(GroupError, match="already initialized"):
                        await dist.init_process_group(store=store, rank=r, world_size=3)
                    x = await pg.all_reduce(np.array([round_ + 1]))
                    jobs.append((pg.job_id, int(x[0])))
                    await dist.destroy_process_group()
                return jobs
            finally:
                await store.close()

        res = await run_ranks(3, rank)
    assert [v for _, v in res[0]] == [3, 6]
    assert res[0][0][0] != res[0][1][0]  # a new job id per round
    assert all(r == res[0] for r in res)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"MASTER_ADDR": ""}, "MASTER_ADDR"),
        ({"RANK": ""}, "RANK is not set"),
        ({"WORLD_SIZE": "two"}, "not an integer"),
        ({"RANK": "4"}, "out of range"),
    ],
)
async def test_bad_environment_is_a_clear_error(env: dict[str, str], match: str) -> None:
    ctx = rank_context(rank_env(0, 2, free_port(), env))
    task = asyncio.get_running_loop().create_task(dist.init_process_group(timeout=2), context=ctx)
    with pytest.raises(RendezvousError, match=match):
        await task


async def test_unsupported_init_method() -> None:
    async def rank(r: int) -> None:
        with pytest.raises(RendezvousError, match="unsupported"):
            await dist.init_process_group("udp://127.0.0.1:1", rank=0, world_size=1)  # (file:// is supported)

    await run_ranks(1, rank)


async def _with_store(n: int, fn: Any, **kw: Any) -> list[Any]:
    async with await StoreServer.start(host="127.0.0.1", port=0) as server:

        async def rank(r: int) -> Any:
            store = await TCPStore.connect("127.0.0.1", server.port, timeout=10)
            try:
                return await fn(r, store)
            finally:
                await store.close()

        return await run_ranks(n, rank, **kw)


async def _init_or_error(store: Any, rank: int, world_size: int, timeout: float = 3.0) -> Any:
    try:
        await dist.init_process_group(store=store, rank=rank, world_size=world_size, timeout=timeout)
    except RendezvousError as e:
        return e
    try:
        return "ok"
    finally:
        await dist.destroy_process_group()


async def test_world_size_disagreement() -> None:
    res = await _with_store(2, lambda r, s: _init_or_error(s, r, 2 if r == 0 else 3, timeout=1.0))
    errors = [e for e in res if isinstance(e, RendezvousError)]
    assert errors and any("disagreement" in str(e) for e in errors), res


async def test_a_world_size_disagreement_fails_the_round_for_every_rank_at_once() -> None:
    # Ranks 0, 1 say WORLD_SIZE=4, rank 2 (later) says 3. Before: rank 2 raised at once, ranks 0 and 1 waited
    # their whole timeout (300 s by default), then blamed "ranks [2, 3] did not join".
    async def fn(r: int, store: Any) -> Any:
        if r == 2:
            await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        e = await _init_or_error(store, r, 3 if r == 2 else 4, timeout=20.0)
        return e, loop.time() - t0

    res = await _with_store(3, fn)
    for e, took in res:
        assert isinstance(e, RendezvousError) and not isinstance(e, RendezvousTimeoutError), res
        assert "world size disagreement" in str(e) and took < 5.0, res


async def test_duplicate_rank_is_refused() -> None:
    async def fn(r: int, store: Any) -> Any:
        if r == 1:
            await asyncio.sleep(0.1)
        return await _init_or_error(store, 0, 2, timeout=1.0)  # both claim rank 0

    res = await _with_store(2, fn)
    assert isinstance(res[1], RendezvousError) and "twice" in str(res[1]), res


async def test_a_duplicate_rank_fails_the_round_for_everyone_at_once() -> None:
    # World of 3 given ranks 0, 1, 1: before, ranks 0 and 1 waited their whole timeout (20 s) and then
    # blamed rank 2 ("ranks [2] did not join"), which no process had been given.
    async def fn(r: int, store: Any) -> Any:
        if r == 2:
            await asyncio.sleep(0.2)  # the second process with RANK=1
        t0 = asyncio.get_running_loop().time()
        e = await _init_or_error(store, min(r, 1), 3, timeout=20.0)
        return e, asyncio.get_running_loop().time() - t0

    res = await _with_store(3, fn)
    for e, took in res:
        assert isinstance(e, RendezvousError) and not isinstance(e, RendezvousTimeoutError), res
        assert "two processes were given RANK=1" in str(e) and took < 5.0, res
    assert "learned it from the store" in str(res[0][0]) and "learned" not in str(res[2][0])


async def test_rendezvous_timeout_names_the_missing_ranks() -> None:
    async def fn(r: int, store: Any) -> Any:
        return await _init_or_error(store, r, 3, timeout=0.5)  # rank 2 never comes

    res = await _with_store(2, fn)
    for e in res:
        assert isinstance(e, RendezvousTimeoutError) and isinstance(e, TimeoutError)
        assert e.missing == [2]
        assert "[2]" in str(e)


async def test_the_first_rank_to_time_out_ends_the_round_for_the_others_naming_the_missing_ranks() -> None:
    # Ranks 0 and 1 of 3 (env://, rank 0 hosts the store); rank 0 gives up after 1 s, rank 1 would wait 30 s.
    # Before: rank 1 got "RendezvousError: lost the store during rendezvous" when rank 0's store went with it
    # (3 runs of 6), naming nobody, or waited its own timeout.
    async def rank(r: int) -> Any:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            await dist.init_process_group(timeout=1.0 if r == 0 else 30.0)
        except RendezvousError as e:
            return e, loop.time() - t0
        raise AssertionError("rank 2 never came: the rendezvous cannot complete")

    res = await run_ranks(2, rank, env={"WORLD_SIZE": "3"}, timeout=20.0)
    for e, took in res:
        assert isinstance(e, RendezvousTimeoutError) and e.missing == [2] and took < 5.0, res
    assert "learned it from the store" in str(res[1][0]), res


async def test_unreachable_master_times_out() -> None:
    ctx = rank_context(rank_env(1, 2, free_port()))
    task = asyncio.get_running_loop().create_task(dist.init_process_group(timeout=0.5), context=ctx)
    with pytest.raises(RendezvousError, match="could not reach the store") as info:
        await task
    # Nothing answered: rank 0, which starts that store, is the rank missing (the launcher blames it, not rank 1).
    assert isinstance(info.value, RendezvousTimeoutError) and info.value.missing == [0], info.value
    assert "which rank 0 starts in its rendezvous" in str(info.value)


async def test_in_process_memory_store() -> None:
    from aiodist.store import MemoryStore

    store = MemoryStore()

    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(store=store, rank=r, world_size=4, timeout=10)
        try:
            assert pg.store is store
            return int((await pg.all_reduce(np.array([r], np.int64)))[0])
        finally:
            await dist.destroy_process_group()

    assert await run_ranks(4, rank) == [6] * 4


async def test_survivors_and_a_restarted_rank_rendezvous_again_after_a_crash() -> None:
    from aiodist.errors import PeerFailureError

    async def fn(r: int, store: Any) -> Any:
        pg = await dist.init_process_group(store=store, rank=r, world_size=3, timeout=10)
        await pg.all_reduce(np.ones(2))
        first_job = pg.job_id
        if r == 2:
            pg.transport.abort()  # crash...
            await dist.destroy_process_group()  # ...and come back as a new process would
        else:
            with pytest.raises(PeerFailureError) as ei:
                await pg.all_reduce(np.ones(2))
            assert ei.value.rank == 2
            await dist.destroy_process_group()  # abort the broken group
        pg = await dist.init_process_group(store=store, rank=r, world_size=3, timeout=10)
        try:
            assert pg.job_id != first_job
            return int((await pg.all_reduce(np.array([r + 1])))[0])
        finally:
            await dist.destroy_process_group()

    assert await _with_store(3, fn) == [6, 6, 6]


async def test_a_rank_whose_store_goes_away_mid_rendezvous_reconnects_to_the_new_one() -> None:
    """Survivors rebuilding after a failure: a rank may join the old store just before its host
    (rank 0) closes it and starts a new one on the same port; it must start over there, not fail."""
    port = free_port()
    old = await StoreServer.start(host="127.0.0.1", port=port)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}

    async def rank(r: int) -> Any:
        if r == 0:
            await asyncio.sleep(0.5)  # rank 1 joined the old store's round meanwhile
            await old.close()
        pg = await dist.init_process_group("env://", timeout=10)
        try:
            x = np.full(3, float(r + 1))
            await pg.all_reduce(x)
            return float(x[0])
        finally:
            await dist.destroy_process_group()

    try:
        assert await run_ranks(2, rank, env=env) == [3.0, 3.0]
    finally:
        await old.close()


async def _join_then_barrier() -> None:
    await dist.init_process_group(timeout=20)
    await dist.barrier()
    await dist.destroy_process_group()


@pytest.mark.parametrize("n", range(1, 10))
def test_a_store_connection_broken_mid_join_joins_the_same_round_again(n: int) -> None:
    """Rank 3's store connection is reset as it sends its n-th message (its handshake and join): it
    reconnects and joins the same round again. Before: from its 5th message on, the retry found its
    own claim and reported "joined rendezvous round 0 twice", or closed the transport that peers
    which had finished the round were connected to (they saw rank 3 leave)."""
    res = sim.run(_join_then_barrier, world_size=4, seed=1, explore=False,
                  faults=[sim.ResetConnection("rank3", "rank0", on=sim.MessageSent(3, n))])
    assert res.ok, res.summary()


@contextlib.asynccontextmanager
async def _host_leaving() -> AsyncIterator[tuple[asyncio.Future[None], TCPStore]]:
    """A store server, its host's client leaving a 2-rank round (waiting up to 10 s), and the other rank's client."""
    from aiodist.rendezvous import leave

    async with await StoreServer.start(host="127.0.0.1", port=0) as server:
        host = await TCPStore.connect("127.0.0.1", server.port, timeout=10)
        other = await TCPStore.connect("127.0.0.1", server.port, timeout=10)
        waiting = asyncio.ensure_future(leave(host, "job/", 2, wait=10.0, alone=lambda: server.clients <= 1))
        try:
            yield waiting, other
        finally:
            waiting.cancel()
            await host.close()
            await other.close()


async def test_the_store_host_stops_waiting_for_the_others_to_leave_once_nobody_else_is_connected() -> None:
    # Before: rank 0 (the store's host) that left first waited STORE_LEAVE_WAIT (10 s) for ranks that
    # had failed, or exited without leaving, and so could never say they left.
    from aiodist.rendezvous import LEAVE_POLL

    async with _host_leaving() as (waiting, other):
        await asyncio.sleep(3 * LEAVE_POLL)
        assert not waiting.done()  # the other rank is still connected: the host waits
        await other.close()  # it goes without leaving (it failed)
        async with asyncio.timeout(5):
            await waiting


async def test_the_store_host_still_waits_for_a_rank_that_is_connected_and_leaves_late() -> None:
    from aiodist.rendezvous import leave

    async with _host_leaving() as (waiting, other):
        await asyncio.sleep(0.5)
        assert await other.get("job/left", timeout=1) == b"1"  # the store still serves it
        assert not waiting.done()
        await leave(other, "job/", 2, wait=0)
        async with asyncio.timeout(5):
            await waiting


async def _rebuilt_without_a_paused_rank() -> str:
    import os

    rank = int(os.environ["RANK"])
    try:
        await dist.init_process_group(timeout=10 if rank == 2 else 1)
        return "joined"
    except RendezvousError as e:
        if rank == 2:
            return str(e)
    await dist.init_process_group(rank=rank, world_size=2, timeout=5)  # the others rebuild without rank 2
    await asyncio.sleep(5)  # (rank 2 resumes meanwhile)
    await dist.destroy_process_group()
    return "rebuilt"


def test_a_rank_that_rejoins_a_store_rebuilt_meanwhile_is_told_so() -> None:
    # Rank 2 stops (SIGSTOP) in the middle of its rendezvous; the others time out and rebuild a world of 2 on
    # a new store at the same address; rank 2 resumes, reconnects, and finds the new round. Before: only
    # "world size disagreement ... rank 2 has WORLD_SIZE=3, another rank registered 2".
    from sim.triggers import MessageSent

    res = sim.run(_rebuilt_without_a_paused_rank, world_size=3, seed=0, explore=False, trace=False,
                  faults=[sim.Pause(2, on=MessageSent(2, 4), duration=2.0)])
    assert res.ok and res.rank_results[:2] == ["rebuilt", "rebuilt"], res.summary()
    said = res.rank_results[2]
    assert "world size disagreement" in said and "lost the store at rank0:29500 during its rendezvous" in said, said
    assert "rebuilt without it" in said


async def _join_then_barrier_rank_2_last(last: bool) -> None:
    if last and getenv("RANK") == "2":
        await asyncio.sleep(0.01)  # the others have counted themselves: rank 2's count completes the round
    await dist.init_process_group(timeout=5)
    await dist.barrier()
    await dist.destroy_process_group()


@pytest.mark.parametrize("last", [False, True])
def test_a_rank_that_stops_anywhere_in_its_join_is_named_by_every_survivor(last: bool) -> None:
    """Rank 2 crashes as it sends its k-th frame (its store handshake, then each step of the join). Every
    survivor's error names it: in the rendezvous ("ranks [2] did not join") or after it (the barrier finds
    it gone). Before: stopped between registering and counting itself, it left a round nobody completed,
    and each survivor waited out its timeout to read "ranks [] did not join (4 of 4 did)"."""
    for k in range(1, 12):
        res = sim.run(_join_then_barrier_rank_2_last, world_size=4, seed=0, explore=False, args=(last,),
                      faults=[sim.Crash(2, on=sim.MessageSent(2, k))], trace=False)
        assert res.crashed == [2], (k, res.summary())
        survivors = [f for f in res.failures if f.rank != 2]
        assert survivors, (k, res.summary())
        for f in survivors:
            first = f.message.splitlines()[0]
            assert "ranks [2] did not join" in first or "rank 2 failed" in first, (k, first)
