"""python -m sim run --seeds: usage errors up front (exit 2), resume keys, output, Ctrl-C, executors, pipes.

(Blind probe of sweeps, findings 1, 3, 5-10, 14-19, 22.)
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sim import cli
from sim.cli import main
from sim.sweep import read_records

PASSES = "import os\n\nasync def main():\n    print('hello from', os.environ['RANK'])\n"
FAILS = ("import os\n\nasync def main():\n    for i in range(100):\n        print('line', i)\n"
         "    assert os.environ['RANK'] != '1', 'rank 1 fails'\n")
SPINS = "import os\n\nasync def main():\n    if os.environ['RANK'] == '1':\n        while True:\n            pass\n"


def prog(tmp_path: Path, text: str, name: str = "prog.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, expect exit status 2 (a usage error, argparse's or sim's) and no traceback; return stderr."""
    try:
        code = main(list(argv))
    except SystemExit as e:  # (argparse)
        code = e.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    return err


def test_resume_reuses_only_records_of_the_same_program_and_options(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: records matched by seed only: the failing program, after cp over the passing one, "passed".
    path = prog(tmp_path, PASSES)
    out = str(tmp_path / "r.jsonl")
    assert main(["run", "-n", "2", path, "--seeds", "0:3", "-j", "1", "-q", "--out", out]) == 0
    assert main(["run", "-n", "2", path, "--seeds", "0:4", "-j", "1", "-q", "--out", out]) == 0
    assert "3 seeds were already in" in capsys.readouterr().out
    for argv in (["-n", "3"], ["--no-explore"], ["--swarm", "crash"], ["--crash", "1@0.5"], ["--", "arg"]):
        err = usage_error(capsys, "run", "-n", "2", path, "--seeds", "0:3", "-j", "1", "-q", "--out", out, *argv)
        assert "holds records of another sweep" in err and "delete" in err
    monkeypatch.chdir(tmp_path)  # the same program spelled another way: the same sweep
    assert main(["run", "-n", "2", "prog.py", "--seeds", "0:4", "-j", "1", "-q", "--out", out]) == 0
    assert "4 seeds were already in" in capsys.readouterr().out
    Path(path).write_text(FAILS)  # the same path, edited
    assert "another sweep" in usage_error(capsys, "run", "-n", "2", path, "--seeds", "0:3", "-j", "1", "--out", out)
    assert len(read_records(out)) == 4


@pytest.mark.parametrize("content, says", [(b"\x80\x81junk", "not text"), (b'{"seed": 0, "ok": false}\n', "failures")])
def test_odd_results_files_are_usage_errors_before_the_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             content: bytes, says: str) -> None:
    out = tmp_path / "odd.jsonl"
    out.write_bytes(content)
    err = usage_error(capsys, "run", "-n", "2", prog(tmp_path, PASSES), "--seeds", "0:2", "-j", "1", "--out", str(out))
    assert says in err
    assert usage_error(capsys, "run", "-n", "2", prog(tmp_path, PASSES), "--seeds", "0:2", "-j", "1",
                       "--out", str(tmp_path)).count("is a directory") == 1


@pytest.mark.parametrize("seeds", ["10:0", "5:5", "0:-1", "", "0:3:1", "a,b"])
def test_empty_or_bad_seed_ranges_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], seeds: str) -> None:
    # Before: "all 0 seeds passed", exit 0.
    err = usage_error(capsys, "run", "-n", "2", prog(tmp_path, PASSES), "--seeds", seeds, "-j", "1")
    assert "--seeds" in err and "parse_seeds" not in err


def test_duplicate_seeds_run_once_and_jobs_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    assert main(["run", "-n", "2", prog(tmp_path, PASSES), "--seeds", "1,1,1", "-j", "1", "-q", "--out", str(out)]) == 0
    assert [r["seed"] for r in read_records(out)] == [1]
    capsys.readouterr()
    for jobs in ("0", "-3"):
        assert "at least 1" in usage_error(capsys, "run", "-n", "2", prog(tmp_path, PASSES), "--seeds", "0:2",
                                           "-j", jobs)


