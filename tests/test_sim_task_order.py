"""Sets of tasks iterate in an order drawn from the seed (sim/loop.py SimTask); as_completed starts in list order.

A task hashed by its address: the ``done`` set of ``asyncio.wait`` (and
``asyncio.all_tasks()``) iterated in an order that depended on what the
process had allocated before, and ``asyncio.as_completed`` started coroutines
in the order of their addresses; a seed run in a sweep's worker and its replay
in a fresh process then took other paths (found by a probe: 6 of 6 seeds of an
``as_completed`` program had another digest when run alone).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import aiodist
import sim


async def _job(i: int, started: list[int]) -> int:
    started.append(i)
    await asyncio.sleep(0.01)  # (all end at one instant: one ``done`` set holds them all)
    return i


async def _collectives_in_a_sets_order(*, sort: bool) -> Any:
    await aiodist.init_process_group()
    started: list[int] = []
    done, _ = await asyncio.wait([asyncio.ensure_future(_job(i, started)) for i in range(8)])
    order = [t.result() for t in done]
    for i in sorted(order) if sort else order:  # the bug: each rank's set order decides its calls
        await aiodist.all_reduce(np.ones(i + 1))
    task = asyncio.ensure_future(asyncio.sleep(0))
    name = (task.get_name(), repr(task).split()[0])  # (a default name counts in the run; asyncio's class name)
    await aiodist.destroy_process_group()
    return order, name


def _shuffle_the_heap(n: int) -> list[Any]:
    """Objects of many sizes kept alive: the next run's tasks land at other addresses."""
    return [bytearray(17 * (i % 13) + 1) for i in range(n)] + [object() for _ in range(n)]


def test_a_seeds_run_does_not_depend_on_the_addresses_of_its_tasks() -> None:
    keep = []
    for seed in (3, 4):
        runs = []
        for n in (0, 1013, 5077, 20011):
            keep.append(_shuffle_the_heap(n))
            res = sim.run(lambda: _collectives_in_a_sets_order(sort=False), world_size=2, seed=seed)
            runs.append((res.ok, res.digest, res.rank_results))
        assert all(r == runs[0] for r in runs), runs


def test_a_program_that_follows_a_sets_order_is_caught_on_some_seed_and_its_sorted_twin_never() -> None:
    outcomes = [sim.run(lambda: _collectives_in_a_sets_order(sort=False), world_size=2, seed=s) for s in range(20)]
    failed = [r for r in outcomes if not r.ok]
    assert failed and "CollectiveMismatchError" in failed[0].summary()
    for s in range(20):
        res = sim.run(lambda: _collectives_in_a_sets_order(sort=True), world_size=2, seed=s)
        assert res.ok, res.summary()
        (order0, name), (order1, _) = res.rank_results
        assert sorted(order0) == sorted(order1) == list(range(8))
        assert name[0].startswith("Task-") and name[1] == "<Task"


async def _as_completed_starts() -> list[int]:
    started: list[int] = []
    for f in asyncio.as_completed([_job(i, started) for i in range(8)]):
        await f
    return started


def test_as_completed_starts_the_coroutines_in_the_order_given() -> None:
    keep = []
    for n in (0, 1013, 5077):
        keep.append(_shuffle_the_heap(n))
        res = sim.run(_as_completed_starts, world_size=2, seed=1)
        assert res.ok and res.rank_results == [list(range(8))] * 2, res.rank_results


async def _eager_wait() -> Any:
    loop = asyncio.get_running_loop()
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined, unused-ignore]
    started: list[int] = []
    done, _ = await asyncio.wait([asyncio.ensure_future(_job(i, started)) for i in range(8)])
    given = loop.get_task_factory() is asyncio.eager_task_factory  # type: ignore[attr-defined, unused-ignore]
    return [t.result() for t in done], started, given


@pytest.mark.skipif(not hasattr(asyncio, "eager_task_factory"), reason="asyncio.eager_task_factory: Python 3.12+")
def test_tasks_of_the_eager_task_factory_are_hashed_from_the_seed_too() -> None:
    # review24 probe: the stdlib's eager factory made plain tasks, hashed by address (4 runs, 2 digests).
    keep = []
    runs = []
    for n in (0, 1013, 5077):
        keep.append(_shuffle_the_heap(n))
        res = sim.run(_eager_wait, world_size=2, seed=3)
        assert res.ok, res.summary()
        runs.append((res.digest, res.rank_results))
    assert all(r == runs[0] for r in runs), runs
    for order, started, given in runs[0][1]:
        assert sorted(order) == list(range(8)) and started == list(range(8)) and given
