"""Pause (SIGSTOP): nothing of the rank runs, its timers fire late, peers miss its heartbeats, nothing is lost."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import numpy as np

import aiodist
import sim
from aiodist.context import current_network, getenv
from aiodist.errors import PeerFailureError
from aiodist.net.base import Connection
from sim.loop import LANE, SimLoop

PORT = 7300


def rank() -> int:
    return int(getenv("RANK") or 0)


def test_a_paused_rank_runs_nothing_and_its_timers_fire_late() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        ticks = []
        for _ in range(6):
            await asyncio.sleep(0.1)
            ticks.append(round(loop.time(), 6))
        return ticks

    res = sim.run(main, world_size=2, faults=[sim.Pause(1, at=0.25, duration=0.5)], explore=False)
    assert res.ok, res.summary()
    assert res.rank_results[0] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    # rank 1's 0.3 s timer is due while it is stopped: it fires when it resumes, at 0.75
    assert res.rank_results[1] == [0.1, 0.2, 0.75, 0.85, 0.95, 1.05]
    assert any(e.kind == "fault" and e.detail == "pause 0.5s" for e in res.trace)


def test_frames_sent_to_a_paused_rank_wait_in_order_and_its_connections_stay_up() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if rank() == 0:
            got: list[tuple[int, float]] = []
            done = asyncio.Event()

            async def handler(conn: Connection) -> None:
                for _ in range(20):
                    f = await conn.recv()
                    got.append((f.header["i"], round(loop.time(), 3)))
                done.set()

            listener = await current_network().listen(("", PORT), handler)
            await done.wait()
            await listener.aclose()
            return got
        await asyncio.sleep(0.01)
        conn = await current_network().connect(("rank0", PORT))
        for i in range(20):
            await conn.send({"i": i})
            await asyncio.sleep(0.01)
        await asyncio.sleep(1)
        conn.close()
        return None

    res = sim.run(main, world_size=2, network=sim.Network.fixed(1e-4),
                  faults=[sim.Pause(0, at=0.05, duration=0.3)], explore=False)
    assert res.ok, res.summary()
    got = res.rank_results[0]
    assert [i for i, _ in got] == list(range(20))
    during = [t for i, t in got if 0.05 < 0.01 + 0.01 * i + 0.0002 < 0.35]
    assert during and all(t == 0.35 for t in during)  # read when it resumed, all at once, in order


def test_a_pause_shorter_than_the_failure_detector_is_tolerated_a_longer_one_is_not() -> None:
    async def main() -> Any:
        await aiodist.init_process_group(timeout=60)
        x = np.ones(4)
        try:
            for _ in range(40):
                await aiodist.all_reduce(x)
                await asyncio.sleep(0.1)
        except PeerFailureError as e:
            return ("failed", e.global_rank, "heard nothing" in (e.how or ""))
        finally:
            await aiodist.destroy_process_group()
        return "ok"

    short = sim.run(main, world_size=3, faults=[sim.Pause(2, at=1.0, duration=2.0)], explore=False)
    assert short.ok and short.rank_results == ["ok"] * 3, short.summary()  # 2 s < 3 s of silence allowed
    long = sim.run(main, world_size=3, faults=[sim.Pause(2, at=1.0, duration=5.0)], explore=False,
                   stop_on_error=False)
    assert long.rank_results[0] == ("failed", 2, True) and long.rank_results[1] == ("failed", 2, True)


def test_a_pause_on_a_receive_reads_that_frame_first_when_the_rank_resumes() -> None:
    """Frames due at the very instant the pause starts come after the frame that started it."""

    async def main() -> Any:
        if rank() == 0:
            got: list[int] = []

            async def handler(conn: Connection) -> None:
                while len(got) < 6:
                    got.append((await conn.recv()).header["i"])

            listener = await current_network().listen(("", PORT), handler)
            while len(got) < 6:
                await asyncio.sleep(0.01)
            await listener.aclose()
            return got
        await asyncio.sleep(0.01)
        conn = await current_network().connect(("rank0", PORT))
        for i in range(6):
            conn.send_nowait({"i": i})  # all at one instant, all due at one instant (constant latency)
        await conn.drained()
        await asyncio.sleep(1)
        conn.close()
        return None

    for n in (1, 3, 6):  # rank 0's n-th frame (frame 0 of rank 1 is its first)
        res = sim.run(main, world_size=2, network=sim.Network.fixed(1e-3),
                      faults=[sim.Pause(0, on=sim.MessageReceived(0, n), duration=0.2)], explore=False)
        assert res.ok, res.summary()
        assert res.rank_results[0] == list(range(6)), (n, res.rank_results[0])


def test_the_loop_holds_a_paused_lanes_callbacks_in_order_and_runs_them_on_resume() -> None:
    for schedule in ("fifo", "random", "pct"):
        loop = SimLoop(seed=3, schedule=schedule)
        order: list[tuple[int, int, float]] = []

        def note(lane: int, k: int) -> None:
            order.append((lane, k, round(loop.time(), 6)))

        for lane in (1, 2):
            ctx = contextvars.copy_context()
            ctx.run(LANE.set, lane)
            for k in range(5):
                loop.schedule(0.1 * k, lane, note, (lane, k), ctx)
        loop.schedule(0.05, -1, loop.pause_lane, (1, 0.3), contextvars.Context())
        loop.run_until_idle_or_stopped()
        assert [k for lane, k, _ in order if lane == 1] == [0, 1, 2, 3, 4]  # FIFO within the lane, always
        assert [t for lane, _, t in order if lane == 1] == [0.0, 0.3, 0.3, 0.3, 0.4]  # held, then run late
        assert [t for lane, _, t in order if lane == 2] == [0.0, 0.1, 0.2, 0.3, 0.4]  # lane 2 never stopped
        assert loop.time() == 0.4


def test_crashing_a_paused_rank_drops_what_it_held() -> None:
    async def main() -> Any:
        await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        return "woke"

    res = sim.run(main, world_size=2, faults=[sim.Pause(1, at=0.05, duration=2.0), sim.Crash(1, at=0.5)],
                  explore=False)
    assert res.ok and res.crashed == [1] and res.rank_results == ["woke", None]
