"""The plain modules beside a program file that it imports are each virtual rank's own, as in a real process.

Before (blind probe s23, findings 1 and 2): they were imported once for the whole simulator process, so a
helper module's per-process state (a metrics registry) was shared by the ranks (a correct program failed in
the simulator only: "my metrics say 20 steps, I ran 5"), survived a Restart, and carried from one seed of a
sweep to the next (seeds 1-3 of 0:4 failed with -j 1, 2-3 with -j 2, and each seed alone passed).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import sim
from sim.cli import load_main

ROOT = Path(__file__).resolve().parents[1]

METRICS = '''
import dataclasses

_counters = {}


@dataclasses.dataclass
class Sample:
    name: str
    value: int


def bump(name, n=1):
    _counters[name] = _counters.get(name, 0) + n
    return _counters[name]


def read(name):
    return _counters.get(name, 0)
'''

# Only rank 0 touches the helper: each run alone passes; a sweep that carried the helper over failed.
ONCE = '''
import aiodist
import metrics


async def main():
    pg = await aiodist.init_process_group()
    if pg.rank == 0:
        n = metrics.bump("runs")
        assert n == 1, f"this process has run main {n} times"
    await aiodist.barrier()
    await aiodist.destroy_process_group()
'''

# Every rank counts its own steps in the helper (correct for real processes), and passes a helper's object
# through an object collective (an instance of the receiving rank's class of the name).
STEPS = '''
import aiodist
import metrics
from metrics import Sample, bump


async def main():
    pg = await aiodist.init_process_group()
    for _ in range(5):
        bump("steps")
        await aiodist.barrier()
    box = [Sample("from0", 7)] if pg.rank == 0 else [None]
    await aiodist.broadcast_object_list(box, src=0)
    await aiodist.destroy_process_group()
    return metrics.read("steps"), isinstance(box[0], Sample), box[0] == Sample("from0", 7)
'''

# A helper that imports another helper: the second one is the rank's own too.
CHAIN_HELPER = '''
import metrics


def step():
    return metrics.bump("chained")
'''

CHAIN = '''
import aiodist
import chain


async def main():
    pg = await aiodist.init_process_group()
    for _ in range(3):
        chain.step()
        await aiodist.barrier()
    await aiodist.destroy_process_group()
    return chain.metrics.read("chained")
'''

# Progress kept in a helper module (memory only): a restarted process starts with nothing.
RESTARTED = '''
import asyncio
import os
import aiodist
import metrics


async def main():
    store = await aiodist.TCPStore.connect(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=30)
    await store.add("started", 1)
    seen = metrics.read("done")
    metrics.bump("done")
    await asyncio.sleep(0.2)
    return seen, os.environ["AIODIST_RESTART_COUNT"]
'''


def _write(folder: Path, **files: str) -> None:
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)


def _sweep(folder: Path, prog: str, jobs: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sim", "run", "-n", "2", prog, "--seeds", "0:4", "-j", jobs, "-q",
                           *extra], cwd=folder, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_helper_modules_state_does_not_carry_from_one_seed_to_the_next(tmp_path: Path) -> None:
    _write(tmp_path, metrics=METRICS, prog=ONCE)
    for jobs in ("1", "2"):
        proc = _sweep(tmp_path, "prog.py", jobs)
        assert proc.returncode == 0 and "all 4 seeds passed" in proc.stdout, (jobs, proc.stdout + proc.stderr)
    main = load_main(str(tmp_path / "prog.py"))
    for seed in (0, 1, 0):
        res = sim.run(main, world_size=2, seed=seed)
        assert res.ok, res.summary()


def test_each_virtual_rank_has_its_own_copy_of_a_helper_module(tmp_path: Path) -> None:
    _write(tmp_path, metrics=METRICS, prog=STEPS)
    res = sim.run(load_main(str(tmp_path / "prog.py")), world_size=4, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results == [(5, True, True)] * 4


def test_a_helper_imported_by_a_helper_is_the_ranks_own(tmp_path: Path) -> None:
    _write(tmp_path, metrics=METRICS, chain=CHAIN_HELPER, prog=CHAIN)
    main = load_main(str(tmp_path / "prog.py"))
    for seed in (0, 1):
        res = sim.run(main, world_size=3, seed=seed)
        assert res.ok and res.rank_results == [3, 3, 3], res.summary()


def test_a_restarted_rank_has_a_fresh_copy_of_its_helper_modules(tmp_path: Path) -> None:
    _write(tmp_path, metrics=METRICS, prog=RESTARTED)
    res = sim.run(load_main(str(tmp_path / "prog.py")), world_size=2, seed=0, store_host="separate",
                  faults=[sim.Restart(1, at=0.1)])
    assert res.restarts == {1: 1}, res.summary()
    assert res.rank_results == [(0, "0"), (0, "1")], "the restarted rank saw its previous process's progress"


def test_sim_run_of_an_imported_main_gives_each_rank_its_own_helpers(tmp_path: Path) -> None:
    """sim.run(isolate=True) on a main whose module the caller imported (with its helper): the ranks' copies are
    fresh in every run, and the caller's own helper module is left as it was."""
    _write(tmp_path, metrics=METRICS, helper_prog=STEPS)
    sys.path.insert(0, str(tmp_path))
    try:
        prog = importlib.import_module("helper_prog")
        callers = sys.modules["metrics"]
        for seed in (0, 1):
            res = sim.run(prog.main, world_size=3, seed=seed)
            assert res.ok and res.rank_results == [(5, True, True)] * 3, res.summary()
        assert callers.read("steps") == 0 and sys.modules["metrics"] is callers
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("helper_prog", "metrics"):
            sys.modules.pop(name, None)


