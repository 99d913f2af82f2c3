"""The per-delivery fast paths of the simulator: frame handlers called in the delivery step,
the only due callback run without queueing, header copies with unusual keys.

These guard what the optimizations must keep: frame order, the loop-step
budget per delivery, MessageReceived semantics and determinism.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import pytest

import sim
from aiodist.context import current_network, getenv
from aiodist.net.base import Connection
from sim.headers import wire_header
from sim.loop import LANE, SimLoop

PORT = 7200
FRAMES = 50


def rank() -> int:
    return int(getenv("RANK") or 0)


def handler_sink(frames: int = FRAMES, swap_at: int | None = None) -> Any:
    """Rank 0 collects frames with a frame handler (optionally swapping handlers), rank 1 sends them."""

    async def main() -> Any:
        net = current_network()
        if rank() == 0:
            got: list[Any] = []
            done = asyncio.Event()

            async def on_conn(conn: Connection) -> None:
                def second(f: Any) -> None:
                    got.append(("b", f.header["i"]))
                    if f.header["i"] == frames - 1:
                        done.set()

                def first(f: Any) -> None:
                    got.append(("a", f.header["i"]))
                    if f.header["i"] == swap_at:
                        conn.set_frame_handler(second)  # type: ignore[attr-defined]
                    if f.header["i"] == frames - 1:
                        done.set()

                conn.set_frame_handler(first)  # type: ignore[attr-defined]
                await done.wait()

            listener = await net.listen(("", PORT), on_conn)
            await done.wait()
            await listener.aclose()
            return got
        await asyncio.sleep(0.01)
        conn = await net.connect(("rank0", PORT))
        for i in range(frames):
            await conn.send({"i": i})
            await asyncio.sleep(0.001)  # every frame arrives at its own instant
        await asyncio.sleep(0.1)
        conn.close()
        return None

    return main


def test_a_frame_handler_runs_in_the_delivery_step() -> None:
    """One loop step per frame delivered to a handler (it used to take a second, scheduled step)."""
    res = sim.run(handler_sink(), world_size=2, seed=1, trace=False, schedule="fifo", explore=False)  # (counts steps)
    assert res.ok, res.summary()
    assert [i for _, i in res.rank_results[0]] == list(range(FRAMES))
    # Per frame: the sender's sleep (timer, then task wake-up) and the delivery; plus setup and teardown.
    assert res.steps <= 3 * FRAMES + 30, res.steps


def test_a_handler_that_swaps_handlers_keeps_the_frame_order() -> None:
    res = sim.run(handler_sink(swap_at=9), world_size=2, seed=3)
    assert res.ok, res.summary()
    assert res.rank_results[0] == [("a", i) for i in range(10)] + [("b", i) for i in range(10, FRAMES)]


def test_a_crash_on_the_nth_received_message_leaves_that_frame_unhandled() -> None:
    """MessageReceived fires before the program sees the frame, with or without a frame handler."""
    seen: list[int] = []

    async def main() -> Any:
        net = current_network()
        if rank() == 0:
            async def on_conn(conn: Connection) -> None:
                conn.set_frame_handler(lambda f: seen.append(f.header["i"]))  # type: ignore[attr-defined]
                await asyncio.sleep(10)

            await net.listen(("", PORT), on_conn)
            await asyncio.sleep(10)
            return None
        await asyncio.sleep(0.01)
        conn = await net.connect(("rank0", PORT))
        for i in range(6):
            await conn.send({"i": i})
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.1)
        return "sent"

    res = sim.run(main, world_size=2, seed=0, faults=[sim.Crash(0, on=sim.MessageReceived(0, 3))])
    assert res.crashed == [0]
    assert seen == [0, 1]


def test_same_seed_same_run_with_handlers_under_every_schedule() -> None:
    for schedule in ("fifo", "random", "pct"):
        a = sim.run(handler_sink(swap_at=20), world_size=2, seed=5, schedule=schedule)
        b = sim.run(handler_sink(swap_at=20), world_size=2, seed=5, schedule=schedule)
        assert a.ok and b.ok
        assert (a.digest, a.virtual_time, a.steps) == (b.digest, b.virtual_time, b.steps)


# --------------------------------------------------------------------------- the loop's fast path


@pytest.mark.parametrize("schedule", ["fifo", "random", "pct"])
def test_lone_due_callbacks_run_in_time_order_and_new_lanes_get_a_priority(schedule: str) -> None:
    """Timers alone at their instant skip the ready queue; their lanes still join the schedule."""

    def record(seed: int) -> list[Any]:
        loop = SimLoop(seed=seed, schedule=schedule)
        order: list[Any] = []
        import contextvars

        for lane in range(5):
            ctx = contextvars.copy_context()
            ctx.run(LANE.set, lane)
            loop.schedule(1.0 + lane * 0.1, lane, order.append, (("alone", lane),), ctx)
            for k in range(3):  # three callbacks of this lane due at the same instant later on
                loop.schedule(2.0, lane, order.append, (("together", lane, k),), ctx)
        loop.run_until_idle_or_stopped()
        assert loop.time() == 2.0
        return order

    order = record(7)
    assert order[:5] == [("alone", lane) for lane in range(5)]
    together = order[5:]
    assert sorted(together) == sorted(("together", lane, k) for lane in range(5) for k in range(3))
    for lane in range(5):  # FIFO inside a lane under every schedule
        assert [x[2] for x in together if x[1] == lane] == [0, 1, 2]
    assert record(7) == order


@pytest.mark.parametrize("schedule", ["fifo", "random"])
def test_near_and_far_timers_run_in_time_then_sequence_order(schedule: str) -> None:
    """Timers from microseconds to minutes ahead, with ties and cancellations, in one lane:
    they run in (time, creation) order whichever of the loop's two heaps holds them."""
    import random

    rng = random.Random(4)
    loop = SimLoop(seed=0, schedule=schedule)
    times = [0.0, 1e-5, 2e-4, 9.99e-4, 1e-3, 1.0005e-3, 3e-3, 0.5, 2.0, 300.0]
    order: list[int] = []
    expected: list[tuple[float, int]] = []
    handles = []
    for i in range(3000):
        when = rng.choice(times) + rng.choice([0.0, 0.0, rng.random() * 1e-3])
        handles.append(loop.call_at(when, order.append, i))
        expected.append((when, i))
    cancelled = set(rng.sample(range(3000), 1200))
    for i in sorted(cancelled):
        handles[i].cancel()  # enough to make the loop compact both heaps
    late: list[float] = []

    def chain(k: int) -> None:  # timers added while running, near and far
        late.append(loop.time())
        if k:
            loop.call_later(rng.choice([1e-4, 5e-3, 10.0]), chain, k - 1)

    loop.call_at(0.25, chain, 20)
    loop.run_until_idle_or_stopped()
    assert order == [i for _, i in sorted(e for e in expected if e[1] not in cancelled)]
    assert late == sorted(late) and len(late) == 21


def test_a_livelock_is_still_reported_with_lone_timers() -> None:
    loop = SimLoop(seed=0, schedule="fifo", max_steps_per_instant=100)

    def spin() -> None:
        loop.call_soon(spin)

    loop.call_at(1.0, spin)
    with pytest.raises(sim.SimLivelockError):
        loop.run_until_idle_or_stopped()


# --------------------------------------------------------------------------- headers


class Color(enum.IntEnum):
    RED = 1


def test_wire_header_converts_unusual_keys_on_its_slow_path() -> None:
    got = wire_header({Color.RED: (1, 2), (1, 2): "t", "s": [3]})
    assert got == {1: [1, 2], (1, 2): "t", "s": [3]}
    assert [type(k) for k in got] == [int, tuple, str]


def test_wire_header_refuses_what_msgpack_refuses() -> None:
    with pytest.raises(TypeError, match="not serializable"):
        wire_header({"x": object()})
    with pytest.raises(TypeError, match="must be a dict"):
        wire_header([("a", 1)])  # type: ignore[arg-type]
