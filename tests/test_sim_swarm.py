"""Swarm: a destructive plan per seed, kinds switched on and off, restricted on request, replayed exactly."""

from __future__ import annotations

import collections
from typing import Any

import sim
from sim.plan import World
from sim.swarm import KINDS, PARTITION_SHARE, kinds_of
from test_sim_plan import store_counter


def _plans(swarm: sim.Swarm, seeds: range, *, world_size: int = 4, separate: bool = False) -> list[list[Any]]:
    return [swarm.expand(World(s, world_size, separate, None)) for s in seeds]


def test_a_seed_draws_one_plan_and_kinds_come_and_go_across_seeds() -> None:
    swarm = sim.Swarm()
    assert _plans(swarm, range(5)) == _plans(swarm, range(5))
    plans = _plans(swarm, range(300))
    subsets = collections.Counter(frozenset(kinds_of(p)) for p in plans)
    assert all(p for p in plans)  # always something
    assert len(subsets) > 25  # many combinations of kinds ...
    assert sum(n for kinds, n in subsets.items() if len(kinds) == 1) > 50  # ... often a kind alone
    assert set().union(*subsets) == set(KINDS)


def test_a_restricted_swarm_draws_only_those_kinds() -> None:
    for kinds in ({"restart"}, {"partition", "clog"}, {"pause"}):
        for plan in _plans(sim.Swarm(kinds=kinds), range(100)):
            assert set(kinds_of(plan)) <= kinds and plan


def test_the_store_host_is_hit_only_with_the_store_kind_or_on_a_host_of_its_own() -> None:
    killers = (sim.Crash, sim.Restart, sim.Pause)
    for plan in _plans(sim.Swarm(kinds={"crash", "restart", "pause"}), range(200)):
        assert all(f.rank != 0 for f in plan if isinstance(f, killers))  # rank 0 hosts the store
    hit = [f for plan in _plans(sim.Swarm(kinds={"crash", "restart", "pause"}), range(200), separate=True)
           for f in plan if isinstance(f, killers)]
    assert any(f.rank == 0 for f in hit)
    cut = [f for plan in _plans(sim.Swarm(kinds={"partition"}), range(100), separate=True) for f in plan]
    assert any("store" in (*f.a, *f.b) for f in cut)
    # A full swarm allows the store kind; only the seeds whose draw switched it on hit rank 0 (before, blind probe
    # s22: every seed could, and a quarter of the seeds lost the store to a crash, restart or pause of rank 0).
    plans = _plans(sim.Swarm(), range(300))
    struck = [p for p in plans if any(isinstance(f, killers) and f.rank == 0 for f in p)]
    assert struck and all("store" in kinds_of(p) for p in struck)


def test_a_plans_partitions_together_stay_within_the_failure_detectors_budget() -> None:
    # Overlapping partitions of one pair of hosts are one long cut: each under the budget is not
    # enough (a fixed split-brain twin was declared failed under three that chained into 3.7 s).
    worlds = [World(s, 3, False, None) for s in range(400)]
    several = 0
    for w in worlds:
        cut = [f for f in sim.Swarm(kinds={"partition"}).expand(w) if isinstance(f, sim.Partition)]
        several += len(cut) > 1
        assert sum(f.duration for f in cut) <= PARTITION_SHARE * w.budget * (1 + 1e-5), cut
    assert several > 100  # (plans with several partitions are common: the bound is not vacuous)


def test_the_plan_is_in_the_result_and_replays_the_same_run() -> None:
    for seed in range(8):
        res = sim.run(store_counter, world_size=3, seed=seed, faults=[sim.Swarm(kinds={"restart", "clog"})],
                      trace=False)
        assert res.faults and set(kinds_of(res.faults)) <= {"restart", "clog"}
        again = sim.run(store_counter, world_size=3, seed=seed, trace=False, **sim.replay_plan(res))
        assert again.digest == res.digest
        assert "faults: " in res.summary()
