"""aiodist.deadline.Deadline: asyncio.timeout that lets a step already due go first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from aiodist.deadline import Deadline

from conftest import run_on

LOOPS = ["asyncio", "uvloop"]


async def _completed_with_its_deadline(timeout: Callable[[float], Any]) -> str:
    """What a block awaiting a future returns when the future completes just before the deadline, both while the
    loop was not running (a blocked process): in the iteration after, the completion runs first, then the timer."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[str] = loop.create_future()

    async def op() -> str:
        async with timeout(0.05):
            return await fut

    task = asyncio.ensure_future(op())
    await asyncio.sleep(0)  # armed
    loop.call_at(loop.time() + 0.04, fut.set_result, "done")
    time.sleep(0.1)  # both come due while the loop does not run
    try:
        return await task
    except TimeoutError:
        return "timed out"


@pytest.mark.parametrize("loop_name", LOOPS)
def test_asyncio_timeout_loses_a_result_that_came_with_its_deadline(loop_name: str) -> None:
    # (the race this module is for: asyncio's own timeout cancels the step that had its result)
    assert run_on(loop_name, lambda: _completed_with_its_deadline(asyncio.timeout)) == "timed out"


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_result_that_came_with_the_deadline_is_kept(loop_name: str) -> None:
    assert run_on(loop_name, lambda: _completed_with_its_deadline(Deadline)) == "done"


@pytest.mark.parametrize("loop_name", LOOPS)
def test_it_times_out_like_asyncio_timeout(loop_name: str) -> None:
    async def main() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            async with Deadline(0.02) as d:
                await asyncio.sleep(10)
        return d.expired(), loop.time() - t0

    expired, took = run_on(loop_name, main)
    assert expired and 0.015 <= took < 1.0  # (uvloop keeps time in milliseconds: a timer may fire a hair early)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_step_that_goes_on_waiting_after_the_deadline_times_out(loop_name: str) -> None:
    """Let go first once, the task awaits something else: the deadline then expires (no waiting for ever)."""
    async def main() -> str:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        async def op() -> str:
            async with Deadline(0.05):
                await fut
                await asyncio.sleep(10)  # the step it was let take goes on waiting
            return "finished"

        task = asyncio.ensure_future(op())
        await asyncio.sleep(0)
        loop.call_at(loop.time() + 0.04, fut.set_result, None)
        time.sleep(0.1)
        try:
            return await asyncio.wait_for(task, 5)
        except TimeoutError:
            return "timed out"

    assert run_on(loop_name, main) == "timed out"


@pytest.mark.parametrize("loop_name", LOOPS)
def test_cancellation_from_elsewhere_passes_through(loop_name: str) -> None:
    async def main() -> tuple[bool, bool]:
        d = Deadline(10)

        async def op() -> None:
            async with d:
                await asyncio.sleep(10)

        task = asyncio.ensure_future(op())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled(), d.expired()

    assert run_on(loop_name, main) == (True, False)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_no_deadline_and_an_early_finish_leave_nothing_armed(loop_name: str) -> None:
    async def main() -> tuple[str, str]:
        async with Deadline(None) as none:
            await asyncio.sleep(0)
        async with Deadline(5) as early:
            await asyncio.sleep(0)
        return repr(none), repr(early)

    none, early = run_on(loop_name, main)
    assert "idle" in none and "idle" in early


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_block_that_swallows_the_cancellation_leaves_the_task_uncancelled(loop_name: str) -> None:
    """As with asyncio.timeout: the deadline's cancellation request is taken back when the block ends."""
    async def main() -> tuple[bool, int]:
        async with Deadline(0.01) as d:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass  # (the block carries on: no TimeoutError, and the task is not left cancelling)
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)
        return d.expired(), task.cancelling()

    assert run_on(loop_name, main) == (True, 0)
