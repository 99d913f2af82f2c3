"""MemoryStore and PrefixStore specifics (the shared semantics are in test_store_conformance)."""

from __future__ import annotations

import asyncio

import pytest

from aiodist.errors import StoreTimeoutError
from aiodist.inflight import snapshot
from aiodist.store import MemoryStore, PrefixStore


async def test_popped_value_of_a_cancelled_queue_pop_goes_back_to_the_head() -> None:
    s = MemoryStore()
    task = asyncio.ensure_future(s.queue_pop("q", timeout=5))
    await asyncio.sleep(0)  # the pop is waiting
    await s.queue_push("q", b"first")  # handed to the waiting pop ...
    await s.queue_push("q", b"second")
    task.cancel()  # ... whose task is cancelled before it could return it
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await s.queue_len("q") == 2
    assert await s.queue_pop("q") == b"first"
    assert await s.queue_pop("q") == b"second"


async def test_value_arriving_with_the_timeout_is_returned_not_lost() -> None:
    s = MemoryStore()
    task = asyncio.ensure_future(s.queue_pop("q", timeout=0.05))
    await asyncio.sleep(0.05)
    await s.queue_push("q", b"x")
    try:
        got = await task
    except StoreTimeoutError:
        assert await s.queue_len("q") == 1  # timed out first: the value stayed queued
    else:
        assert got == b"x" and await s.queue_len("q") == 0


async def test_blocking_calls_are_registered_in_flight() -> None:
    s = MemoryStore()
    task = asyncio.ensure_future(s.wait(["a", "b"], timeout=5))
    await asyncio.sleep(0)
    assert [(e["op"], e["keys"]) for e in snapshot()] == [("store.wait", ["a", "b"])]
    await s.multi_set(["a", "b"], [b"", b""])
    await task
    assert snapshot() == []


async def test_prefix_stores_nest_and_share_the_underlying_store() -> None:
    base = MemoryStore()
    job = PrefixStore("job", base)
    inner = PrefixStore("step1", job)
    await inner.set("k", b"v")
    assert await base.get("job/step1/k") == b"v"
    assert await job.get("step1/k") == b"v"
    await base.set("unrelated", b"")
    assert await inner.num_keys() == 2  # delegates: counts the whole store
    with pytest.raises(StoreTimeoutError) as info:
        await inner.get("missing", timeout=0.01)
    assert info.value.keys == ["job/step1/missing"]  # the full key, as stored
    await inner.close()  # a view: the underlying store stays open
    assert await base.get("job/step1/k") == b"v"
    with pytest.raises(TypeError):
        PrefixStore(3, base)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        PrefixStore("p", object())  # type: ignore[arg-type]


async def test_many_waiters_on_one_key_all_wake() -> None:
    s = MemoryStore()
    tasks = [asyncio.ensure_future(s.get("k", timeout=5)) for _ in range(100)]
    await asyncio.sleep(0)
    assert s.state.waiter_count() == 100
    await s.set("k", b"go")
    assert await asyncio.gather(*tasks) == [b"go"] * 100
    assert s.state.waiter_count() == 0
