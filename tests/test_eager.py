"""Eager start of operations (aiodist.eager): first step at call time, in the operation's own task."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import numpy as np
import pytest
from conftest import run_world

from aiodist.eager import start_eager
from aiodist.errors import CollectiveTimeoutError

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="caller")


async def test_a_coroutine_that_never_waits_is_finished_when_start_returns() -> None:
    steps: list[str] = []

    async def quick() -> int:
        steps.append("ran")
        return 7

    task, early = start_eager(quick(), asyncio.get_running_loop())
    assert steps == ["ran"] and early.finished and early.value == 7 and early.error is None
    assert await task == 7  # the task finishes the same way


async def test_the_first_step_runs_as_the_new_task_in_its_own_context() -> None:
    me = asyncio.current_task()
    seen: dict[str, Any] = {}
    gate = asyncio.get_running_loop().create_future()

    async def op() -> str:
        seen["task"] = asyncio.current_task()
        VAR.set("op")
        await gate
        seen["after"] = asyncio.current_task()
        return VAR.get()

    task, early = start_eager(op(), asyncio.get_running_loop())
    assert not early.finished
    assert seen["task"] is task  # not the caller: code that cancels "itself" cancels the operation
    assert asyncio.current_task() is me and VAR.get() == "caller"  # restored, nothing leaked
    gate.set_result(None)
    assert await task == "op"
    assert seen["after"] is task


async def test_an_error_in_the_first_step_is_the_task_error() -> None:
    async def bad() -> None:
        raise ValueError("boom")

    task, early = start_eager(bad(), asyncio.get_running_loop())
    assert isinstance(early.error, ValueError)
    with pytest.raises(ValueError, match="boom"):
        await task


async def test_a_future_done_before_the_tasks_first_turn_is_taken_in_that_turn() -> None:
    """A reply that came in before the task's first turn: the task carries on at once (the task's
    own wakeup would cost one more loop iteration), with the future's result, in its context."""
    loop = asyncio.get_running_loop()
    reply = loop.create_future()
    steps: list[Any] = []

    async def op() -> None:
        VAR.set("op")
        steps.append(await reply)
        steps.append((asyncio.current_task() is task, VAR.get()))

    task, early = start_eager(op(), loop)
    assert not early.finished and steps == []
    reply.set_result("pong")
    await asyncio.sleep(0)  # one iteration: the task's first turn (scheduled before our wakeup)
    assert steps == ["pong", (True, "op")]
    await task


async def test_an_error_done_before_the_tasks_first_turn_is_raised_in_that_turn() -> None:
    loop = asyncio.get_running_loop()
    reply = loop.create_future()
    seen: list[BaseException] = []

    async def op() -> None:
        try:
            await reply
        except ValueError as e:
            seen.append(e)
            raise

    task, _ = start_eager(op(), loop)
    reply.set_exception(ValueError("peer said no"))
    await asyncio.sleep(0)
    assert len(seen) == 1 and task.done()
    with pytest.raises(ValueError, match="peer said no"):
        await task


async def test_cancelling_before_the_task_ran_reaches_the_suspension_point() -> None:
    cleaned: list[str] = []
    never = asyncio.get_running_loop().create_future()

    async def op() -> None:
        try:
            await never
        except asyncio.CancelledError:
            cleaned.append("withdrawn")
            raise

    task, _ = start_eager(op(), asyncio.get_running_loop())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["withdrawn"]


async def test_cancelling_while_the_task_waits_on_its_first_step_reaches_the_coroutine() -> None:
    loop = asyncio.get_running_loop()
    first = loop.create_future()
    cleaned: list[str] = []

    async def op() -> None:
        try:
            await first
        except asyncio.CancelledError:
            cleaned.append("withdrawn")
            raise

    task, _ = start_eager(op(), loop)
    await asyncio.sleep(0)  # the task's first turn: it waits on what the first step awaited
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["withdrawn"]


async def test_every_later_step_gets_what_it_awaited() -> None:
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(3)]

    async def op() -> list[int]:
        got = [await f for f in futs[:2]]
        try:
            await futs[2]
        except KeyError as e:
            got.append(int(str(e)))
        return got

    task, early = start_eager(op(), loop)
    assert not early.finished
    for i, f in enumerate(futs[:2]):
        await asyncio.sleep(0)
        f.set_result(i)
    await asyncio.sleep(0)
    futs[2].set_exception(KeyError(7))
    assert await task == [0, 1, 7]


async def test_closing_a_task_that_never_ran_runs_the_coroutines_cleanup() -> None:
    # (what the simulator does to the tasks of a world it drops)
    loop = asyncio.get_running_loop()
    never = loop.create_future()
    cleaned: list[str] = []

    async def op() -> None:
        try:
            await never
        finally:
            cleaned.append("closed")

    task, _ = start_eager(op(), loop)
    coro = task.get_coro()
    assert coro is not None
    coro.close()
    assert cleaned == ["closed"]
    task.cancel()


async def test_a_task_the_first_step_creates_is_an_ordinary_one() -> None:
    # (3.12's eager start goes through the loop's task factory: it used to stay set while the first
    # step ran, so a task created there started eagerly too -- a dial task that ran before its
    # creator had recorded it, and a report that was never sent)
    loop = asyncio.get_running_loop()
    order: list[str] = []

    async def inner() -> None:
        order.append("inner")

    async def op() -> None:
        t = loop.create_task(inner())
        order.append("created")
        await t

    task, _ = start_eager(op(), loop)
    assert order == ["created"]
    await task
    assert order == ["created", "inner"]


async def test_a_broadcast_root_is_done_when_the_call_returns() -> None:
    async def body(pg: Any) -> bool:
        x = np.arange(4, dtype=np.float32) if pg.rank == 0 else np.zeros(4, dtype=np.float32)
        await pg.barrier()  # connected
        w = pg.broadcast(x, 0)
        done_at_call = w.done()
        await w
        assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
        return done_at_call

    root_done, _ = await run_world(2, body)  # (the other rank is done at its call only if the data was there)
    assert root_done is True


async def test_an_operation_timeout_cancels_the_operation_not_its_caller() -> None:
    async def body(pg: Any) -> str:
        if pg.rank == 1:
            await asyncio.sleep(0.6)  # never joins this all_reduce
            return "late"
        w = pg.all_reduce(np.ones(2), timeout=0.2)
        await asyncio.sleep(0.4)  # the operation times out meanwhile: this sleep must not be cut short
        with pytest.raises(CollectiveTimeoutError):
            await w
        return "ok"

    assert (await run_world(2, body, timeout=10, return_exceptions=True))[0] == "ok"
