"""A program file run by the simulator's CLI gets a fresh module for every run and rank, as a real job's
processes do.

Before: the file was imported once per worker process, so what one seed left in the module's globals
changed the next seed's run; a sweep's verdict depended on which worker ran which seeds, and the
replay command it printed for a failing seed passed (probe: 17 of 20 digests differed between -j 1
and -j 2; a module-level registry made 18 of 20 seeds "fail").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import sim
from sim.cli import load_main

ROOT = Path(__file__).resolve().parents[1]

REGISTRY = '''
import random
import aiodist

_RUNS = []  # a registry filled on first use
DRAWN = random.random()  # drawn at import: from the run's own generator, the same in every replay

async def main():
    pg = await aiodist.init_process_group()
    _RUNS.append(pg.rank)
    await aiodist.barrier()
    assert _RUNS == [pg.rank], f"stale module state: {_RUNS} registered"
    await aiodist.destroy_process_group()
    return DRAWN
'''

OBJECTS = '''
import dataclasses
import aiodist

@dataclasses.dataclass
class Point:
    x: int

async def main():
    pg = await aiodist.init_process_group()
    box = [Point(pg.rank)]
    await aiodist.broadcast_object_list(box, src=1)
    await aiodist.destroy_process_group()
    return isinstance(box[0], Point) and box[0] == Point(1)
'''


def test_each_run_of_a_program_file_starts_from_a_fresh_module(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(REGISTRY)
    main = load_main(str(tmp_path / "prog.py"))
    first = [sim.run(main, world_size=3, seed=s) for s in (0, 1, 0)]
    assert all(r.ok for r in first), [r.summary() for r in first if not r.ok]
    assert first[0].digest == first[2].digest and first[0].rank_results == first[2].rank_results
    again = sim.run(load_main(str(tmp_path / "prog.py")), world_size=3, seed=0)
    assert again.digest == first[0].digest and again.rank_results == first[0].rank_results


def test_objects_of_the_programs_classes_survive_pickling_in_every_run(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(OBJECTS)
    main = load_main(str(tmp_path / "prog.py"))
    for seed in range(3):
        res = sim.run(main, world_size=3, seed=seed)
        assert res.ok and res.rank_results == [True] * 3, res.summary()


def test_a_sweep_gives_the_same_verdicts_in_one_worker_as_in_two(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(REGISTRY)
    outs = []
    for jobs in ("1", "2"):
        proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "3", "prog.py", "--seeds", "0:8", "-j", jobs,
                               "-q", "--out", f"r{jobs}.jsonl"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0 and "all 8 seeds passed" in proc.stdout, proc.stdout + proc.stderr
        outs.append(sorted(line for line in (tmp_path / f"r{jobs}.jsonl").read_text().splitlines()))
    assert len(outs[0]) == 8


def _program(tmp_path: Path, source: str) -> sim.Result:
    (tmp_path / "prog.py").write_text(source)
    return sim.run(load_main(str(tmp_path / "prog.py")), world_size=3, seed=0)


def test_os_exit_in_a_rank_ends_that_rank_not_the_simulator(tmp_path: Path) -> None:
    """Before: os._exit(3) in one rank ended the whole simulator (exit status 3, no verdict, no replay)."""
    source = '''
import os
import numpy as np
import aiodist

async def main():
    pg = await aiodist.init_process_group()
    if pg.rank == 1:
        os._exit(CODE)
    await aiodist.all_reduce(np.ones(2))
    await aiodist.destroy_process_group()
'''
    res = _program(tmp_path, source.replace("CODE", "3"))
    assert not res.ok and res.failures[0].rank == 1, res.summary()
    assert res.failures[0].message.startswith("os._exit(3)") and "prog.py:9" in res.failures[0].location
    res = _program(tmp_path, source.replace("CODE", "0"))
    assert not res.ok and 1 in res.returned and all(f.rank != 1 for f in res.failures)
    assert "rank 1 failed" in res.failures[0].message  # its peers lost it


def test_a_main_that_is_not_async_fails_each_rank_saying_so(tmp_path: Path) -> None:
    calls_run = '''
import asyncio

async def amain():
    await asyncio.sleep(0)

def main():
    asyncio.run(amain())
'''
    res = _program(tmp_path, calls_run)
    assert not res.ok and "main() is not `async def`" in res.failures[0].message, res.summary()
    res = _program(tmp_path, "def main():\n    return 5\n")
    assert not res.ok and "main() returned int, not an awaitable" in res.failures[0].message, res.summary()
    returns_coroutine = "import asyncio\n\ndef main():\n    return asyncio.sleep(0, result=7)\n"
    assert _program(tmp_path, returns_coroutine).rank_results == [7, 7, 7]


def test_a_program_that_runs_its_job_at_import_is_told_to_guard_it(tmp_path: Path) -> None:
    """Before (porting probe): a port ending with a module-level ``asyncio.run(main())`` (it runs under
    ``aiodist run``) failed in the simulator with only "environment variable RANK is not set"."""
    (tmp_path / "prog.py").write_text(
        "import asyncio\nimport aiodist\n\nasync def main():\n    await aiodist.init_process_group()\n\n"
        "asyncio.run(main())\n")
    with pytest.raises(Exception) as info:
        load_main(str(tmp_path / "prog.py"))
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "prog.py's top level" in notes and 'if __name__ == "__main__":' in notes, notes


RESTARTED = '''
import asyncio
import dataclasses
import os
import pickle

import aiodist

DONE = {}  # rank -> progress kept in the process's memory only: a restarted process starts without it


@dataclasses.dataclass
class Point:
    x: int


async def main():
    rank = int(os.environ["RANK"])
    incarnation = int(os.environ["AIODIST_RESTART_COUNT"])
    store = await aiodist.TCPStore.connect(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=30)
    if rank == 0:
        await store.set("point", pickle.dumps(Point(7)))
    seen = list(DONE.get(rank, []))
    DONE.setdefault(rank, []).append(incarnation)
    sent = pickle.loads(await store.get("point"))
    mine = pickle.loads(pickle.dumps(Point(rank)))  # (this process's class pickles, and is the one others send)
    await asyncio.sleep(0.2)
    return seen, isinstance(sent, Point) and sent == Point(7), isinstance(mine, Point)
'''


def test_a_restarted_rank_runs_the_program_file_afresh_losing_its_module_globals(tmp_path: Path) -> None:
    """A restarted process does not see what its previous one kept in module globals (probe: it did, which hid
    restart-amnesia bugs whose progress lives in a module-level dict); the program's classes stay one per name."""
    (tmp_path / "prog.py").write_text(RESTARTED)
    main = load_main(str(tmp_path / "prog.py"))
    res = sim.run(main, world_size=2, seed=0, store_host="separate", faults=[sim.Restart(1, at=0.1)])
    assert res.ok, res.summary()
    assert res.rank_results[0] == ([], True, True)
    assert res.rank_results[1] == ([], True, True), "the restarted rank saw its previous process's DONE"
    assert res.restarts == {1: 1}


