"""The ``aiodist`` command dispatches to its subcommands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _aiodist(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aiodist", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_every_subcommand():
    out = _aiodist("--help")
    assert out.returncode == 0
    for cmd in ("run", "store", "trace", "sim"):
        assert f"    {cmd} " in out.stdout


def test_no_subcommand_is_a_usage_error():
    assert _aiodist().returncode == 2


def test_sim_subcommand_runs_the_simulator_and_fails_like_it():
    ok = _aiodist("sim", "run", "-n", "3", "examples/train_dp.py", "--seed", "4")
    assert ok.returncode == 0, ok.stderr
    assert "seed 4: ok" in ok.stdout
    bad = _aiodist("sim", "run", "-n", "3", "examples/train_dp.py", "--seed", "4", "--crash", "1@0.001")
    assert bad.returncode != 0
    assert "Replay with" in bad.stdout + bad.stderr
