"""Timing exploration: drawn per seed, replayed exactly from its plan, benign for the failure detector."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import numpy as np
import pytest

import aiodist
import sim
from aiodist.context import getenv
from sim.loop import SimLoop


async def allreduce_loop() -> Any:
    pg = await aiodist.init_process_group(timeout=60)
    x = np.ones(64, dtype=np.float32)
    for _ in range(30):
        await aiodist.all_reduce(x)
        x[:] = 1
        await asyncio.sleep(0.01)
    await pg.store.add("done", 1)
    await aiodist.destroy_process_group()
    return float(x[0])


async def store_traffic() -> Any:
    pg = await aiodist.init_process_group(timeout=60)
    for i in range(20):
        await pg.store.add(f"c{i % 3}", pg.rank)
        await asyncio.sleep(0.005 * (pg.rank + 1))
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return pg.rank


def test_a_seed_draws_the_same_plan_and_run_every_time_and_seeds_differ() -> None:
    runs = [sim.run(allreduce_loop, world_size=4, seed=s, trace=False) for s in (3, 3, 4)]
    assert runs[0].digest == runs[1].digest and runs[0].explored == runs[1].explored
    assert runs[0].timing == runs[1].timing
    assert runs[0].digest != runs[2].digest
    assert all(r.ok for r in runs), [r.summary() for r in runs if not r.ok]


@pytest.mark.parametrize("program", [allreduce_loop, store_traffic])
def test_the_plan_spelled_out_replays_the_same_run(program: Any) -> None:
    replayed = 0
    for seed in range(12):
        res = sim.run(program, world_size=4, seed=seed, trace=False)
        again = sim.run(program, world_size=4, seed=seed, trace=False, **sim.replay_plan(res))
        assert again.digest == res.digest, (seed, res.timing, res.explored)
        assert again.timing is None and again.explored == []
        replayed += bool(res.explored)
    assert replayed >= 6  # most seeds did perturb something


def test_explore_false_is_fixed_timing_and_an_empty_exploration_changes_nothing() -> None:
    fixed = sim.run(store_traffic, world_size=3, seed=5, explore=False, trace=False)
    assert fixed.timing is None and fixed.explored == []
    nothing = sim.Exploration(band=0, slow_links=0, tail=0, pauses=0, clogs=0, stragglers=0, slow_rank=0)
    assert sim.run(store_traffic, world_size=3, seed=5, explore=nothing, trace=False).digest == fixed.digest
    assert sim.run(store_traffic, world_size=3, seed=5, trace=False).digest != fixed.digest


def test_perturbations_stay_within_the_failure_detectors_budget_as_configured() -> None:
    """Heartbeats every 0.05 s, 4 misses: 0.15 s of silence at most; a pause gets 40% of it."""
    env = {"AIODIST_HEARTBEAT_INTERVAL": "0.05", "AIODIST_HEARTBEAT_MISSES": "4"}
    budget = 3 * 0.05
    seen = 0
    for seed in range(25):
        res = sim.run(allreduce_loop, world_size=4, seed=seed, env=env, trace=False)
        assert res.ok, res.summary()  # a correct program that does not handle failures passes every seed
        for f in res.explored:
            seen += 1
            if isinstance(f, sim.Straggler) and f.duration is None:  # (the slow rank: slower for the whole run)
                assert 1.1 <= f.factor <= 1.5, f
                continue
            assert f.duration <= (0.3 if isinstance(f, sim.Clog) else 0.4) * budget + 1e-9, f
        if res.timing is not None and res.timing.tail is not None:
            assert res.timing.tail.high <= 0.2 * budget + 1e-9
    assert seen >= 20


def test_a_program_tightening_its_detector_at_init_bounds_the_perturbations_after_it() -> None:
    async def tight() -> Any:
        pg = await aiodist.init_process_group(timeout=60, heartbeat_interval=0.05, heartbeat_misses=4)
        x = np.ones(8)
        for _ in range(40):
            await aiodist.all_reduce(x)
            await asyncio.sleep(0.02)
        await aiodist.destroy_process_group()
        return pg.rank

    for seed in range(20):
        res = sim.run(tight, world_size=3, seed=seed, trace=False)
        assert res.ok, res.summary()


def test_a_daemon_event_runs_only_while_something_else_keeps_the_run_going() -> None:
    ran: list[str] = []
    ctx = contextvars.Context()
    loop = SimLoop()
    loop.schedule(5.0, -1, ran.append, ("daemon",), ctx, daemon=True)
    loop.schedule(1.0, -1, ran.append, ("event",), ctx)
    assert loop.run_until_idle_or_stopped() is False  # idle at t=1: the daemon does not keep it alive
    assert ran == ["event"] and loop.time() == 1.0
    loop = SimLoop()
    loop.schedule(5.0, -1, ran.append, ("daemon",), ctx, daemon=True)
    loop.schedule(10.0, -1, ran.append, ("later",), ctx)
    loop.run_until_idle_or_stopped()
    assert ran == ["event", "daemon", "later"]


def test_a_deadlock_is_found_as_early_with_exploration_as_without() -> None:
    async def stuck() -> None:
        if int(getenv("RANK") or 0) == 0:
            await asyncio.get_running_loop().create_future()  # waits forever, no timer

    for seed in range(5):
        res = sim.run(stuck, world_size=2, seed=seed)
        assert res.failures[0].kind == "deadlock", res.summary()


def test_pauses_and_clogs_get_what_the_runs_partitions_leave_of_the_budget() -> None:
    """Partitions may now take 70% of the detector's budget (swarm.PARTITION_SHARE): a pause or clog of
    exploration that overlaps them gets what they leave of 80% (the tail has the rest), so no cut outlasts
    the detector. A partition given as start:heal counts as long as it lasts."""
    budget = 2.5  # (the default detector: 5 missed beats of 0.5 s)
    for cut in (sim.Partition((0,), (1,), at=0.05, duration=1.9), sim.Partition((0,), (1,), at=0.05, heal_at=1.85)):
        seen = 0
        for seed in range(20):
            res = sim.run(allreduce_loop, world_size=3, seed=seed, trace=False, faults=[cut])
            for f in res.explored:
                if isinstance(f, (sim.Pause, sim.Clog)):
                    seen += 1
                    assert f.duration <= 0.8 * budget - 1.8 + 1e-9, (seed, f)
        assert seen >= 5