def test_values_say_why_they_are_wrong_and_swarm_does_not_eat_the_program(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = prog(tmp_path, PASSES)
    err = usage_error(capsys, "run", "-n", "2", path, "--pause", "1@0.1")
    assert "expected RANK@WHEN+SECONDS" in err and "parse_pause" not in err
    assert "parse_" not in usage_error(capsys, "run", "-n", "2", path, "--latency", "foo")
    assert main(["run", "-n", "2", "--swarm", path, "--seeds", "0:2", "-j", "1", "-q"]) in (0, 1)
    assert "seeds" in capsys.readouterr().out


def test_a_missing_program_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no such program file" in usage_error(capsys, "run", "-n", "2", str(tmp_path / "missing.py"))


def test_out_needs_a_sweep_and_seed_timeout_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: --out with --seed was silently ignored.
    path = prog(tmp_path, PASSES)
    assert "--seeds" in usage_error(capsys, "run", "-n", "2", path, "--seed", "3", "--out", str(tmp_path / "x.jsonl"))
    assert not (tmp_path / "x.jsonl").exists()
    assert "--seeds" in usage_error(capsys, "run", "-n", "2", path, "--seed", "3", "--seed-timeout", "5")


def test_an_unwritable_trace_path_is_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the whole run, then a FileNotFoundError traceback and no verdict; a sweep blamed a dead worker.
    path = prog(tmp_path, PASSES)
    for argv in (["--seed", "0"], ["--seeds", "0:2", "-j", "1"]):
        err = usage_error(capsys, "run", "-n", "2", path, *argv, "--trace", "/proc/nope/x.json")
        assert "cannot write --trace /proc/nope/x.json" in err and "hello" not in err
    trace = tmp_path / "made" / "t.json"
    assert main(["run", "-n", "2", path, "--seed", "0", "-q", "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())["traceEvents"]


def test_bad_executors_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: tracebacks; dask:local:0 waited forever.
    path = prog(tmp_path, PASSES)
    for spec, says in (("json:nosuch", "module json has no nosuch"), ("nomod_xyz:f", "cannot import nomod_xyz"),
                       ("os:getpid", "returned int, not a concurrent.futures.Executor"),
                       ("dask:local:0", "at least 1 worker"), ("dask:local:x", "not a number of workers"),
                       ("bogus", "unknown --executor")):
        assert says in usage_error(capsys, "run", "-n", "2", path, "--seeds", "0:2", "--executor", spec)


def test_a_thread_pool_executor_prints_the_report_and_restores_stdout(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # Before: in about 2 runs of 3 nothing was printed (stdout left redirected by a finished seed's thread).
    before = sys.stdout
    code = main(["run", "-n", "2", prog(tmp_path, FAILS), "--seeds", "0:6", "--executor",
                 "concurrent.futures:ThreadPoolExecutor", "-q"])
    assert sys.stdout is before
    out = capsys.readouterr().out
    assert code == 1 and "6 of 6 seeds failed" in out and "AssertionError at prog.py:6 in main" in out


def test_a_sweep_shows_the_last_lines_a_failing_seed_printed_not_every_seeds_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: every seed's output, unlabeled (800,002 lines for 10 seeds of a loud program).
    assert main(["run", "-n", "2", prog(tmp_path, FAILS), "--seeds", "0:4", "-j", "1"]) == 1
    out = capsys.readouterr().out
    assert out.count("what it printed last:") == 1  # the first seed of the one kind of failure
    assert "]: line 99" in out and "]: line 0\n" not in out and "earlier lines" in out
    assert len(out.splitlines()) < 40
    assert main(["run", "-n", "2", prog(tmp_path, PASSES, "ok.py"), "--seeds", "0:4", "-j", "1"]) == 0
    assert "hello" not in capsys.readouterr().out


def test_fail_fast_says_it_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-n", "2", prog(tmp_path, FAILS), "--seeds", "0:50", "-j", "1", "-q", "--fail-fast"]) == 1
    assert "1 of 1 seeds failed (--fail-fast: stopped there; 49 of the 50 seeds not run)" in capsys.readouterr().out


def test_ctrl_c_says_what_was_saved_and_what_still_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: a 29-line KeyboardInterrupt traceback, nothing about the results file.
    real = cli.CliSeed.__call__

    def interrupted_at_2(self: Any, seed: int) -> dict[str, Any]:
        if seed == 2:
            raise KeyboardInterrupt
        return real(self, seed)

    monkeypatch.setattr(cli.CliSeed, "__call__", interrupted_at_2)
    out = tmp_path / "r.jsonl"
    path = prog(tmp_path, PASSES)
    assert main(["run", "-n", "2", path, "--seeds", "0:5", "-j", "1", "-q", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"2 new seeds finished and saved in {out}; rerun the same command to resume" in err
    assert "not finished (running or queued): 2;" in err and f"-n 2 {path} --seed 2" in err
    assert "Traceback" not in err


def test_seed_timeout_stops_a_seed_stuck_in_python_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.jsonl"
    code = main(["run", "-n", "2", prog(tmp_path, SPINS), "--seeds", "0:2", "-j", "1", "-q", "--seed-timeout", "0.3",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 1 and "2 x wall_clock_limit at prog.py:5 in main" in text and "not deterministic" in text
    assert read_records(out) == []
    assert "local worker processes" in usage_error(capsys, "run", "-n", "2", prog(tmp_path, SPINS), "--seeds", "0:2",
                                                   "--executor", "concurrent.futures:ThreadPoolExecutor",
                                                   "--seed-timeout", "1")


def test_a_second_sweep_on_the_same_file_at_once_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    out = tmp_path / "r.jsonl"
    with open(out, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert "another sweep is writing" in usage_error(capsys, "run", "-n", "2", prog(tmp_path, PASSES), "--seeds",
                                                         "0:2", "-j", "1", "--out", str(out))


class _ClosedPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_ends_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: `| head` ended with a BrokenPipeError traceback.
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["run", "-n", "2", prog(tmp_path, PASSES), "--seed", "0"]) == 1
