"""A group's collectives share one monitor timer; their outcomes travel in their records (aiodist.work).

In the simulator, so that deadlines can be checked to the microsecond.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import numpy as np
import pytest

import aiodist.api as dist
import sim
from aiodist.errors import CollectiveTimeoutError, GroupError


async def _staggered_timeouts() -> Any:
    """Rank 1 never joins: rank 0's collectives each time out at their own deadline, whatever their order."""
    pg = await dist.init_process_group(timeout=30)
    loop = asyncio.get_running_loop()
    if pg.rank == 1:
        await asyncio.sleep(40)
        await dist.destroy_process_group()
        return None
    start = loop.time()
    ended: dict[str, float] = {}

    async def one(name: str, timeout: float | None, delay: float) -> None:
        await asyncio.sleep(delay)
        w = pg.all_reduce(np.ones(2), timeout=timeout) if timeout is not None else pg.all_reduce(np.ones(2))
        with pytest.raises(CollectiveTimeoutError):
            await w
        ended[name] = round(loop.time() - start - delay, 6)

    # a long one first (the timer is armed for it), then shorter ones that must re-arm it earlier
    await asyncio.gather(one("default", None, 0), one("five", 5, 1), one("two", 2, 2), one("half", 0.5, 2.2))
    await dist.destroy_process_group()
    return ended


def test_each_collective_times_out_at_its_own_deadline() -> None:
    res = sim.run(_staggered_timeouts, world_size=2, seed=0, explore=False)  # (exact sleeps: a slow rank's are longer)
    res.raise_on_failure()
    assert res.rank_results[0] == {"default": 30.0, "five": 5.0, "two": 2.0, "half": 0.5}


async def _monitor_goes_quiet() -> Any:
    """After many quick collectives, at most one monitor timer is pending, and none once it fired."""
    pg = await dist.init_process_group(timeout=30)
    loop = asyncio.get_running_loop()
    for _ in range(50):
        await pg.all_reduce(np.ones(2))
    armed = pg._runner.monitor is not None  # (one timer for all 50, not 50)
    await asyncio.sleep(31)
    quiet = pg._runner.monitor is None and not pg._runner.running
    t = loop.time()
    await pg.barrier()
    await dist.destroy_process_group()
    return armed, quiet, loop.time() - t < 1


def test_one_timer_watches_every_collective_and_stops_when_none_runs() -> None:
    res = sim.run(_monitor_goes_quiet, world_size=3, seed=1)
    res.raise_on_failure()
    assert res.rank_results == [(True, True, True)] * 3


async def _unawaited_failure() -> Any:
    pg = await dist.init_process_group(timeout=30)
    if pg.rank == 1:
        await asyncio.sleep(3)
        await dist.destroy_process_group()
        return None
    w = pg.all_reduce(np.ones(2), timeout=1)
    await asyncio.sleep(2)
    assert w.done() and not w.is_success()
    assert isinstance(w.exception(), CollectiveTimeoutError)
    gc.collect()  # its task is gone: nothing may log "exception was never retrieved"
    with pytest.raises(CollectiveTimeoutError):
        await w
    with pytest.raises(CollectiveTimeoutError):
        w.result()
    pending = pg.all_reduce(np.ones(2), timeout=5)
    with pytest.raises(asyncio.InvalidStateError):
        pending.result()
    await dist.destroy_process_group()
    with pytest.raises(GroupError, match="destroyed"):
        await pending
    return "ok"


def test_a_failed_collective_nobody_awaited_keeps_its_error_for_later(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        res = sim.run(_unawaited_failure, world_size=2, seed=2)
        gc.collect()
    res.raise_on_failure()
    assert res.rank_results[0] == "ok"
    assert "never retrieved" not in caplog.text
