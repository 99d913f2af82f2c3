"""What ``python -m sim run`` prints for a failing big run: rank-prefixed, folded, readable."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sim.cli import main
from sim.runner import Failure, _ranks_text

PROGRAM = '''
import asyncio, logging
from aiodist.context import getenv

async def main():
    rank = int(getenv("RANK"))
    await asyncio.sleep(0.001 * rank)
    logging.getLogger("aiodist.flight").warning("rank %d: PeerFailureError: rank 3 failed; in flight: nothing", rank)
    if rank == 0:
        logging.getLogger("aiodist.comm").error("something else")
    if rank != 3:
        raise ValueError(f"rank {rank} saw rank 3 fail")
'''


@pytest.fixture()
def program(tmp_path: Path) -> str:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return str(path)


def test_rank_log_records_are_prefixed_and_folded(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    aiodist_logger = logging.getLogger("aiodist")
    propagate = aiodist_logger.propagate
    code = main(["run", "-n", "24", program, "--keep-going", "--seed", "1"])
    captured = capsys.readouterr()
    assert code == 1
    err = captured.err.splitlines()
    # One line per kind of record (not one per rank), with the rank and the virtual time.
    assert err[0] == ("[rank 0 t=0.000000s] WARNING aiodist.flight: rank 0: PeerFailureError: rank 3 failed; "
                      "in flight: nothing")
    assert err[1] == "    ... and 23 more like it from ranks 1-23"
    assert err[2] == "[rank 0 t=0.000000s] ERROR aiodist.comm: something else"
    assert len(err) == 3
    assert aiodist_logger.propagate == propagate and not any(
        type(h).__name__ == "RankLogCollector" for h in aiodist_logger.handlers)  # restored after the run


def test_many_failures_and_tracebacks_are_folded(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "-n", "24", program, "--keep-going", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[exception] rank 0 at t=0.000000s: ValueError: rank 0 saw rank 3 fail" in out
    assert "    ... and 22 more like it (ranks 1, 2, 4-23)" in out
    assert out.count("Traceback (most recent call last)") == 1
    assert "(ranks 1, 2, 4-23 raised the same way)" in out
    assert "FAILED seed 1. Replay with:" in out


def test_quiet_sweeps_print_no_log_records(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-n", "4", program, "--seeds", "0:2", "-q"]) == 1
    assert capsys.readouterr().err == ""


def test_blocked_ranks_share_a_line_per_place_in_big_runs() -> None:
    small = Failure("deadlock", None, "deadlock", blocked={r: [{"op": "recv", "peer": 0}] for r in range(1, 4)})
    assert str(small).splitlines()[1:] == [f"    rank {r} blocked in: recv(peer=0)" for r in range(1, 4)]
    blocked = {r: [{"op": "recv", "peer": 0}] for r in range(1, 40)}
    blocked[7] = [{"op": "barrier", "seq": 2}]
    big = Failure("deadlock", None, "deadlock", blocked=blocked)
    assert str(big).splitlines()[1:] == [
        "    38 ranks (1-6, 8-39) blocked in: recv(peer=0)",
        "    rank 7 blocked in: barrier(seq=2)",
    ]


def test_ranks_that_started_waiting_at_different_times_in_the_same_place_share_a_line() -> None:
    # Before: each rank's line showed its own start time, so no two matched: 58 lines for one failure of 64
    # ranks, 50 of them the same barrier at the same line.
    blocked = {r: [{"op": "barrier", "seq": 0, "start": 0.5 + r / 1000}] for r in range(40)}
    blocked[7] = [{"op": "barrier", "seq": 0, "start": 0.3}, {"op": "store.get", "key": "k", "start": 0.9}]
    big = Failure("deadlock", None, "deadlock", blocked=blocked, where={r: "p.py:20 in main" for r in range(40)})
    assert str(big).splitlines()[1:] == [
        "    39 ranks (0-6, 8-39) blocked in: barrier(seq=0)  (p.py:20 in main) [since t=0.500000-0.539000s]",
        "    rank 7 blocked in: barrier(seq=0); store.get(key='k')  (p.py:20 in main) [since t=0.300000s]",
    ]


def test_when_a_rank_started_waiting_is_shown_to_nine_digits() -> None:
    # Before: repr, 17 digits ('start=0.40822581900721816').
    f = Failure("deadlock", None, "deadlock", blocked={1: [{"op": "barrier", "seq": 0, "start": 0.40822581900721816}]})
    assert str(f).splitlines()[1] == "    rank 1 blocked in: barrier(seq=0, start=0.408225819)"


def test_ranks_text() -> None:
    assert _ranks_text([]) == ""
    assert _ranks_text([5]) == "5"
    assert _ranks_text([7, 0, 2, 3, 4, 4]) == "0, 2-4, 7"
    assert _ranks_text([1, 2, 9, 10, 11]) == "1, 2, 9-11"


def test_quiet_on_one_seed_keeps_the_verdict_and_the_exception(program: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Before: -q printed nothing on a pass and only 'FAILED seed N. Replay with: ...' on a failure."""
    assert main(["run", "-n", "4", program, "--seed", "1", "-q"]) == 1
    out = capsys.readouterr().out
    assert "ValueError: rank 0 saw rank 3 fail" in out and "Traceback" in out and "FAILED seed 1" in out
    ok = tmp_path / "ok.py"
    ok.write_text("async def main():\n    print('from the program')\n")
    assert main(["run", "-n", "2", str(ok), "--seed", "0", "-q"]) == 0
    out = capsys.readouterr().out
    assert "seed 0: ok" in out and "from the program" not in out


