"""The command line runs programs under one PYTHONHASHSEED, so a seed that hashes strings replays exactly.

A set of ``str`` is iterated in an order Python draws per process: without a
pinned hash seed, the same seed of a program that sends in such an order ran
differently from one invocation to the next, and a failing seed's printed
replay command could pass.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sim import cli

ROOT = Path(__file__).resolve().parents[1]

# Rank 0 sends six names in a set's order; their lengths differ, so every order is another run (digest).
HASHY = (
    "import aiodist as dist\n"
    "async def main():\n"
    "    await dist.init_process_group()\n"
    "    names = {'a', 'bb', 'ccc', 'dddd', 'eeeee', 'ffffff'}\n"
    "    if dist.get_rank() == 0:\n"
    "        for name in names:\n"
    "            await dist.send_object_list([name], dst=1)\n"
    "    else:\n"
    "        for _ in names:\n"
    "            await dist.recv_object_list([None], src=0)\n"
    "    await dist.destroy_process_group()\n"
)


def _sim(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    environ.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "sim", "run", *args], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=120)


def _digest(proc: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"digest ([0-9a-f]{32})", proc.stdout)
    assert found is not None, proc.stdout + proc.stderr
    return found.group(1)


def test_the_same_seed_is_the_same_run_in_every_invocation(tmp_path: Path) -> None:
    prog = tmp_path / "hashy.py"
    prog.write_text(HASHY)
    runs = [_sim(["-n", "2", str(prog), "--seed", "3", "-q"]) for _ in range(2)]
    assert all(p.returncode == 0 for p in runs), [p.stdout + p.stderr for p in runs]
    assert _digest(runs[0]) == _digest(runs[1])  # (unpinned: 1 chance in 720 of the same order)


def test_a_hash_seed_the_user_gives_is_kept_and_in_the_replay_command(tmp_path: Path) -> None:
    prog = tmp_path / "hashy.py"
    prog.write_text(HASHY.replace("    await dist.destroy_process_group()\n",
                                  "    await dist.destroy_process_group()\n    raise SystemExit(3)\n"))
    given = _sim(["-n", "2", str(prog), "--seed", "3", "-q"], PYTHONHASHSEED="7")
    assert given.returncode == 1, given.stdout + given.stderr
    replay = given.stdout.rsplit("Replay with:", 1)[1].strip().splitlines()[0]
    assert replay.startswith("PYTHONHASHSEED=7 python -m sim run"), replay
    again = _sim(shlex.split(replay)[5:], PYTHONHASHSEED="7")
    assert _digest(again) == _digest(given)
    pinned = _sim(["-n", "2", str(prog), "--seed", "3", "-q"])  # (the default: pinned, not in the command)
    assert "Replay with:\n  python -m sim run" in pinned.stdout, pinned.stdout


def test_replay_command_names_only_a_hash_seed_other_than_the_pinned_one(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = cli.build_parser().parse_args(["run", "-n", "2", "prog.py"])
    ns.args = []
    for value, prefix in (("0", ""), ("12", "PYTHONHASHSEED=12 "), ("random", "")):
        monkeypatch.setenv("PYTHONHASHSEED", value)
        assert cli.replay_command(ns, 5).startswith(prefix + "python -m sim run -n 2 prog.py --seed 5")
    assert isinstance(ns, argparse.Namespace)


def test_check_determinism_says_a_run_depends_on_string_hashing(tmp_path: Path) -> None:
    prog = tmp_path / "hashy.py"
    prog.write_text(HASHY)
    proc = _sim(["-n", "2", str(prog), "--seed", "3", "-q", "--check-determinism"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "determinism check: FAILED" in proc.stdout
    assert "PYTHONHASHSEED 0 vs 4242" in proc.stdout
    assert "a fresh process replays it exactly" in proc.stdout
    assert "depends on the order of hashed str or bytes" in proc.stdout


def test_check_determinism_says_a_run_depends_on_something_outside_the_seed(tmp_path: Path) -> None:
    prog = tmp_path / "address.py"
    prog.write_text(
        "import asyncio, os\n"
        "import aiodist as dist\n"
        "async def main():\n"
        "    await dist.init_process_group()\n"
        "    await asyncio.sleep(id(object()) % 1000 * 1e-6)  # an address: not from the seed\n"
        "    await dist.barrier()\n"
        "    await dist.destroy_process_group()\n"
    )
    proc = _sim(["-n", "2", str(prog), "--seed", "3", "-q", "--check-determinism"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "a fresh process under the same PYTHONHASHSEED 0 differs too" in proc.stdout


def test_python_dash_i_and_dash_e_runs_are_pinned_too(tmp_path: Path) -> None:
    # review24 probe: ``python -I`` / ``-E`` ignore PYTHONHASHSEED, so the started-again process hashed at random.
    prog = tmp_path / "hashy.py"
    prog.write_text(HASHY)
    plain = _digest(_sim(["-n", "2", str(prog), "--seed", "3", "-q"]))
    for flag in ("-I", "-E"):
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
        runs = [subprocess.run([sys.executable, flag, "-m", "sim", "run", "-n", "2", str(prog), "--seed", "3", "-q"],
                               cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
                for _ in range(2)]
        assert [_digest(p) for p in runs] == [plain, plain], [p.stdout + p.stderr for p in runs]
