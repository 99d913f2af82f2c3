"""Each rank of each run (``sim.run``, every seed of ``sim.sweep``) runs as a new process would: what an earlier
run left behind does not reach it."""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import sim

# A program that keeps per-process progress in a module global (a checkpoint kept in memory): correct for a real
# job, where each run starts in a new interpreter; had a sweep carried the global from one seed to the next, every
# seed after the first would start "done", skip its work and fail.
PROGRAM = """
import aiodist

DONE = {}


async def main():
    pg = await aiodist.init_process_group()
    rank = pg.rank()
    start = DONE.get(rank, 0)
    assert start == 0, f"rank {rank} starts at step {start}: an earlier run's state"
    for step in range(3):
        await pg.barrier()
        DONE[rank] = step + 1
    await aiodist.destroy_process_group()
"""

# Each process counts its own steps in a module-level dict (not keyed by rank): right for real processes.
PER_PROCESS = """
import os
import sys

import aiodist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (a common top level: run for every rank)
STEPS = {"n": 0}


async def main():
    pg = await aiodist.init_process_group()
    for _ in range(4):
        STEPS["n"] += 1
        await aiodist.barrier()
    assert STEPS["n"] == 4, f"rank {pg.rank} counted {STEPS['n']} steps of its 4"
    await aiodist.destroy_process_group()
    return STEPS["n"]
"""

UNGUARDED = """
import sim


async def main():
    pass

sim.sweep(main, seeds=range(2), world_size=2, jobs=1)
"""

# Rank 1 fails a receive and handles it: the aiodist logger's flight-recorder line must not reach stderr.
HANDLED = """
import aiodist
import numpy as np


async def main():
    pg = await aiodist.init_process_group()
    if pg.rank() == 1:
        try:
            await pg.recv(np.zeros(1), src=0, timeout=0.01)
        except aiodist.AiodistError:
            pass
    await pg.barrier()
    await aiodist.destroy_process_group()
"""


@pytest.fixture
def program(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    source: str = request.param
    name = f"sweep_apart_{request.node.name.split('[')[0][-20:]}_{len(source)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


@pytest.mark.parametrize("program", [PROGRAM], indirect=True)
@pytest.mark.parametrize("jobs", [1, 2])
def test_module_globals_do_not_carry_from_one_seed_to_the_next(program: ModuleType, jobs: int) -> None:
    report = sim.sweep(program.main, seeds=range(4), world_size=3, jobs=jobs)
    assert report.failing == [], [r["failures"] for r in report.records]
    assert program.DONE == {}  # (the caller's own module is left alone)
    alone = [sim.run(program.main, world_size=3, seed=s, trace=False) for s in (2, 2)]
    assert alone[0].ok and alone[1].ok and program.DONE == {}  # (sim.run isolates the ranks too)
    [record] = [r for r in report.records if r["seed"] == 2]
    assert record["digest"] == alone[0].digest == alone[1].digest


@pytest.mark.parametrize("program", [PROGRAM], indirect=True)
def test_sim_run_without_isolation_shares_the_callers_module(program: ModuleType) -> None:
    first = sim.run(program.main, world_size=3, seed=2, trace=False, isolate=False)
    assert first.ok and program.DONE == {0: 3, 1: 3, 2: 3}  # (a harness may read what the ranks left)
    again = sim.run(program.main, world_size=3, seed=2, trace=False, isolate=False)
    assert not again.ok and "an earlier run's state" in again.failures[0].message
    program.DONE.clear()
    report = sim.sweep(program.main, seeds=range(2), world_size=3, jobs=1, isolate=False)
    assert report.failing == [1]  # (the sweep passes it on to sim.run)


@pytest.mark.parametrize("program", [PROGRAM], indirect=True)
def test_a_closure_runs_as_it_is(program: ModuleType) -> None:
    calls: list[int] = []

    async def main() -> None:
        calls.append(1)
        await program.main()

    report = sim.sweep(main, seeds=range(2), world_size=2, jobs=1)
    assert len(calls) == 4  # (its state is the caller's)
    assert report.failing == [1]  # (and so is the global its module keeps)


@pytest.mark.parametrize("program", [PROGRAM], indirect=True)
def test_what_the_callers_module_holds_does_not_reach_the_sweeps_runs(program: ModuleType, tmp_path: Path) -> None:
    program.DONE[0] = 1  # (the caller's module is "done": the sweep's runs must not see it)
    report = sim.sweep(program.main, seeds=[0], world_size=2, jobs=1, trace_dir=str(tmp_path / "traces"))
    assert report.failing == []


@pytest.mark.parametrize("program", [PER_PROCESS], indirect=True)
def test_each_rank_of_sim_run_has_the_modules_globals_to_itself(program: ModuleType) -> None:
    """Before (blind probe s21, finding 2): the ranks shared the module, so rank 1 counted 8 steps of its 4."""
    paths = len(sys.path)
    results = [sim.run(program.main, world_size=3, seed=s, trace=False) for s in range(3)]
    assert [r.rank_results for r in results] == [[4, 4, 4]] * 3, [r.summary() for r in results]
    assert program.STEPS == {"n": 0}
    assert len(sys.path) <= paths  # (its top level's insert, run for every rank, does not pile up)


@pytest.mark.parametrize("call", ["sim.sweep(main, seeds=range(2), world_size=2, jobs=1)",
                                  "sim.run(main, world_size=2)"])
def test_a_sweep_or_run_at_a_modules_unguarded_top_level_is_refused(tmp_path: Path, call: str) -> None:
    (tmp_path / "unguarded_call.py").write_text(UNGUARDED.replace(
        "sim.sweep(main, seeds=range(2), world_size=2, jobs=1)", call))
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match=r"top level of unguarded_call\.py.*__name__ == \"__main__\""):
            importlib.import_module("unguarded_call")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("unguarded_call", None)


