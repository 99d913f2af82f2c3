"""Seed sweeps: executors (local processes, a Dask cluster), streamed and resumed results, readable reports."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import pytest

import aiodist
import sim
from sim.cli import main as cli_main
from sim.sweep import Progress, read_records

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import sim_race  # noqa: E402

SEEDS = range(0, 40)


@pytest.fixture(scope="module")
def expected() -> dict[int, bool]:
    return {s: sim.run(sim_race.main, world_size=4, seed=s, trace=False).ok for s in SEEDS}


def test_sweep_on_local_processes_streams_records_and_resumes(tmp_path: Path, expected: dict[int, bool]) -> None:
    out = tmp_path / "results.jsonl"
    first = sim.sweep(sim_race.main, seeds=range(0, 25), world_size=4, jobs=2, out=out)
    assert {r["seed"]: r["ok"] for r in first.records} == {s: expected[s] for s in range(25)}
    assert len(read_records(out)) == 25
    with open(out, "a") as f:
        f.write('{"seed": 99, "ok": tr')  # a sweep killed while writing: the torn line is ignored
    again = sim.sweep(sim_race.main, seeds=SEEDS, world_size=4, jobs=2, out=out)
    assert again.skipped == 25
    assert {r["seed"]: r["ok"] for r in again.records} == expected
    assert sorted(r["seed"] for r in read_records(out)) == list(SEEDS)  # each seed once
    assert again.failing == [s for s in SEEDS if not expected[s]]
    [group] = again.groups
    assert group.signature == "AssertionError at sim_race.py:46 in main"
    assert group.count == len(again.failing) and group.first_seed == again.failing[0]


def test_sweep_on_a_dask_cluster_gives_the_same_records(expected: dict[int, bool]) -> None:
    seeds = [s for s in SEEDS if not expected[s]][:2] + [s for s in SEEDS if expected[s]][:3]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cluster, distributed.Client(cluster) as client:
        report = sim.sweep(sim_race.main, seeds=seeds, world_size=4, executor=client.get_executor())
    here = sim.sweep(sim_race.main, seeds=seeds, world_size=4, jobs=1)
    assert [r["digest"] for r in report.records] == [r["digest"] for r in here.records]
    assert report.failing == sorted(seeds[:2])


async def _two_bugs() -> Any:
    rank = int(os.environ["RANK"])
    seed_ish = int(os.environ["AIODIST_SECRET"][:4], 16)  # differs per seed: picks which bug shows
    await asyncio.sleep(0.001)
    if rank == 1 and seed_ish % 3 == 0:
        raise KeyError("first bug")
    if rank == 2 and seed_ish % 3 == 1:
        raise ValueError("second bug")
    return rank


def test_failures_are_grouped_by_exception_type_and_the_programs_line() -> None:
    report = sim.sweep(_two_bugs, seeds=range(30), world_size=3, jobs=1)
    by_sig = {g.signature: g for g in report.groups}
    line = _two_bugs.__code__.co_firstlineno
    assert set(by_sig) == {f"KeyError at test_sim_sweep.py:{line + 5} in _two_bugs",
                           f"ValueError at test_sim_sweep.py:{line + 7} in _two_bugs"}
    assert sum(g.count for g in report.groups) == len(report.failing)
    for g in report.groups:
        assert g.first_seed == min(g.seeds)
    text = report.summary(replay=lambda s: f"replay {s}")
    assert "2 distinct failures" in text and f"replay {report.failing[0]}" in text


PROGRAM = '''
import asyncio, logging, os

async def main():
    print("hello from", os.environ["RANK"])
    try:
        raise RuntimeError("handled")
    except RuntimeError:
        logging.getLogger("aiodist.flight").warning("rank %s: RuntimeError: handled; in flight: nothing",
                                                    os.environ["RANK"])
    await asyncio.sleep(0.001)
    if os.environ["RANK"] == "1" and os.environ["AIODIST_SECRET"][0] in "0123":
        raise ValueError("unlucky")
'''


@pytest.fixture()
def program(tmp_path: Path) -> str:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return str(path)


def test_cli_sweep_prints_no_log_records_and_q_drops_program_output(program: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["run", "-n", "2", program, "--seeds", "0:12", "-j", "1"])  # (here: capsys sees its output)
    out, err = capsys.readouterr()
    assert err == ""  # the error the program handled is not reported seed after seed
    assert "[rank0]: hello from 0" in out
    assert code == 1 and "distinct failure" in out and "ValueError at prog.py:" in out
    cli_main(["run", "-n", "2", program, "--seeds", "0:12", "-q", "-j", "1"])
    quiet = capsys.readouterr().out
    assert "hello from" not in quiet and "seeds failed" in quiet
    cli_main(["run", "-n", "2", program, "--seed", "0", "-q"])
    assert "hello from" not in capsys.readouterr().out


def test_cli_sweep_writes_a_trace_per_failing_seed(program: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "t.json"
    code = cli_main(["run", "-n", "2", program, "--seeds", "0:12", "-q", "--trace", str(base), "--out",
                     str(tmp_path / "r.jsonl")])
    assert code == 1
    records = read_records(tmp_path / "r.jsonl")
    failing = sorted(r["seed"] for r in records if not r["ok"])
    assert failing
    written = sorted(p.name for p in tmp_path.glob("t-seed*.json"))
    assert written == sorted(f"t-seed{s}.json" for s in failing)
    trace = json.loads((tmp_path / f"t-seed{failing[0]}.json").read_text())
    assert any(e.get("name") == "exit" for e in trace["traceEvents"])


def test_progress_line_on_a_terminal_only(program: str, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    line = Progress(100).line(4.0)
    assert line == "0/100 seeds, 0 failed, 0.0 seeds/s, ETA ?"
    p = Progress(100, stream=io.StringIO())
    for _ in range(10):
        p.update({"ok": True})
    assert p.line(5.0) == "10/100 seeds, 0 failed, 2.0 seeds/s, ETA 45s"

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    cli_main(["run", "-n", "2", program, "--seeds", "0:3"])
    assert "3/3 seeds" in term.getvalue()
    capsys.readouterr()
    cli_main(["run", "-n", "2", program, "--seeds", "0:3"])  # (capsys' stderr: not a terminal)


# ----------------------------------------------------------------------------- the program's own lines


async def _stuck() -> Any:
    await aiodist.init_process_group()
    if aiodist.get_rank() == 0:
        await aiodist.recv(np.empty(1), src=1)  # nobody sends: the line a deadlock report must name
    else:
        await asyncio.sleep(1000)  # (rank 1 stays: a rank that left would fail the receive, "left the job")
    await aiodist.destroy_process_group()


def test_blocked_ranks_are_reported_at_the_programs_line() -> None:
    res = sim.run(_stuck, world_size=2, seed=0, time_limit=50)
    assert not res.ok
    where = res.failures[0].where[0]
    line = _stuck.__code__.co_firstlineno + 3
    assert where.endswith(f"test_sim_sweep.py:{line} in _stuck"), where


def test_exceptions_are_located_at_the_programs_line() -> None:
    async def main() -> Any:
        await aiodist.init_process_group()
        await aiodist.all_reduce(np.ones(2), group=object())  # type: ignore[arg-type]

    res = sim.run(main, world_size=2, seed=0)
    failure = res.failures[0]
    assert failure.kind == "exception" and "TypeError" in failure.message
    assert failure.location.endswith(f"test_sim_sweep.py:{main.__code__.co_firstlineno + 2} in main")
    assert "raised at tests/test_sim_sweep.py:" in str(failure) or "raised at " in str(failure)


def test_perfetto_flows_are_balanced_and_arguments_are_json_values(tmp_path: Path) -> None:
    from sim.trace import write_chrome

    async def main() -> Any:
        await aiodist.init_process_group(timeout=5)
        for _ in range(20):
            await aiodist.all_reduce(np.ones(8))
        await aiodist.destroy_process_group()

    res = sim.run(main, world_size=4, seed=1, faults=[sim.Crash(2, at=0.004)], stop_on_error=False,
                  explore=False)  # (fixed timing: the crash comes mid-collectives)
    out = tmp_path / "t.json"
    write_chrome(res.trace, str(out), ops=res.ops)
    data = json.loads(out.read_text())["traceEvents"]
    starts = sorted(e["id"] for e in data if e.get("ph") == "s")
    ends = sorted(e["id"] for e in data if e.get("ph") == "f")
    assert starts and starts == ends  # every flow that starts ends (a crash leaves messages undelivered)
    sends = [e["args"]["header"] for e in data if e.get("name") == "send"]
    assert any(isinstance(h, dict) and h.get("t") for h in sends)  # the header itself, not its repr
    spans = [e for e in data if e.get("ph") == "X" and e["name"] == "all_reduce"]
    assert spans and all(isinstance(e["args"].get("seq"), int) for e in spans)


def test_a_cli_sweep_runs_in_local_worker_processes_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import concurrent.futures

    from sim import cli

    monkeypatch.setattr(cli.os, "cpu_count", lambda: 4)
    ex, owned = cli._executor(argparse.Namespace(jobs=None, executor=None))
    try:
        assert isinstance(ex, concurrent.futures.ProcessPoolExecutor) and owned is ex
        assert ex._max_workers == 4
    finally:
        ex.shutdown()
    assert cli._executor(argparse.Namespace(jobs=1, executor=None)) == (None, None)  # -j 1: here
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 1)
    assert cli._executor(argparse.Namespace(jobs=None, executor=None)) == (None, None)  # one CPU: here


def _dies_on_seed_2(seed: int) -> dict[str, Any]:
    if seed == 2:
        os._exit(9)  # the worker process dies (as when it runs out of memory and is killed)
    return {"seed": seed, "ok": True}


def test_a_worker_that_dies_is_reported_with_the_seed_it_ran(tmp_path: Path) -> None:
    # Before: the sweep ended with a bare BrokenProcessPool traceback, naming no seed.
    from sim.sweep import drive, process_executor

    out = tmp_path / "records.jsonl"
    with process_executor(2) as executor:
        with pytest.raises(sim.SweepWorkerError) as info:
            drive(_dies_on_seed_2, list(range(6)), executor=executor, out=out, window=2)
    assert 2 in info.value.seeds and "seed(s)" in str(info.value) and "BrokenProcessPool" in str(info.value)
    assert {r["seed"] for r in read_records(out)} <= {0, 1, 3, 4, 5}  # what finished is kept (a resume skips it)
