"""Consumers of one store queue, one polling with short timeouts, get its items in the order they were pushed.

Before (blind probe): a ``queue_pop`` with a timeout of 0 (or ~1 ms) expired in
the client before the server's answer could come back; when the server had
popped an item for it, the client put the item back at the head later -- behind
items another consumer had taken meanwhile (465 of 2000 out of order over real
TCP with timeout 0; 370 in the simulator, where the poller never got an item).
The client now leaves the server's answer time to arrive (``_MIN_GRACE``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import aiodist.api as dist
import sim

N = 300


async def _two_consumers() -> Any:
    pg = await dist.init_process_group()
    r, st = pg.rank, pg.store
    got: list[int] = []
    if r == 0:
        for i in range(N):
            await st.queue_push("w", str(i))
        await st.set("pushed", "1")
    else:
        for _ in range(100 * N):  # (bounded)
            try:
                got.append(int(await st.queue_pop("w", timeout=(0.0, 0.001)[len(got) % 2] if r == 1 else 0.3)))
            except TimeoutError:
                if await st.check(["pushed"]) and await st.queue_len("w") == 0:
                    break
    await dist.barrier()
    return got


@pytest.mark.parametrize("seed", range(3))
def test_a_polling_consumer_takes_items_in_order_and_leaves_the_others_in_order(seed: int) -> None:
    res = sim.run(_two_consumers, world_size=3, seed=seed, trace=False)
    assert res.ok, res.summary()
    polled, blocked = res.rank_results[1], res.rank_results[2]
    assert sorted(polled + blocked) == list(range(N))
    assert polled, "the poller never got an item"
    for got in (polled, blocked):
        assert got == sorted(got), [(a, b) for a, b in zip(got, got[1:]) if b < a][:5]
