"""Shrinking: of a plan of ten faults, the two whose coincidence breaks the program."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sim
from sim_bugs.coincidence import main as coincidence

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "sim_bugs" / "coincidence.py"


CULPRITS = [sim.Pause(1, at=0.5, duration=0.4), sim.Clog((0, 2), at=0.6, until=1.0)]
DECOYS = [
    sim.Clog((1, 2), at=0.2, until=1.5), sim.Clog((2, 1), at=0.3, duration=0.5),
    sim.Partition((1,), (2,), at=0.1, heal_at=1.8), sim.Pause(2, at=0.1, duration=0.05),
    sim.Pause(1, at=1.6, duration=0.1), sim.Straggler(0, 1.05, at=0.2, duration=1.0),
    sim.ResetConnection(1, 2, at=0.7), sim.Clog((1, 0), at=1.9, until=1.95),
]


def test_each_culprit_alone_passes_together_they_fail() -> None:
    for plan in ([CULPRITS[0], *DECOYS], [CULPRITS[1], *DECOYS], []):
        assert sim.run(coincidence, world_size=3, faults=plan, explore=False).ok
    assert not sim.run(coincidence, world_size=3, faults=[*DECOYS[:4], *CULPRITS, *DECOYS[4:]], explore=False).ok


def test_a_plan_of_ten_shrinks_to_the_two_that_coincide() -> None:
    plan = [*DECOYS[:3], CULPRITS[0], *DECOYS[3:6], CULPRITS[1], *DECOYS[6:]]
    assert len(plan) == 10
    res = sim.run(coincidence, world_size=3, faults=plan, explore=False)
    assert not res.ok
    small = sim.shrink(coincidence, res, world_size=3)
    assert [type(f) for f in small.faults] == [sim.Pause, sim.Clog]
    pause, clog = small.faults
    assert (pause.rank, pause.at, clog.link, clog.at) == (1, 0.5, (0, 2), 0.6)
    assert pause.duration <= 0.4  # shortened while it still fails the same way
    assert small.signature == sim.signature(res) and small.signature.startswith("AssertionError at coincidence.py")
    assert not small.result.ok and sim.signature(small.result) == small.signature
    again = sim.run(coincidence, world_size=3, faults=small.faults, explore=False)
    assert again.digest == small.result.digest  # the minimal plan replays


def test_an_explored_failure_shrinks_its_perturbations_too() -> None:
    from sim_bugs import lease

    for seed in range(200):
        res = sim.run(lease.buggy, world_size=3, seed=seed, trace=False)
        if not res.ok:
            break
    else:
        raise AssertionError("exploration found no overlap of lease holders in 200 seeds")
    small = sim.shrink(lease.buggy, res, world_size=3)
    assert small.signature == sim.signature(res)
    assert len(small.faults) <= len(res.explored) and len(small.faults) <= 3
    assert any(isinstance(f, (sim.Pause, sim.Straggler)) for f in small.faults) or small.tail is not None


def test_the_cli_shrinks_a_failing_seed_and_prints_a_minimal_replay_that_fails(tmp_path: Path) -> None:
    plan = [*DECOYS[:3], CULPRITS[0], *DECOYS[3:6], CULPRITS[1], *DECOYS[6:]]
    flags = [x for f in plan for x in f.to_cli().split()]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "3", str(PROGRAM), "--no-explore", *flags,
                           "--shrink"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "shrunk in" in proc.stdout and "to 2 fault(s)" in proc.stdout, proc.stdout
    minimal = proc.stdout.split("Minimal replay:\n", 1)[1].strip().splitlines()[0].strip()
    assert "--pause 1@0.5+" in minimal and "--clog 0-2@0.6:1.0" in minimal and "--partition" not in minimal
    again = subprocess.run([sys.executable, *minimal.split()[1:]], env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 1 and "rank 1 stalled while rank 2's store was slow" in again.stdout + again.stderr


def test_shrinking_with_q_prints_nothing_of_the_replays(tmp_path: Path) -> None:
    # (each replay's rank that sees the crash logs a flight-recorder warning: -q shows only the verdicts)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "4", str(ROOT / "examples" / "train_dp.py"),
                           "--no-explore", "--crash", "3@sent:27", "--pause", "2@0.07+4.9", "--shrink", "-q"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "shrunk in" in proc.stdout and "crash 3@sent:27" in proc.stdout.split("shrunk in", 1)[1], proc.stdout
    assert "flight recorder" not in proc.stderr + proc.stdout, proc.stderr
