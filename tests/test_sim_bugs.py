"""The simulator finds classic synchronization bugs by itself; their fixed twins pass.

Each class in tests/sim_bugs has a buggy program and its fixed twin. Timing
bugs must be found under plain ``sim.run`` defaults, restart amnesia and
split brain under ``faults=[sim.Swarm()]``, within 200 seeds; a fixed twin
must pass every seed, under the defaults and under a swarm of the fault kind
it was fixed for. ``benchmarks/sim_findrate.py`` measures the rates over 200
seeds (twins over 100; the table is in sim/README.md: rates from 5% to all
seeds); here, to keep CI short, a search stops at the first find, and twins
run 30 seeds (the benchmark's 100 have all passed).
"""

from __future__ import annotations

from typing import Any

import pytest

import sim
from sim_bugs import BLIND, CATALOG, VARIANTS, BugClass

SEEDS = 200
TWIN_SEEDS = 30


def _first_find(bc: BugClass) -> tuple[int | None, str]:
    faults: list[Any] = [sim.Swarm()] if bc.swarm else []
    for seed in range(SEEDS):
        res = sim.run(bc.buggy, world_size=bc.world_size, seed=seed, faults=faults, trace=False,
                      store_host=bc.store_host)
        if bc.is_the_bug(res):
            return seed, res.failures[0].message
    return None, ""


@pytest.mark.parametrize("bc", CATALOG + VARIANTS + BLIND, ids=lambda bc: bc.name)
def test_the_bug_is_found_by_itself_within_200_seeds(bc: BugClass) -> None:
    seed, message = _first_find(bc)
    assert seed is not None, f"{bc.name}: not found in {SEEDS} seeds"
    assert message.startswith(bc.symptom)


@pytest.mark.parametrize("bc", CATALOG + VARIANTS + BLIND, ids=lambda bc: bc.name)
def test_the_fixed_twin_passes_under_the_defaults(bc: BugClass) -> None:
    for seed in range(TWIN_SEEDS):
        res = sim.run(bc.fixed, world_size=bc.world_size, seed=seed, trace=False, store_host=bc.store_host)
        assert res.ok, res.summary()


@pytest.mark.parametrize("bc", [bc for bc in CATALOG + VARIANTS + BLIND if bc.swarm], ids=lambda bc: bc.name)
def test_the_fixed_twin_passes_a_swarm_of_the_kind_it_was_fixed_for(bc: BugClass) -> None:
    assert bc.swarm is not None
    for seed in range(TWIN_SEEDS):
        res = sim.run(bc.fixed, world_size=bc.world_size, seed=seed, faults=[sim.Swarm(kinds=bc.swarm)],
                      trace=False, store_host=bc.store_host)
        assert res.ok, res.summary()


def test_a_failing_seed_of_each_timing_class_shrinks_to_a_plan_that_fails_the_same_way() -> None:
    for bc in CATALOG[2:5]:  # lease, lost wake-up, causal order: windows a perturbation must hit
        seed, _ = _first_find(bc)
        assert seed is not None
        res = sim.run(bc.buggy, world_size=bc.world_size, seed=seed, trace=False)
        small = sim.shrink(bc.buggy, res, world_size=bc.world_size, max_runs=60)
        assert small.signature == sim.signature(res)
        assert len(small.faults) <= len(res.faults) + len(res.explored)