PER_PROCESS = '''
import dataclasses
import aiodist

STEPS = {"n": 0}  # this process's own step counter


@dataclasses.dataclass
class Counter:
    by: int

    def bump(self):  # (a method reads its own rank's module globals, as a function does)
        STEPS["n"] += self.by


async def main():
    pg = await aiodist.init_process_group()
    for _ in range(5):
        Counter(1).bump()
        await aiodist.barrier()
    box = [Counter(pg.rank + 1)] if pg.rank == 0 else [None]
    await aiodist.broadcast_object_list(box, src=0)
    box[0].bump()  # (another rank's object, of this rank's class)
    await aiodist.destroy_process_group()
    return STEPS["n"], isinstance(box[0], Counter)
'''


def test_each_virtual_rank_has_its_own_module_globals(tmp_path: Path) -> None:
    """Before (blind probe s21, finding 2): the ranks of a run shared the file's module, so a per-process counter
    counted every rank's steps (rank 1 saw 10 of its 5): a correct program failed in the simulator only."""
    (tmp_path / "prog.py").write_text(PER_PROCESS)
    res = sim.run(load_main(str(tmp_path / "prog.py")), world_size=3, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results == [(6, True)] * 3


def test_no_isolate_runs_one_module_per_run_shared_by_its_ranks_and_is_in_the_replay(tmp_path: Path) -> None:
    """--no-isolate (a program whose top level is costly, isolation probe s22, 10): one module per run, shared
    by the ranks (their steps add up), still fresh for every run; a failing seed's replay keeps the flag."""
    (tmp_path / "prog.py").write_text(PER_PROCESS)
    main = load_main(str(tmp_path / "prog.py"), isolate=False)
    for seed in (0, 1):
        res = sim.run(main, world_size=3, seed=seed)
        assert res.ok and [n for n, _ in res.rank_results] != [6, 6, 6], res.summary()
        assert sorted(n for n, _ in res.rank_results)[-1] > 6  # (the shared counter saw every rank's steps)
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "2", "prog.py", "--seed", "0", "--no-isolate"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "bad.py").write_text("import aiodist\n\nasync def main():\n    assert False, 'no'\n")
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "2", "bad.py", "--seed", "0", "--no-isolate"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "--no-isolate" in proc.stdout.split("Replay with:")[1], proc.stdout
