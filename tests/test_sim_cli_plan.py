"""The run's plan on the command line: exploration and swarm replayed exactly, determinism checked with both."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import sim
from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
RACE = str(ROOT / "examples" / "sim_race.py")
BY_NAME = str(ROOT / "tests" / "sim_bugs" / "by_name.py")  # main: the buggy program of the class $SIM_BUG names


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def _replay(out: str) -> list[str]:
    return shlex.split(out.split("Replay with:")[1].strip().splitlines()[0])


def test_an_explored_failure_prints_its_plan_and_the_replay_spelled_out_gives_the_same_run(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from sim_bugs import lease

    seed = next(s for s in range(200) if not sim.run(lease.buggy, world_size=3, seed=s, trace=False).ok)
    monkeypatch.setenv("SIM_BUG", "lease_without_fencing")
    code, out = cli(capsys, "run", "-n", "3", BY_NAME, "--seed", str(seed))
    assert code == 1 and "explored:" in out and "two holders overlapped" in out
    digest = out.split("digest ")[1].split()[0]
    argv = _replay(out)
    assert "--no-explore" in argv and any(a in argv for a in ("--pause", "--straggler", "--clog"))
    code2, out2 = cli(capsys, *argv[3:])
    assert code2 == 1 and f"digest {digest}" in out2 and "explored:" not in out2


def test_no_explore_is_fixed_timing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli(capsys, "run", "-n", "4", RACE, "--seed", "1", "--no-explore")
    assert "explored:" not in out
    code2, out2 = cli(capsys, "run", "-n", "4", RACE, "--seed", "1")
    assert "explored:" in out2


def test_a_swarm_failure_replays_from_its_plan(capsys: pytest.CaptureFixture[str]) -> None:
    for seed in range(20):
        code, out = cli(capsys, "run", "-n", "4", RACE, "--seed", str(seed), "--swarm", "crash,partition")
        if code == 1:
            break
    else:
        raise AssertionError("no swarm seed broke the race example")
    assert "faults: " in out
    argv = _replay(out)
    assert "--swarm" not in argv and ("--crash" in argv or "--vanish" in argv or "--partition" in argv
                                      or "--one-way-partition" in argv)
    digest = out.split("digest ")[1].split()[0]
    code2, out2 = cli(capsys, *argv[3:])
    assert f"digest {digest}" in out2


@pytest.mark.parametrize("extra", [[], ["--swarm"], ["--swarm", "restart,pause", "--store-host", "separate"]])
def test_check_determinism_holds_with_exploration_and_swarm(extra: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "4", RACE, "--seed", "7", "--check-determinism",
                           *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "determinism check: ok" in proc.stdout, proc.stdout + proc.stderr


def test_the_store_host_option_and_a_crash_of_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli(capsys, "run", "-n", "3", RACE, "--seed", "0", "--no-explore", "--store-host", "separate",
                    "--crash", "store@0.002")
    assert code == 1 and "crash store@0.002" in out  # the store died under the ranks
    replay = " ".join(_replay(out))
    assert "--store-host separate" in replay and "--crash store@0.002" in replay
    code = main(["run", "-n", "3", RACE, "--seed", "0", "--crash", "store@0.002"])
    assert code == 2 and "exists only with store_host='separate'" in capsys.readouterr().err


def test_a_sweeps_replay_lines_spell_the_plan_out_and_replay_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli(capsys, "run", "-n", "4", RACE, "--seeds", "0:12", "-q")
    assert code == 1
    argv = shlex.split(out.split("Replay the first with:")[1].strip().splitlines()[0])
    assert "--no-explore" in argv
    seed = int(argv[argv.index("--seed") + 1])
    code2, out2 = cli(capsys, *argv[3:])
    code3, out3 = cli(capsys, "run", "-n", "4", RACE, "--seed", str(seed))
    assert code2 == code3 == 1
    assert out2.split("digest ")[1].split()[0] == out3.split("digest ")[1].split()[0]


def test_faults_on_one_trigger_act_in_the_command_lines_order_as_in_the_api(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI grouped faults by flag (every --pause before every --clog), so a printed replay command
    that listed a clog first ran another plan than the run it came from."""
    sys.path.insert(0, str(ROOT / "tests"))
    import sim_sends

    clog = sim.Clog((1, 2), on=sim.MessageSent(rank=1, n=10), duration=0.01)
    pause = sim.Pause(1, on=sim.MessageSent(rank=1, n=10), duration=0.005)
    api = {order: sim.run(sim_sends.main, world_size=3, seed=0, explore=False, faults=list(faults)).digest
           for order, faults in (("clog first", (clog, pause)), ("pause first", (pause, clog)))}
    assert api["clog first"] != api["pause first"]  # (the order matters here)
    program = str(ROOT / "tests" / "sim_sends.py")
    flags = {"clog first": [*shlex.split(clog.to_cli()), *shlex.split(pause.to_cli())],
             "pause first": [*shlex.split(pause.to_cli()), *shlex.split(clog.to_cli())]}
    for order, extra in flags.items():
        code, out = cli(capsys, "run", "-n", "3", program, "--seed", "0", "--no-explore", *extra)
        assert code == 0 and f"digest {api[order]}" in out, (order, out)


REPLAYED = ["tight_receive_timeout", "lease_without_fencing", "split_brain", "restart_amnesia/blind_row_totals",
            "blind_split_brain_log_server"]


@pytest.mark.parametrize("name", REPLAYED)
def test_every_failing_seeds_printed_command_replays_it(name: str, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The printed command of each failing seed (exploration, and a swarm for the fault classes) gives its digest."""
    from sim_bugs import BLIND, CATALOG, VARIANTS

    bc = {b.name: b for b in CATALOG + VARIANTS + BLIND}[name]
    monkeypatch.setenv("SIM_BUG", name)
    program = BY_NAME
    replayed = 0
    for seed in range(20):
        code, out = cli(capsys, "run", "-n", str(bc.world_size), program, "--seed", str(seed),
                        *(["--swarm"] if bc.swarm else []))
        if code != 1:
            continue
        digest = out.split("digest ")[1].split()[0]
        code2, out2 = cli(capsys, *_replay(out)[3:])
        assert code2 == 1 and f"digest {digest}" in out2, (seed, _replay(out))
        replayed += 1
    assert replayed >= 1, f"{name}: no failing seed in 20"
