"""The virtual-time loop: clock jumps, timeouts, FIFO ties, schedules, refusals."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from sim.errors import SimDeadlockError, SimLivelockError, SimTimeLimitError, SimUnsupportedError
from sim.loop import LANE, SimLoop, run


def test_hour_long_sleep_is_instant_and_exact() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        return loop.time()

    loop = SimLoop()
    assert loop.run_until_complete(main()) == 3600.0
    assert loop.steps < 10  # nothing busy-waited through the hour


def test_timeouts_fire_at_the_right_virtual_time() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.sleep(100)
        seen.append(loop.time())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 2.5)
        seen.append(loop.time())
        return seen

    assert run(main()) == [5.0, 7.5]


def test_same_instant_callbacks_keep_fifo_order() -> None:
    # asyncio's heap does not promise FIFO for equal times; ours does.
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        order: list[int] = []
        for i in range(200):
            loop.call_at(1.0, order.append, i)
        loop.call_later(1.0, order.append, 200)
        await asyncio.sleep(2)
        return order

    assert run(main()) == list(range(201))


def _lane_ctx(lane: int) -> contextvars.Context:
    ctx = contextvars.copy_context()
    ctx.run(LANE.set, lane)
    return ctx


def _interleaving(schedule: str, seed: int) -> list[tuple[int, int]]:
    loop = SimLoop(schedule=schedule, seed=seed)
    order: list[tuple[int, int]] = []

    async def worker(i: int) -> None:
        for k in range(4):
            order.append((i, k))
            await asyncio.sleep(0)

    async def main() -> None:
        tasks = [loop.create_task(worker(i), context=_lane_ctx(i)) for i in range(4)]
        await asyncio.gather(*tasks)

    loop.run_until_complete(main())
    return order


def test_fifo_schedule_is_round_robin_and_random_explores() -> None:
    fifo = _interleaving("fifo", 0)
    assert fifo[:4] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    randoms = {tuple(_interleaving("random", s)) for s in range(20)}
    assert len(randoms) > 5
    pcts = {tuple(_interleaving("pct", s)) for s in range(20)}
    assert len(pcts) > 2
    for order in randoms | pcts:  # within a lane, order is always program order
        for i in range(4):
            assert [k for j, k in order if j == i] == [0, 1, 2, 3]
    assert _interleaving("random", 7) == _interleaving("random", 7)


def test_killed_lane_never_runs_again() -> None:
    loop = SimLoop()
    ran: list[str] = []

    async def victim() -> None:
        try:
            await asyncio.sleep(1)
            ran.append("victim woke")
        finally:
            ran.append("victim finally")

    async def main() -> None:
        loop.create_task(victim(), context=_lane_ctx(5))
        await asyncio.sleep(0.5)
        loop.kill_lane(5)
        await asyncio.sleep(2)

    loop.run_until_complete(main())
    assert ran == []
    loop.discard()  # closing the zombie runs its finally, outside the simulation
    assert ran == ["victim finally"]


def test_deadlock_and_time_limit() -> None:
    with pytest.raises(SimDeadlockError):
        run(asyncio.Event().wait())

    async def forever() -> None:
        while True:
            await asyncio.sleep(1)

    with pytest.raises(SimTimeLimitError):
        run(forever(), time_limit=100)


@pytest.mark.parametrize("schedule", ["fifo", "random"])
def test_a_spin_at_one_instant_is_reported_as_livelock(schedule: str) -> None:
    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    loop = SimLoop(schedule=schedule, max_steps_per_instant=10_000)
    with pytest.raises(SimLivelockError):
        loop.run_until_complete(spin())


@pytest.mark.parametrize(
    "call",
    [
        lambda loop: loop.getaddrinfo("localhost", 80),
        lambda loop: loop.add_reader(0, print),
        lambda loop: loop.add_signal_handler(2, print),
        lambda loop: loop.subprocess_exec(asyncio.SubprocessProtocol, "true"),
        lambda loop: loop.create_connection(asyncio.Protocol, "127.0.0.1", 1),
    ],
)
def test_real_io_threads_and_processes_fail_loudly(call) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        with pytest.raises(SimUnsupportedError) as info:
            r = call(asyncio.get_running_loop())
            if asyncio.iscoroutine(r):
                r.close()
        assert "not available inside the simulator" in str(info.value)

    run(main())


def test_to_thread_runs_the_function_inline() -> None:
    async def main() -> int:
        return await asyncio.to_thread(pow, 2, 10)

    assert run(main()) == 1024


def test_cancelled_timers_do_not_pile_up() -> None:
    async def main() -> int:
        for _ in range(5000):
            async with asyncio.timeout(300):
                await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        return loop.pending_timers()  # type: ignore[attr-defined]  # near and far timers

    assert run(main()) < 1000


def test_ended_tasks_are_not_kept_per_lane() -> None:
    # The loop files every task under its lane (strong references: no weak reference per task);
    # ended ones are dropped as the list grows, so a lane that runs many short tasks keeps few.
    loop = SimLoop()

    async def short() -> None:
        await asyncio.sleep(0)

    async def main() -> int:
        for _ in range(5000):
            await loop.create_task(short(), context=_lane_ctx(3))
        return len(loop.lane_tasks(3))

    kept = loop.run_until_complete(main())
    assert kept <= 64
    loop.retire_lane(3)
    assert loop.lane_tasks(3) == []
    loop.discard()
