"""Object collectives, the concurrent send/receive helper, and the cost models."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiodist.collectives import (
    all_gather_object,
    alpha_beta_cost,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
    selected_cost,
    tuning,
)
from aiodist.collectives.cost import COST_MODELS
from aiodist.collectives.memory import DuplicateKeyError, MemoryChannel, MemoryFabric
from aiodist.collectives.transfer import run_all, sendrecv
from aiodist.errors import CollectiveMismatchError, InvalidArrayError, InvalidRankError, PeerFailureError

PS = [1, 2, 3, 5, 8]


async def run_ranks(p: int, fn: Callable[[MemoryChannel], Awaitable[Any]], *, seed: int = 0) -> list[Any]:
    fabric = MemoryFabric(p, rng=random.Random(seed))
    async with asyncio.timeout(20):
        results = await asyncio.gather(*[fn(ch) for ch in fabric.channels()])
    assert fabric.undelivered() == []
    return list(results)


def obj_of(rank: int) -> Any:
    return {"rank": rank, "payload": "x" * (rank * 3), "nested": [rank, (rank, None)]}


# ------------------------------------------------------------------ object collectives


@pytest.mark.parametrize("p", PS)
async def test_all_gather_object(p: int) -> None:
    results = await run_ranks(p, lambda ch: all_gather_object(ch, 0, obj_of(ch.rank)), seed=p)
    assert results == [[obj_of(r) for r in range(p)]] * p


async def test_all_gather_object_large_payloads_take_the_concurrent_path() -> None:
    big = [b"%d" % r * 40_000 for r in range(3)]
    results = await run_ranks(3, lambda ch: all_gather_object(ch, 0, big[ch.rank]))
    assert results == [big] * 3


@pytest.mark.parametrize("p", PS)
async def test_broadcast_object_list_in_place(p: int) -> None:
    for src in sorted({0, p - 1}):
        lists = [[None, None, None] for _ in range(p)]
        lists[src] = [1, "two", {"three": 3.0}]
        want = list(lists[src])
        originals = [id(x) for x in lists]
        await run_ranks(p, lambda ch: broadcast_object_list(ch, 0, lists[ch.rank], src), seed=src)
        assert lists == [want] * p
        assert [id(x) for x in lists] == originals  # the caller's lists were filled in place


async def test_broadcast_object_list_length_mismatch() -> None:
    lists: list[list[Any]] = [[1, 2, 3], [None]]
    results = await asyncio.gather(
        *[broadcast_object_list(ch, 0, lists[ch.rank], 0) for ch in MemoryFabric(2).channels()],
        return_exceptions=True,
    )
    assert results[0] is None and isinstance(results[1], CollectiveMismatchError)
    assert results[1].calls == {0: "broadcast_object_list(len=3)", 1: "broadcast_object_list(len=1)"}


@pytest.mark.parametrize("p", PS)
async def test_gather_object(p: int) -> None:
    dst = p - 1
    sink = [None] * p
    results = await run_ranks(p, lambda ch: gather_object(ch, 0, obj_of(ch.rank), dst, sink if ch.rank == dst else None))
    want = [obj_of(r) for r in range(p)]
    assert results[dst] == want and sink == want
    assert all(results[r] is None for r in range(p) if r != dst)


@pytest.mark.parametrize("p", PS)
async def test_scatter_object_list(p: int) -> None:
    src = p // 2
    outs = [[None] for _ in range(p)]
    inputs = [obj_of(r) for r in range(p)]
    results = await run_ranks(
        p, lambda ch: scatter_object_list(ch, 0, outs[ch.rank], inputs if ch.rank == src else None, src)
    )
    assert results == inputs and [o[0] for o in outs] == inputs


async def test_object_collectives_validate_before_sending() -> None:
    fabric = MemoryFabric(2)
    ch = fabric.channel(0)
    with pytest.raises(InvalidRankError):
        await broadcast_object_list(ch, 0, [1], 5)
    with pytest.raises(InvalidRankError):
        await gather_object(ch, 0, 1, -1)
    with pytest.raises(InvalidArrayError):
        await scatter_object_list(ch, 0, [None], [1], 0)  # one object for two ranks
    with pytest.raises(InvalidArrayError):
        await scatter_object_list(ch, 0, [], [1, 2], 0)
    assert fabric.messages == [0, 0]


# ------------------------------------------------------------------ transfer helpers and the memory channel


class FailingSend(MemoryChannel):
    async def send(self, peer: int, key: tuple[Any, ...], payload: Any) -> None:
        await asyncio.sleep(0)
        raise PeerFailureError("peer gone", rank=peer)


async def test_sendrecv_large_send_failure_interrupts_the_receive() -> None:
    fabric = MemoryFabric(2)
    ch = FailingSend(fabric, 0)
    big = memoryview(bytearray(1 << 20))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(PeerFailureError) as info:
        await asyncio.wait_for(sendrecv(ch, 1, (0,), big, 1, (0,), memoryview(bytearray(4))), 5)
    assert info.value.rank == 1
    assert loop.time() - t0 < 1.0  # the failed send cut the receive short; no waiting for the timeout
    assert fabric._waiting == {}  # the receive was withdrawn


async def test_run_all_cancels_siblings_on_error_and_on_cancel() -> None:
    started = asyncio.Event()
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            started.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def boom() -> None:
        await started.wait()
        raise ValueError("boom")

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(ValueError, match="boom"):
        async with asyncio.timeout(5):
            await run_all([forever("a"), boom(), forever("b")])
    assert loop.time() - t0 < 1.0  # the error interrupted the wait at once
    assert sorted(cancelled) == ["a", "b"]

    cancelled.clear()
    started.clear()
    outer = asyncio.ensure_future(run_all([forever("c"), forever("d")]))
    await started.wait()
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert sorted(cancelled) == ["c", "d"]


@pytest.mark.parametrize("sibling_fails", [True, False])
async def test_run_all_cancelled_again_while_its_siblings_end_waits_for_them_and_counts_both(sibling_fails: bool) -> None:
    """Cancellation probe (all_to_all with short timeouts): a sibling failed (run_all cancels itself) and the
    group's deadline cancelled the task too while the other siblings were ending. The second cancellation
    cut run_all's wait short: a sibling was left running, another's error was never retrieved (asyncio
    logged it), and the task, cancelled twice but uncancelled once, ended as a plain cancellation: the op
    runner took it for the group's destruction ("process group was destroyed") instead of its timeout.
    Now run_all waits for every sibling, and both cancellations count (one is left for the runner)."""
    ended: list[str] = []
    logged: list[Any] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: logged.append(ctx))

    async def boom() -> None:
        await asyncio.sleep(0.001)
        raise ValueError("boom")

    async def slow_to_end(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # (ending takes a while: a receive withdrawn, a send flushed)
            ended.append(name)
            if name == "late-error":
                raise RuntimeError("a sibling's own error while it ended") from None
            raise

    parts = [boom(), slow_to_end("a"), slow_to_end("late-error")] if sibling_fails else \
        [slow_to_end("a"), slow_to_end("late-error"), slow_to_end("main")]
    task = asyncio.ensure_future(run_all(parts + [asyncio.sleep(3600)]))
    await asyncio.sleep(0.02)  # (the siblings are ending when the deadline comes)
    if not sibling_fails:
        task.cancel()
        await asyncio.sleep(0.01)
    task.cancel()  # the deadline
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(ended)[:2] == ["a", "late-error"], ended  # none left running
    assert task.cancelling() == (1 if sibling_fails else 2)  # (run_all drops only its own; the deadline's stays)
    del task
    import gc

    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert logged == [], logged  # every error retrieved


async def test_memory_channel_detects_duplicate_keys_and_size_mismatch() -> None:
    fabric = MemoryFabric(2)
    a, b = fabric.channels()
    await a.send(1, (0, 1), b"abc")
    with pytest.raises(DuplicateKeyError):
        await a.send(1, (0, 1), b"abc")
    with pytest.raises(CollectiveMismatchError) as info:
        await b.recv_into(0, (0, 1), memoryview(bytearray(2)))
    assert info.value.seq == 0
    out = memoryview(bytearray(3))
    recv = asyncio.ensure_future(b.recv_into(0, (0, 2), out))
    await asyncio.sleep(0)
    await a.send(1, (0, 2), b"xyz")
    await recv
    assert bytes(out) == b"xyz"


# ------------------------------------------------------------------ cost models


def test_cost_models_match_reference_formulas() -> None:
    a, b, g, n = 1e-5, 1e-9, 5e-10, 1 << 20
    assert alpha_beta_cost("all_reduce.ring", 4, n, a, b, g) == pytest.approx(6 * a + 1.5 * n * b + 0.75 * n * g)
    assert alpha_beta_cost("all_reduce.recursive_doubling", 8, n, a, b, g) == pytest.approx(3 * (a + n * b + n * g))
    assert alpha_beta_cost("broadcast.binomial", 5, n, a, b) == pytest.approx(3 * (a + n * b))
    assert alpha_beta_cost("barrier.dissemination", 9, 0, a, b) == pytest.approx(4 * a)
    assert alpha_beta_cost("all_gather.bruck", 6, n, a, b) == pytest.approx(3 * a + 5 / 6 * n * b)
    # folding 6 -> 4 ranks adds two whole-vector messages and one reduction
    six = alpha_beta_cost("all_reduce.rabenseifner", 6, n, a, b, g)
    four = alpha_beta_cost("all_reduce.rabenseifner", 4, n, a, b, g)
    assert six == pytest.approx(four + 2 * (a + n * b) + n * g)
    lower = alpha_beta_cost("all_reduce.lower_bound", 16, n, a, b, g)
    for name in COST_MODELS:
        assert alpha_beta_cost(name, 1, n, a, b, g) == 0.0
        if name.startswith("all_reduce."):
            assert alpha_beta_cost(name, 16, n, a, b, g) >= lower * (1 - 1e-12)
    with pytest.raises(KeyError):
        alpha_beta_cost("all_reduce.magic", 4, n, a, b)


def test_ring_is_bandwidth_optimal_and_doubling_latency_optimal() -> None:
    a, b, g = 2e-5, 1e-9, 0.0
    p = 16
    lower = alpha_beta_cost("all_reduce.lower_bound", p, 1 << 26, a, b, g)
    assert alpha_beta_cost("all_reduce.ring", p, 1 << 26, a, b, g) < 1.01 * lower + 2 * p * a
    small_rd = alpha_beta_cost("all_reduce.recursive_doubling", p, 8, a, b, g)
    small_ring = alpha_beta_cost("all_reduce.ring", p, 8, a, b, g)
    assert small_rd < small_ring / 5 and math.isclose(small_rd, 4 * a, rel_tol=1e-3)


def test_selected_cost_follows_tuning() -> None:
    name, cost = selected_cost("all_reduce", 4, 4, 1e-5, 1e-9)
    assert name == "all_reduce.recursive_doubling" and cost > 0
    assert selected_cost("all_reduce", 4, tuning.ALLREDUCE_RING_MIN_BYTES, 1e-5, 1e-9)[0] == "all_reduce.ring"
    assert selected_cost("all_gather", 6, 100, 1e-5, 1e-9)[0] == "all_gather.bruck"
    assert selected_cost("barrier", 6, 0, 1e-5, 1e-9) == ("barrier.dissemination", pytest.approx(3e-5))
