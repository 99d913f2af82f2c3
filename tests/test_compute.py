"""``aiodist.compute`` runs work off the event loop: a collective in flight completes while the work runs."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
from conftest import run_world

import aiodist
from aiodist.context import getenv


async def test_a_collective_in_flight_finishes_while_compute_runs() -> None:
    async def body(pg: Any) -> Any:
        reduced = threading.Event()
        x = np.full(1 << 18, float(pg.rank))
        h = aiodist.all_reduce(x)

        async def note() -> None:
            await h
            reduced.set()

        watcher = asyncio.ensure_future(note())

        def work(n: int) -> Any:
            # blocks its thread until the all_reduce is done: only possible if the loop runs meanwhile
            assert reduced.wait(10), "the all_reduce did not progress while the computation ran"
            return n * 2, getenv("RANK")

        result = await aiodist.compute(work, 21)
        await watcher
        return result, float(x[0])

    out = await run_world(2, body)
    assert out == [((42, "0"), 1.0), ((42, "1"), 1.0)]  # the rank's context reaches the thread


def test_compute_runs_in_the_simulator_too() -> None:
    import sim

    async def main() -> Any:
        await aiodist.init_process_group()
        x = np.full(4, 1.0)
        h = aiodist.all_reduce(x)
        total = await aiodist.compute(lambda a: float(np.sum(a)), np.arange(5.0))
        await h
        await aiodist.destroy_process_group()
        return total, float(x[0])

    res = sim.run(main, world_size=3, seed=1)
    res.raise_on_failure()
    assert res.rank_results == [(10.0, 3.0)] * 3
