"""Call-order matching, timeouts, mismatches and peer failures of process groups (real TCP)."""

from __future__ import annotations

import asyncio
import warnings
import random
from typing import Any

import numpy as np
import pytest
from conftest import run_ranks, run_world

import aiodist.api as dist
from aiodist.collectives.ops import ReduceOp
from aiodist.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    GroupError,
    PeerCallFailedError,
    PeerFailureError,
)
from aiodist.group import Work


async def test_handles_match_by_call_order_whatever_the_await_order() -> None:
    count = 40

    async def body(pg: Any) -> list[np.ndarray]:
        xs = [np.full(50 + i, (pg.rank + 1) * (i + 1), np.int64) for i in range(count)]
        handles = [pg.all_reduce(x) for x in xs]
        assert [h.seq for h in handles] == list(range(count))
        order = list(range(count))
        random.Random(pg.rank).shuffle(order)  # every rank awaits in its own order
        for i in order:
            assert await handles[i] is xs[i]
        assert all(h.done() for h in handles)
        return xs

    p = 4
    results = await run_world(p, body)
    total = sum(range(1, p + 1))
    for xs in results:
        for i, x in enumerate(xs):
            assert (x == total * (i + 1)).all()


async def test_different_collectives_in_flight_and_awaited_backwards() -> None:
    async def body(pg: Any) -> tuple[Any, ...]:
        a = np.full(8, pg.rank, np.float64)
        b = np.full(3, pg.rank, np.int32)
        gl = [np.empty(2, np.int16) for _ in range(pg.size)]
        h1 = pg.all_reduce(a, ReduceOp.MAX)
        h2 = pg.broadcast(b, src=1)
        h3 = pg.all_gather(gl, np.full(2, pg.rank, np.int16))
        h4 = pg.barrier()
        await h4
        await h3.wait()
        await h2
        await h1
        return a[0], b[0], [int(g[0]) for g in gl]

    results = await run_world(3, body)
    assert results == [(2.0, 1, [0, 1, 2])] * 3


async def test_a_rank_that_never_calls_is_named_in_the_timeout() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        try:
            if r == 1:
                await asyncio.sleep(1.0)  # never calls the all_reduce
                return None
            with pytest.raises(CollectiveTimeoutError) as ei:
                await pg.all_reduce(np.ones(4), timeout=0.3)
            return ei.value
        finally:
            await dist.destroy_process_group()

    err = (await run_ranks(2, rank))[0]
    assert err.op == "all_reduce" and err.seq == 0
    assert err.waiting_for == [1]
    assert "rank 1" in str(err)
    assert isinstance(err, TimeoutError)


async def test_monitored_barrier_names_every_missing_rank() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        try:
            if r in (2, 3):
                await asyncio.sleep(0.8)
                return None
            if r == 0:
                with pytest.raises(CollectiveTimeoutError) as ei:
                    await dist.monitored_barrier(timeout=0.3)
                return ei.value.waiting_for
            # Rank 0's verdict reaches it: the missing ranks are named. (Before: a CollectiveTimeoutError
            # or a PeerFailureError blaming rank 0, which was waiting for ranks 2 and 3 like everyone.)
            with pytest.raises(PeerCallFailedError) as pe:
                await dist.monitored_barrier(timeout=0.3)
            return pe.value.global_rank, str(pe.value)
        finally:
            await dist.destroy_process_group()

    results = await run_ranks(4, rank)
    assert results[0] == [2, 3]
    culprit, text = results[1]
    assert culprit == 0 and "still waiting for rank 2 (global 2), rank 3 (global 3)" in text, text


async def test_different_collectives_at_one_seq_are_a_mismatch() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        try:
            x = np.arange(6, dtype=np.float64)
            before = x.copy()
            h = pg.all_reduce(x) if r == 0 else pg.broadcast(x, src=0)
            try:
                await h.wait()
            except (CollectiveMismatchError, CollectiveTimeoutError) as e:
                return e, before, x
            return None, before, x
        finally:
            await dist.destroy_process_group()

    results = await run_ranks(2, rank)
    # both ranks learn it at once (the one that sees it tells the other), not by timing out
    for e, _, _ in results:
        assert isinstance(e, CollectiveMismatchError), results
        assert e.seq == 0
        assert "all_reduce" in str(e) and "broadcast" in str(e)
    assert "all_reduce" in results[1][0].calls[0] and "broadcast" in results[1][0].calls[1]


async def test_mismatched_buffer_sizes_raise_instead_of_corrupting() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        try:
            x = np.full(10 if r == 0 else 20, 5.0)
            try:
                await pg.all_reduce(x, timeout=1.0)
            except (CollectiveMismatchError, CollectiveTimeoutError) as e:
                return e, x
            return None, x
        finally:
            await dist.destroy_process_group()

    results = await run_ranks(2, rank)
    for e, x in results:
        assert isinstance(e, CollectiveMismatchError), results
        assert "n=10" in str(e) and "n=20" in str(e)  # the element counts are in the fingerprint
        assert (x == 5.0).all()  # nothing was written
        assert (x == 5.0).all()  # the buffer was not written with the wrong-size message


