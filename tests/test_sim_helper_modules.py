"""A program file's own helper modules start afresh in every run, as they do in every new process.

Before (blind probe s23, finding 1): a module beside the program that it imported was imported once per
worker process, so what one seed left in its globals reached the next seed the worker ran: a sweep's
verdict depended on the seed order and ``-j`` (seeds 1-3 of 0:4 failed with -j 1, 2-3 with -j 2) while
each seed alone, and its printed replay, passed. (Within a run the virtual ranks share such a module:
one process; see sim/README's known limits.)
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
'''

# Only rank 0 touches the helper: each run alone passes; a run after another in the same process failed.
ONCE = '''
import aiodist
import metrics
from pkg import registry


async def main():
    pg = await aiodist.init_process_group()
    if pg.rank == 0:
        n = metrics.bump("runs")
        assert n == 1, f"this process has run main {n} times"
        registry.append("run")
        assert registry == ["run"], f"the package's registry holds {registry}"
    box = [metrics.Sample("x", 1)] if pg.rank == 0 else [None]
    await aiodist.broadcast_object_list(box, src=0)
    await aiodist.destroy_process_group()
    return isinstance(box[0], metrics.Sample) and box[0] == metrics.Sample("x", 1)
'''


def _write(folder: Path) -> None:
    (folder / "metrics.py").write_text(METRICS)
    (folder / "pkg").mkdir()
    (folder / "pkg" / "__init__.py").write_text("registry = []\n")
    (folder / "prog.py").write_text(ONCE)


def test_a_sweeps_seeds_do_not_see_what_earlier_seeds_left_in_helper_modules(tmp_path: Path) -> None:
    _write(tmp_path)
    for jobs in ("1", "2"):
        proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "2", "prog.py", "--seeds", "0:4", "-j", jobs,
                               "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0 and "all 4 seeds passed" in proc.stdout, (jobs, proc.stdout + proc.stderr)


def test_each_run_of_a_program_file_imports_its_helpers_afresh(tmp_path: Path) -> None:
    _write(tmp_path)
    main = load_main(str(tmp_path / "prog.py"))
    runs = [sim.run(main, world_size=2, seed=seed) for seed in (0, 1, 0)]
    assert all(r.ok and r.rank_results == [True, True] for r in runs), [r.summary() for r in runs]
    assert runs[0].digest == runs[2].digest


def test_modules_imported_before_the_program_are_left_as_they_are(tmp_path: Path) -> None:
    """A package the caller had loaded keeps its modules, even one the program imports first (a late
    submodule, as the program may of aiodist's), and so does a helper the caller imported itself."""
    (tmp_path / "prepkg").mkdir()
    (tmp_path / "prepkg" / "__init__.py").write_text("")
    (tmp_path / "prepkg" / "late.py").write_text("STATE = []\n")
    (tmp_path / "mine.py").write_text("SEEN = []\n")
    (tmp_path / "prog.py").write_text("import mine\nimport prepkg.late\n\nasync def main():\n"
                                      "    prepkg.late.STATE.append(1)\n    return len(mine.SEEN)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        prepkg, mine = importlib.import_module("prepkg"), importlib.import_module("mine")
        main = load_main(str(tmp_path / "prog.py"))
        late = sys.modules["prepkg.late"]
        for seed in (0, 1):
            res = sim.run(main, world_size=2, seed=seed)
            assert res.ok, res.summary()
        assert sys.modules["prepkg.late"] is late and late.STATE == [1] * 4
        assert sys.modules["prepkg"] is prepkg and sys.modules["mine"] is mine
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("prepkg", "prepkg.late", "mine"):
            sys.modules.pop(name, None)