def test_modules_outside_the_programs_folder_stay_the_process_ones(tmp_path: Path) -> None:
    _write(tmp_path, prog="import json\nimport aiodist\n\nasync def main():\n    return json.dumps is __import__('json').dumps\n")
    import json

    res = sim.run(load_main(str(tmp_path / "prog.py")), world_size=2, seed=0)
    assert res.ok and res.rank_results == [True, True], res.summary()
    assert sys.modules["json"] is json


def test_two_programs_with_helpers_of_one_name_each_pickle_their_own(tmp_path: Path) -> None:
    """The stand-in that pickle resolves a helper's class through belongs to the program that runs."""
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        _write(tmp_path / sub, metrics=METRICS, prog=STEPS)
    mains = [load_main(str(tmp_path / sub / "prog.py")) for sub in ("a", "b")]
    for main in mains + mains:
        res = sim.run(main, world_size=2, seed=0)
        assert res.ok and res.rank_results == [(5, True, True)] * 2, res.summary()


BACKREF_HELPER = '''
def echo():
    from backref import TAG, tagged

    return TAG, tagged()
'''

BACKREF = '''
import aiodist
import side

TAG = {"n": 0}


def tagged():
    TAG["n"] += 1
    return TAG["n"]


async def main():
    pg = await aiodist.init_process_group()
    tag, n = side.echo()
    await aiodist.destroy_process_group()
    return tag is TAG, n
'''


def test_a_helper_importing_the_program_by_name_gets_the_ranks_own_copy(tmp_path: Path) -> None:
    """Run as a file (python -m sim run): `from backref import ...` in a helper runs the file again under
    another name, as a process does (not the rank's main module); imported by the caller (sim.run on its main):
    that rank's copy of the module. Either way the rank's own, fresh in every run."""
    _write(tmp_path, side=BACKREF_HELPER, backref=BACKREF)
    res = sim.run(load_main(str(tmp_path / "backref.py")), world_size=2, seed=0)
    assert res.ok and res.rank_results == [(False, 1), (False, 1)], res.summary()
    sys.path.insert(0, str(tmp_path))
    try:
        prog = importlib.import_module("backref")
        for seed in (0, 1):
            res = sim.run(prog.main, world_size=2, seed=seed)
            assert res.ok and res.rank_results == [(True, 1), (True, 1)], res.summary()
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("backref", "side"):
            sys.modules.pop(name, None)