async def test_a_crashed_rank_fails_the_others_quickly_and_is_named() -> None:
    crashed = asyncio.Event()

    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        try:
            x = np.ones(16)
            await pg.all_reduce(x)  # connections now exist
            if r == 2:
                pg.transport.abort()  # what a crash looks like to the peers
                crashed.set()
                return None
            await crashed.wait()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(PeerFailureError) as ei:
                await pg.all_reduce(x)
            elapsed = loop.time() - t0
            with pytest.raises(PeerFailureError):  # later operations fail at once too
                await pg.barrier()
            return ei.value, elapsed
        finally:
            await dist.destroy_process_group()

    results = await run_ranks(3, rank)
    for err, elapsed in results[:2]:
        assert err.rank == 2 and err.global_rank == 2
        assert "connection lost" in (err.how or "") or "closed" in (err.how or "")
        assert elapsed < 3.0  # detected, not timed out (timeout is 10 s)


async def test_a_rank_that_leaves_cleanly_only_fails_what_waits_for_it() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        try:
            if r == 2:
                await pg.send(np.arange(3.0), dst=0)
                return None  # destroy: says bye
            if r == 0:
                buf = np.empty(3)
                assert await pg.recv(buf, src=2) == 2
                assert buf.tolist() == [0.0, 1.0, 2.0]
            sub = np.full(4, r + 1.0)
            # ranks 0 and 1 keep working together after rank 2 left
            await dist.send(sub, dst=1 - r) if r == 0 else await dist.recv(sub, src=0)
            return sub.tolist()
        finally:
            await dist.destroy_process_group()

    results = await run_ranks(3, rank)
    assert results[1] == [1.0] * 4


async def test_operations_need_a_member_and_an_initialized_group() -> None:
    async def uninitialized(r: int) -> None:  # a fresh rank scope: no default group
        with pytest.raises(GroupError, match="init_process_group"):
            dist.all_reduce(np.ones(2))
        with pytest.raises(GroupError):
            dist.get_rank()

    await run_ranks(1, uninitialized)

    async def body(pg: Any) -> None:
        sub = await dist.new_group([0])
        if pg.rank == 1:  # torch's semantics: a non-member's operation does nothing, with one warning
            assert not sub.is_member and sub.rank == -1
            x = np.ones(2)
            with pytest.warns(UserWarning, match="not a member"):
                assert await sub.all_reduce(x) is x
            assert x.tolist() == [1.0, 1.0]
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert await dist.broadcast(x, src=0, group=sub) is x  # (warned once per group)
                sub.barrier()  # not awaited: it does nothing, so it is not an operation never awaited
        else:
            assert (await sub.all_reduce(np.ones(2))).tolist() == [1.0, 1.0]

    await run_world(2, body)


async def test_work_handle_interface() -> None:
    async def body(pg: Any) -> None:
        h = pg.all_reduce(np.ones(3))
        assert isinstance(h, Work) and h.op == "all_reduce" and h.seq == 0
        res = await h.wait(timeout=5)
        assert h.done() and h.is_success() and res is h.result()
        # cancelling an awaiter does not cancel the collective
        x = np.ones(3)
        h2 = pg.all_reduce(x)
        waiter = asyncio.ensure_future(h2.wait())
        await asyncio.sleep(0)
        waiter.cancel()
        assert (await h2).tolist() == [2.0] * 3

    await run_world(2, body)


async def test_heartbeats_keep_idle_connections_alive() -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10)
        try:
            x = np.ones(2)
            await pg.all_reduce(x)
            await asyncio.sleep(0.8)  # idle for longer than the heartbeat timeout, loop responsive
            await pg.all_reduce(x)
            return x.tolist()
        finally:
            await dist.destroy_process_group()

    res = await run_ranks(3, rank, env={"AIODIST_HEARTBEAT_TIMEOUT": "0.3"})
    assert res == [[9.0, 9.0]] * 3


@pytest.mark.parametrize("other", ["all_reduce", "leave"])
def test_monitored_barrier_on_rank_0_raises_the_error_itself_not_an_exception_group(other: str) -> None:
    # Before: rank 0 raised "unhandled errors in a TaskGroup" (an ExceptionGroup: not a RuntimeError, so
    # `except RuntimeError` / `except PeerFailureError` missed it) when another rank called something else or left.
    import sim
    from aiodist.errors import AiodistError

    async def main() -> Any:
        await dist.init_process_group(timeout=10)
        r = dist.get_rank()
        if r == 2:
            if other == "all_reduce":
                try:
                    await dist.all_reduce(np.ones(2))
                except AiodistError:
                    pass
            return None
        try:
            await dist.monitored_barrier(timeout=5)
        except Exception as e:  # noqa: BLE001 - its type is the result
            return type(e).__name__, isinstance(e, AiodistError)
        return "ok"

    res = sim.run(main, world_size=3, seed=0, trace=False)
    assert res.ok, res.summary()
    want = "CollectiveMismatchError" if other == "all_reduce" else "PeerFailureError"
    assert res.rank_results[0] == (want, True), res.rank_results
