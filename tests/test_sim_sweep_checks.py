"""sim.sweep's own checks: the results file's sweep key, odd files, seeds, keywords, threads, Ctrl-C, wall-clock limit.

(Blind probe of sweeps, findings 1, 3, 5, 6, 9, 10.)
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import multiprocessing.connection
import os
import signal
import time
import tempfile
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import sim
from sim.pytest_plugin import run_seeds
from sim.sweep import RunSeed, drive, process_executor, read_records


async def _passes() -> int:
    return 1


async def _fails() -> None:
    raise AssertionError("always")


async def _also_passes() -> int:
    return 2


def test_records_carry_the_sweeps_key_and_another_sweeps_file_is_refused(tmp_path: Path) -> None:
    # Before: resume matched records by seed only: another program's passing records made this one "pass".
    out = tmp_path / "r.jsonl"
    first = sim.sweep(_passes, seeds=range(3), world_size=2, jobs=1, out=out)
    assert first.ok and all(r["key"] for r in read_records(out))
    again = sim.sweep(_passes, seeds=range(4), world_size=2, jobs=1, out=out)
    assert again.skipped == 3 and len(read_records(out)) == 4  # the same sweep: resumed
    others: list[tuple[Any, dict[str, Any]]] = [(_fails, {}), (_also_passes, {}), (_passes, {"world_size": 3}),
                                                (_passes, {"explore": False})]
    for main, kwargs in others:
        with pytest.raises(sim.SweepFileError, match="another sweep.*delete"):
            sim.sweep(main, seeds=range(3), jobs=1, out=out, **{"world_size": 2, **kwargs})
    assert len(read_records(out)) == 4  # nothing was run or written


def test_a_file_of_records_without_a_key_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "old.jsonl"
    out.write_text(json.dumps({"seed": 0, "ok": True, "failures": []}) + "\n")
    with pytest.raises(sim.SweepFileError, match="without a sweep key"):
        sim.sweep(_passes, seeds=range(2), world_size=2, jobs=1, out=out)


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe\x00junk\x80", "not text"),
    (b'{"seed": 0, "ok": false}\n', "without its 'failures'"),
    (b'{"seed": "x", "ok": true}\n', "no integer 'seed'"),
])
def test_odd_results_files_are_refused_before_anything_runs(tmp_path: Path, content: bytes, says: str) -> None:
    # Before: UnicodeDecodeError, or a KeyError after the whole sweep ran.
    out = tmp_path / "odd.jsonl"
    out.write_bytes(content)
    ran: list[int] = []
    with pytest.raises(sim.SweepFileError, match=says):
        drive(lambda s: ran.append(s) or {"seed": s, "ok": True}, [0, 1], executor=None, out=out, key="k")
    assert ran == [] and out.read_bytes() == content


def test_a_directory_is_refused_and_a_missing_directory_is_made(tmp_path: Path) -> None:
    with pytest.raises(sim.SweepFileError, match="is a directory"):
        sim.sweep(_passes, seeds=[0], world_size=2, jobs=1, out=tmp_path)
    out = tmp_path / "new" / "dir" / "r.jsonl"
    assert sim.sweep(_passes, seeds=[0], world_size=2, jobs=1, out=out).ok and len(read_records(out)) == 1


def test_a_file_another_sweep_writes_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "busy.jsonl"
    with open(out, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # (as a sweep writing it holds it)
        with pytest.raises(sim.SweepFileError, match="another sweep is writing"):
            sim.sweep(_passes, seeds=[0], world_size=2, jobs=1, out=out)


def test_seeds_empty_refused_and_duplicates_run_once() -> None:
    with pytest.raises(ValueError, match="no seeds"):
        sim.sweep(_passes, seeds=[], world_size=2, jobs=1)
    with pytest.raises(TypeError, match="iterable of ints"):
        sim.sweep(_passes, seeds=3, world_size=2, jobs=1)  # type: ignore[arg-type]
    report = sim.sweep(_passes, seeds=[1, 1, 1], world_size=2, jobs=1)
    assert [r["seed"] for r in report.records] == [1] and report.total == 1


def test_pytest_plugin_with_no_seeds_fails() -> None:
    with pytest.raises(pytest.fail.Exception, match="no seeds"):
        run_seeds(_passes, seeds=[], world_size=2)


def test_a_bad_keyword_is_a_type_error_before_anything_runs() -> None:
    # Before: "the sweep lost its worker ... (a worker that died: out of memory or killed?)".
    with pytest.raises(TypeError, match="bogus_kw"):
        sim.sweep(_passes, seeds=range(2), world_size=2, jobs=2, bogus_kw=1)


def _raises_on_1(seed: int) -> dict[str, Any]:
    if seed == 1:
        raise TypeError("a task's own bug")
    return {"seed": seed, "ok": True}


def test_an_exception_a_task_raises_is_reported_as_itself() -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        with pytest.raises(TypeError, match="a task's own bug") as info:
            drive(_raises_on_1, [0, 1, 2], executor=ex, window=1)
    assert not isinstance(info.value, sim.SweepWorkerError)
    assert any("seed 1" in note for note in getattr(info.value, "__notes__", []))


# ----------------------------------------------------------------------------- threads


def _interleaved(make_a: Any, make_b: Any) -> None:
    """Run two runs in two threads so the first to start ends first (not last): A starts, B starts, A ends, B ends."""
    a_started, b_started, a_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def main_a() -> None:
        print("printed by A")
        a_started.set()
        assert b_started.wait(60)

    async def main_b() -> None:
        assert a_started.wait(60)
        b_started.set()
        assert a_done.wait(60)
        print("printed by B")

    def in_a() -> None:
        try:
            make_a(main_a)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            a_started.set()
            a_done.set()

    def in_b() -> None:
        try:
            make_b(main_b)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            b_started.set()

    threads = [threading.Thread(target=in_a), threading.Thread(target=in_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_quiet_runs_in_threads_restore_stdout_and_keep_their_own_capture(capsys: pytest.CaptureFixture[str]) -> None:
    # Before: redirect_stdout in each thread: the caller's sys.stdout was left a StringIO (later prints vanished).
    before = sys.stdout
    _interleaved(lambda m: RunSeed(m, 1, quiet=True)(0), lambda m: RunSeed(m, 1, quiet=True)(0))
    assert sys.stdout is before
    print("the caller prints again")
    out = capsys.readouterr().out
    assert "the caller prints again" in out and "printed by" not in out


def test_a_sweep_on_a_thread_pool_gives_the_same_records_and_restores_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = sys.stdout
    here = sim.sweep(_two_ways, seeds=range(6), world_size=2, jobs=1)
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        threaded = sim.sweep(_two_ways, seeds=range(6), world_size=2, executor=ex)
    assert sys.stdout is before
    assert [(r["digest"], r["ok"]) for r in threaded.records] == [(r["digest"], r["ok"]) for r in here.records]
    assert "noise" not in capsys.readouterr().out


async def _two_ways() -> None:
    import asyncio
    import random
    print("noise")
    await asyncio.sleep(random.random())
    assert random.random() < 0.5


# ----------------------------------------------------------------------------- Ctrl-C and stuck seeds


def _interrupt_at_2(seed: int) -> dict[str, Any]:
    if seed == 2:
        raise KeyboardInterrupt
    return {"seed": seed, "ok": True}


def test_ctrl_c_stops_a_sweep_saying_what_was_saved_and_what_ran(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with pytest.raises(sim.SweepInterrupted) as info:
        drive(_interrupt_at_2, list(range(5)), executor=None, out=out, key="k")
    assert (info.value.saved, info.value.running) == (2, [2])
    assert isinstance(info.value, KeyboardInterrupt)
    assert [r["seed"] for r in read_records(out)] == [0, 1]


def _sigint_disposition(_: int) -> Any:
    return signal.getsignal(signal.SIGINT)


def _ignore_sigterm(_: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _spin(_: int, started: str = "") -> None:
    if started:
        Path(started).write_text("spinning")
    while True:
        pass


def test_local_workers_leave_ctrl_c_to_the_driver_which_ends_them() -> None:
    from sim.sweep import stop_executor

    ex = process_executor(1)
    assert ex.submit(_sigint_disposition, 0).result() == signal.SIG_IGN  # (no KeyboardInterrupt traceback per worker)
    ex.submit(_ignore_sigterm, 0).result()  # (a program's own handler, or one a forked worker inherited)
    started = Path(tempfile.mkdtemp()) / "started"
    stuck = ex.submit(_spin, 0, str(started))
    for _ in range(600):  # (bounded: up to 60 s on a loaded machine)
        if started.exists():
            break
        time.sleep(0.1)
    assert started.exists()  # it runs: shutting down cannot just drop it from the queue
    procs = list(ex._processes.values())  # type: ignore[attr-defined]
    stop_executor(ex, now=True)  # (returns: a plain shutdown would wait for the spinning seed forever)
    # Ended: their sentinels are ready (is_alive() can lag while the executor's thread reaps them: a full-suite
    # run saw it True once).
    assert len(multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0)) == len(procs)


async def _spins() -> None:
    if os.environ["RANK"] == "1":
        while True:
            pass


def test_seed_timeout_reports_a_stuck_seed_as_its_own_kind_and_does_not_save_it(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    report = sim.sweep(_spins, seeds=[0], world_size=2, jobs=1, out=out, seed_timeout=0.3)
    [rec] = report.records
    assert rec["ok"] is False and rec["failures"][0]["kind"] == "wall_clock_limit"
    assert rec["signature"].startswith("wall_clock_limit at test_sim_sweep_checks.py:")
    assert read_records(out) == []  # (not deterministic: a resume runs it again)
    with concurrent.futures.ThreadPoolExecutor(1) as ex, pytest.raises(ValueError, match="local worker processes"):
        sim.sweep(_spins, seeds=[0], world_size=2, executor=ex, seed_timeout=1)


class _Finished(concurrent.futures.Executor):
    """Runs each task as it is submitted: every seed has finished by the time the driver looks."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(fn(*args, **kwargs))
        return fut


def test_fail_fast_keeps_the_seeds_that_finished_alongside_the_failing_one(tmp_path: Path) -> None:
    # Before (sweep probe): with more than one worker, seeds finished next to the first failure were dropped:
    # neither reported nor in the results file, so a resume ran them again.
    def task(seed: int) -> dict[str, Any]:
        return {"seed": seed, "ok": seed != 0, "failures": [] if seed else [{"kind": "exception"}]}

    out = tmp_path / "r.jsonl"
    report = drive(task, [0, 1, 2, 3, 4, 5, 6, 7, 8], executor=_Finished(), fail_fast=True, window=4, out=str(out))
    assert report.stopped and [r["seed"] for r in report.records] == [0, 1, 2, 3]
    assert sorted(r["seed"] for r in read_records(out)) == [0, 1, 2, 3]
