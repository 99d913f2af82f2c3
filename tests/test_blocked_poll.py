"""Polling an operation from code that holds the event loop raises BlockedLoopError instead of spinning forever.

torch24 probe, finding 2: torch's ``while not w.is_completed(): time.sleep(0.01)``
never ended, for real or in the simulator, and nothing said why.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist
import aiodist.api as dist
import sim
from aiodist.polls import STUCK_POLLS, STUCK_SECONDS


async def _torch_style_poll(*, blocking: bool) -> Any:
    x = np.ones(3)
    w = dist.all_reduce(x, async_op=True)
    polls = 0
    try:
        while not w.is_completed():
            polls += 1
            if blocking:
                time.sleep(0.01)  # holds the loop: the operation cannot progress
            else:
                await asyncio.sleep(0.01)
    except aiodist.BlockedLoopError as e:
        assert e.op.startswith("all_reduce #0 of world") and e.polls >= STUCK_POLLS and e.seconds >= STUCK_SECONDS
        await w  # (the operation itself went on)
        return "blocked", float(x[0])
    return "done", float(x[0])


async def test_a_blocking_poll_raises_and_a_yielding_one_completes() -> None:
    async def body(pg: Any) -> Any:
        return await _torch_style_poll(blocking=pg.rank() == 0), await _torch_style_poll(blocking=False)

    results = await run_world(2, body, timeout=30)
    assert results[0] == (("blocked", 2.0), ("done", 2.0))
    assert results[1] == (("done", 2.0), ("done", 2.0))


def test_a_blocking_poll_raises_in_the_simulator() -> None:
    async def main() -> Any:
        await dist.init_process_group()
        got = await _torch_style_poll(blocking=True)
        await dist.destroy_process_group()
        return got

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results == [("blocked", 2.0)] * 2


async def test_a_few_polls_around_blocking_work_are_not_a_stuck_loop() -> None:
    async def body(pg: Any) -> Any:
        w = dist.all_reduce(np.ones(2), async_op=True)
        for _ in range(3):
            w.is_completed()
            time.sleep(0.5)  # (blocking work between polls: not a polling loop)
        return float((await w)[0])

    assert await run_world(2, body, timeout=30) == [2.0, 2.0]


def test_the_future_of_an_operation_is_watched_too() -> None:
    async def main() -> Any:
        await dist.init_process_group()
        fut = dist.all_reduce(np.ones(1), async_op=True).get_future()
        with pytest.raises(aiodist.BlockedLoopError):
            while not fut.done():
                time.sleep(0.01)
        await fut
        await dist.destroy_process_group()

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok, res.summary()


def test_polling_two_operations_in_turn_from_a_blocking_loop_raises_too() -> None:
    # review24 probe: ``while not all([w1.is_completed(), w2.is_completed()]): time.sleep(0.01)`` spun forever
    # (the watch followed only the last operation polled, so polls in turn reset it).
    async def main() -> Any:
        await dist.init_process_group()
        w1 = dist.all_reduce(np.ones(1), async_op=True)
        w2 = dist.all_reduce(np.ones(1), async_op=True)
        with pytest.raises(aiodist.BlockedLoopError):
            while not (w1.is_completed() and w2.is_completed()) and not (w2.is_completed() and w1.is_completed()):
                time.sleep(0.01)
        await w1
        await w2
        await dist.destroy_process_group()

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok, res.summary()