@pytest.mark.parametrize("flag", ["--check-determinism", "--shrink"])
def test_one_seed_options_are_refused_with_a_sweep(program: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: silently ignored with --seeds (no check, no shrinking, no word)."""
    assert main(["run", "-n", "4", program, "--seeds", "0:2", flag]) == 2
    assert f"{flag} works on one seed (--seed N)" in capsys.readouterr().err


def test_a_restarted_rank_of_a_program_that_cannot_rejoin_is_told_it_is_a_restart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: 'two processes were given RANK=1 (or a process of an earlier run is still alive)'."""
    prog = tmp_path / "plain.py"
    prog.write_text("import aiodist\nasync def main():\n    await aiodist.init_process_group(timeout=20)\n"
                    "    await aiodist.barrier()\n    await aiodist.destroy_process_group()\n")
    assert main(["run", "-n", "2", str(prog), "--seed", "0", "--restart", "1@sent:4", "--no-explore"]) == 1
    out = capsys.readouterr().out
    assert "this process is a restart (AIODIST_RESTART_COUNT=1)" in out and "two processes" not in out


WARNS = '''
import sys, warnings
from aiodist.context import getenv

async def main():
    warnings.warn(f"rank {getenv('RANK')} is warned", UserWarning)
    print("to stderr", file=sys.stderr)
'''


def test_what_ranks_write_to_stderr_warnings_included_is_prefixed_with_the_rank(tmp_path: Path) -> None:
    # Before: warnings and stderr lines were printed raw (no way to tell which rank warned);
    # aiodist run prefixes both. (A fresh interpreter: pytest would catch the warnings.)
    import os
    import subprocess
    import sys

    path = tmp_path / "warns.py"
    path.write_text(WARNS)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    def stderr(*extra: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "2", str(path), "--seed", "0", *extra],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    err = stderr()
    for r in (0, 1):
        assert f"[rank{r}]: " in err and f"UserWarning: rank {r} is warned" in err, err
        assert f"[rank{r}]: to stderr" in err, err
    assert all(line.startswith("[rank") for line in err.splitlines() if "warn" in line or "to stderr" in line), err
    assert "warned" not in stderr("-q")  # -q: the program's own output, stderr too


def test_two_bugs_in_one_taskgroup_are_two_failures_at_their_own_lines(tmp_path) -> None:
    # Before: every seed was "ExceptionGroup at prog.py:<the async with line>": one group for two bugs.
    import asyncio

    import sim
    from sim.sweep import signature

    async def bug_a() -> None:
        raise ValueError("bug A")

    async def bug_b() -> None:
        raise KeyError("bug B")

    def program(which: int):
        async def main() -> None:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(bug_a() if which == 0 else bug_b())
        return main

    sigs = [signature(sim.run(program(w), world_size=1, seed=0).failures[0]) for w in (0, 1)]
    assert sigs[0].startswith("ValueError at test_sim_cli_output.py:") and "in bug_a" in sigs[0], sigs
    assert sigs[1].startswith("KeyError at test_sim_cli_output.py:") and "in bug_b" in sigs[1], sigs


def test_a_store_call_on_aiodists_own_keys_says_so() -> None:
    # blind24 probe, finding 4: a rank stuck in the rendezvous showed "store.get(key='aiodist/0/done')", a key
    # the program never named.
    f = Failure("deadlock", None, "deadlock", blocked={1: [{"op": "store.get", "key": "aiodist/0/done"}],
                                                       2: [{"op": "store.wait", "keys": ["mine"]}]})
    assert str(f).splitlines()[1:] == [
        "    rank 1 blocked in: store.get(key='aiodist/0/done') [aiodist's own key: the rendezvous or a group's "
        "bookkeeping]",
        "    rank 2 blocked in: store.wait(keys=['mine'])",
    ]