@pytest.mark.parametrize("program", [HANDLED], indirect=True)
def test_a_sweep_prints_no_log_records_of_errors_the_program_handled(program: ModuleType,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aiodist")
    report = sim.sweep(program.main, seeds=range(3), world_size=2, jobs=1)
    assert report.failing == []
    assert not [r for r in caplog.records if r.name.startswith("aiodist")]
    one = sim.run(program.main, world_size=2, seed=0, trace=False)
    assert one.ok  # (a single run logs it: the sweep drops it)
    assert any("flight recorder" in r.getMessage() for r in caplog.records)


SELF_WRITE = """
import sys

import aiodist


async def main():
    me = sys.modules[__name__]  # (writes through the module object, as some programs keep a counter)
    me.COUNT = getattr(me, "COUNT", 0) + 1
    await aiodist.init_process_group()
    await aiodist.destroy_process_group()
    return me.COUNT
"""


@pytest.mark.parametrize("program", [SELF_WRITE], indirect=True)
def test_writes_through_sys_modules_reach_the_ranks_own_module(program: ModuleType) -> None:
    """Before (isolation probe s22, 3): they went into the stand-in, one object for all ranks and runs (3, then
    6, then 9 over three runs, with equal digests)."""
    results = [sim.run(program.main, world_size=3, seed=s, trace=False) for s in range(3)]
    assert [r.rank_results for r in results] == [[1, 1, 1]] * 3


TYPED = """
import dataclasses
import enum

import aiodist


class Mode(enum.Enum):
    FAST = 1


@dataclasses.dataclass
class Cfg:
    mode: Mode
    n: int


async def main(cfg, seen):
    seen.append(1)  # (plain data passed as it is: the caller sees what the ranks do to it)
    return isinstance(cfg, Cfg) and cfg.mode is Mode.FAST and cfg == Cfg(Mode.FAST, 2)
"""


@pytest.mark.parametrize("program", [TYPED], indirect=True)
def test_objects_of_the_programs_classes_passed_in_args_are_the_ranks_own(program: ModuleType) -> None:
    """Before (isolation probe s22, 1): the caller's Cfg was not the rank's: isinstance, `is` and == all False."""
    seen: list[int] = []
    res = sim.run(program.main, world_size=3, seed=0, args=(program.Cfg(program.Mode.FAST, 2), seen))
    assert res.ok and res.rank_results == [True] * 3, res.summary()
    seen2: list[int] = []
    res = sim.run(program.main, world_size=3, seed=0, args=(None, seen2))
    assert res.rank_results == [False] * 3 and seen2 == [1, 1, 1]
