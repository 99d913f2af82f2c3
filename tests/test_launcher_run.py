"""``aiodist run``: real child processes, in process through ``launch()`` and through the CLI."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aiodist.launch.cli import build_command
from aiodist.launch.env import RANK_ENV_NAMES
from aiodist.launch.supervisor import LaunchConfig, LaunchResult, launch

ROOT = Path(__file__).resolve().parents[1]

# The ranks below sleep 60 s unless stopped: a bound of 20 s on a run tells a stop from a wait
# with room for a loaded 2-core machine (starting 4 interpreters can take seconds there).


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class Run:
    """The outcome of one in-process launch, with the output split per stream."""

    def __init__(self, result: LaunchResult, out: bytes, err: bytes, logs: list[str], elapsed: float) -> None:
        self.result = result
        self.out = out.decode()
        self.err = err.decode()
        self.logs = logs
        self.elapsed = elapsed

    def lines(self, stream: str, rank: int) -> list[str]:
        tag = f"[rank{rank}]: "
        text = self.out if stream == "out" else self.err
        return [line[len(tag):] for line in text.splitlines() if line.startswith(tag)]


async def launch_source(tmp_path: Path, source: str, n: int, *, args: tuple[str, ...] = (), **options) -> Run:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(source))
    config = LaunchConfig(command=build_command(str(prog), list(args)), nproc_per_node=n, env=child_env(), **options)
    out, err, logs = io.BytesIO(), io.BytesIO(), []
    start = time.monotonic()
    async with asyncio.timeout(30):
        result = await launch(config, stdout=out, stderr=err, log=logs.append, handle_signals=False)
    return Run(result, out.getvalue(), err.getvalue(), logs, time.monotonic() - start)


# ------------------------------------------------------------------ environment & output


async def test_each_rank_sees_its_torchrun_environment(tmp_path: Path) -> None:
    names = list(RANK_ENV_NAMES)
    run = await launch_source(
        tmp_path,
        f"""
        import json, os, sys
        print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))
        print(json.dumps(sys.argv[1:]))
        """,
        3,
        args=("--flag", "v"),
        run_id="job42",
    )
    assert run.result.ok and run.result.attempts == 1
    envs = [json.loads(run.lines("out", r)[0]) for r in range(3)]
    for r, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(r)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["TORCHELASTIC_RESTART_COUNT"] == env["AIODIST_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == env["AIODIST_RUN_ID"] == "job42"
        assert json.loads(run.lines("out", r)[1]) == ["--flag", "v"]
    ports = {env["MASTER_PORT"] for env in envs}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536


async def test_second_node_numbering(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        "import os; print(os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'])",
        2,
        nnodes=2,
        node_rank=1,
        master_port=29511,
    )
    assert run.result.ok
    # output is tagged with the global rank
    assert run.lines("out", 2) == ["2 0 4 29511"]
    assert run.lines("out", 3) == ["3 1 4 29511"]


async def test_output_is_prefixed_per_stream_with_partial_last_line(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, sys
        r = os.environ["RANK"]
        for i in range(3):
            print(f"out {r}.{i}")
        print(f"err {r}", file=sys.stderr)
        sys.stdout.write("no newline " + r)
        """,
        2,
    )
    assert run.result.ok
    for r in range(2):
        assert run.lines("out", r) == [f"out {r}.0", f"out {r}.1", f"out {r}.2", f"no newline {r}"]
        assert run.lines("err", r) == [f"err {r}"]
    # every line carries a tag: nothing unprefixed slipped through
    assert all(line.startswith("[rank") for line in (run.out + run.err).splitlines())


# ------------------------------------------------------------------ failures


async def test_failing_rank_stops_the_others_and_is_named(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, sys, time
        if os.environ["RANK"] == "2":
            print("rank 2 gives up", file=sys.stderr, flush=True)
            sys.exit(7)
        print("sleeping", flush=True)
        time.sleep(60)
        """,
        4,
        grace_period=3.0,
    )
    assert run.elapsed < 20, run.elapsed
    assert run.result.exit_code == 7
    culprit = run.result.failures[0]
    assert (culprit.rank, culprit.returncode) == (2, 7)
    assert len(run.result.failures) == 1  # the stopped ranks are not reported as failures
    assert f"rank 2 (pid {culprit.pid}) failed with exit code 7" in run.logs
    assert run.lines("err", 2) == ["rank 2 gives up"]


async def test_rank_killed_by_signal_is_named(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, signal, time
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """,
        2,
    )
    assert run.elapsed < 20, run.elapsed
    assert run.result.exit_code == 128 + signal.SIGKILL
    culprit = run.result.failures[0]
    assert culprit.rank == 1 and culprit.returncode == -signal.SIGKILL
    assert f"rank 1 (pid {culprit.pid}) was killed by signal SIGKILL (9)" in run.logs


async def test_rank_ignoring_sigterm_is_killed_after_grace_period(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, signal, sys, time
        if os.environ["RANK"] == "0":
            time.sleep(0.3)
            sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
        """,
        2,
        grace_period=0.5,
    )
    assert run.result.failures[0].rank == 0 and run.result.exit_code == 1
    assert 0.5 < run.elapsed < 20, run.elapsed


async def test_max_restarts_restarts_the_job_which_then_succeeds(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, sys
        count = os.environ["TORCHELASTIC_RESTART_COUNT"]
        print("attempt", count, os.environ["AIODIST_RESTART_COUNT"], os.environ["TORCHELASTIC_MAX_RESTARTS"])
        if count == "0" and os.environ["RANK"] == "1":
            sys.exit(1)
        """,
        2,
        max_restarts=2,
    )
    assert run.result.ok and run.result.attempts == 2
    assert "restarting the job (restart 1 of 2)" in run.logs
    assert run.lines("out", 1) == ["attempt 0 0 2", "attempt 1 1 2"]


async def test_max_restarts_exhausted_fails(tmp_path: Path) -> None:
    run = await launch_source(tmp_path, "import sys; print('try'); sys.exit(5)", 1, max_restarts=1)
    assert run.result.exit_code == 5 and run.result.attempts == 2
    assert run.lines("out", 0) == ["try", "try"]
    assert sum(m.startswith("rank 0 ") for m in run.logs) == 2


async def test_job_timeout_stops_the_ranks(tmp_path: Path) -> None:
    run = await launch_source(tmp_path, "import time; time.sleep(60)", 2, timeout=0.5)
    assert run.result.timed_out and run.result.exit_code == 124
    assert run.elapsed < 20


async def test_uncaught_exception_traceback_is_shown_prefixed(tmp_path: Path) -> None:
    run = await launch_source(tmp_path, "raise RuntimeError('boom')", 1)
    assert run.result.exit_code == 1
    assert "RuntimeError: boom" in run.lines("err", 0)


# ------------------------------------------------------------------ module programs (async def main)


async def test_async_main_without_guard_runs_through_the_bootstrap(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import asyncio, os, sys
        async def main():
            await asyncio.sleep(0)
            print("main", os.environ["RANK"], sys.argv[1:], __name__, flush=True)
            return 42  # ignored: exit status stays 0
        """,
        2,
        args=("a",),
    )
    assert run.result.ok, run.err
    assert run.lines("out", 0) == ["main 0 ['a'] prog"]
    assert run.lines("out", 1) == ["main 1 ['a'] prog"]


async def test_async_main_that_raises_fails_the_rank(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os
        async def main():
            if os.environ["RANK"] == "1":
                raise ValueError("bad rank")
        """,
        2,
    )
    assert run.result.failures[0].rank == 1 and run.result.exit_code == 1
    assert "ValueError: bad rank" in run.lines("err", 1)


async def test_guarded_program_runs_main_exactly_once(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import asyncio
        async def main():
            print("ran")
        if __name__ == "__main__":
            asyncio.run(main())
        """,
        1,
    )
    assert run.result.ok and run.lines("out", 0) == ["ran"]


async def test_module_flag_runs_async_main_of_a_module(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import os\nasync def main():\n    print('job', os.environ['RANK'])\n")
    config = LaunchConfig(
        command=build_command("mypkg.job", ["z"], module=True), nproc_per_node=2, env=child_env(), cwd=str(tmp_path)
    )
    out = io.BytesIO()
    async with asyncio.timeout(30):
        result = await launch(config, stdout=out, stderr=io.BytesIO(), log=lambda m: None, handle_signals=False)
    assert result.ok
    assert sorted(out.getvalue().decode().splitlines()) == ["[rank0]: job 0", "[rank1]: job 1"]


# ------------------------------------------------------------------ the CLI process


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait for the launcher, then read what is left of its output (through the same buffered files)."""
    proc.wait(timeout=timeout)
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        return proc.stdout.read(), proc.stderr.read()


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _cli(*args: str, cwd: Path, entry: str = "aiodist.launcher") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", entry, "run", *args],
        cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.parametrize("entry", ["aiodist.launcher", "aiodist"], ids=["python-m-aiodist.launcher", "python-m-aiodist"])
def test_cli_exits_nonzero_naming_the_failed_rank(tmp_path: Path, entry: str) -> None:
    (tmp_path / "p.py").write_text("import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)\n")
    proc = _cli("-n", "3", "p.py", cwd=tmp_path, entry=entry)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 3
    assert "aiodist run: rank 1 (pid " in err and ") failed with exit code 3" in err


def test_cli_refuses_a_missing_program_before_starting_ranks(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    for name, why in (("nope.py", "no such file"), ("pkg", "is a directory")):
        proc = _cli("-n", "2", name, cwd=tmp_path)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 2, err
        assert f"can't open program {name!r} (in {tmp_path}): {why}" in err
        assert "[rank" not in err + out  # no rank was started


def _start_and_wait_ready(tmp_path: Path, source: str, n: int, *extra: str) -> tuple[subprocess.Popen[str], list[int]]:
    (tmp_path / "p.py").write_text(textwrap.dedent(source))
    proc = _cli(*extra, "-n", str(n), "p.py", cwd=tmp_path)
    assert proc.stdout is not None
    ready: list[int] = []
    deadline = time.monotonic() + 15
    while len(ready) < n and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "ready" in line:
            ready.append(int(line.split()[-1]))
    assert len(ready) == n
    return proc, ready



def test_cli_sigterm_is_forwarded_and_ranks_stop_cleanly(tmp_path: Path) -> None:
    proc, ready = _start_and_wait_ready(
        tmp_path,
        """
        import os, signal, sys, time
        def bye(signum, frame):
            print("got", signal.Signals(signum).name, flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", os.getpid(), flush=True)
        time.sleep(60)
        """,
        2,
    )
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest, err = _finish(proc, 10)
    assert time.monotonic() - start < 5
    assert proc.returncode == 128 + signal.SIGTERM
    assert "[rank0]: got SIGTERM" in rest and "[rank1]: got SIGTERM" in rest
    assert "received SIGTERM" in err
    assert not [pid for pid in ready if _alive(pid)]  # reaped by the launcher: gone

def test_cli_sigint_is_forwarded_to_the_ranks(tmp_path: Path) -> None:
    proc, _ = _start_and_wait_ready(
        tmp_path,
        """
        import os, time
        try:
            print("ready", os.getpid(), flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """,
        2,
    )
    proc.send_signal(signal.SIGINT)
    rest, err = _finish(proc, 10)
    assert proc.returncode == 128 + signal.SIGINT
    assert "[rank0]: interrupted" in rest and "[rank1]: interrupted" in rest
    assert "received SIGINT" in err


def test_cli_second_signal_kills_ranks_without_waiting_for_grace(tmp_path: Path) -> None:
    proc, _ = _start_and_wait_ready(
        tmp_path,
        """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", os.getpid(), flush=True)
        time.sleep(60)
        """,
        2,
        "--grace-period", "30",
    )
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.poll() is None  # the ranks ignore SIGTERM: the launcher is in its grace period
    proc.send_signal(signal.SIGTERM)
    _finish(proc, 10)
    assert time.monotonic() - start < 5
    assert proc.returncode == 128 + signal.SIGTERM


@pytest.mark.parametrize("restarts", ["0", "2"])
def test_a_signal_while_the_ranks_are_stopped_after_a_failure_is_reported_and_ends_the_job(
    tmp_path: Path, restarts: str
) -> None:
    # Before (elastic probe s20, finding 6): no "received SIGTERM" line; with no restart left the launcher
    # exited with the failure's code, as if the signal had not come.
    proc, _ = _start_and_wait_ready(
        tmp_path,
        """
        import os, signal, sys, time
        if os.environ["RANK"] == "0":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (holds the launcher in its grace period)
        print("ready", os.getpid(), flush=True)
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            sys.exit(3)
        time.sleep(60)
        """,
        2,
        "--grace-period", "3", "--max-restarts", restarts,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # (stderr is line-buffered: wait for the stop to begin)
        line = proc.stderr.readline()
        if "stopping the other" in line or not line:
            break
    time.sleep(0.3)
    assert proc.poll() is None  # rank 0 ignores SIGTERM: the launcher is in its grace period
    proc.send_signal(signal.SIGTERM)
    _, err = _finish(proc, 15)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "received SIGTERM while stopping the ranks after the failure" in err, err
    assert "restarting the job (restart" not in err, err


def test_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    proc, ready = _start_and_wait_ready(
        tmp_path, "import os, time\nprint('ready', os.getpid(), flush=True)\ntime.sleep(60)\n", 2
    )
    proc.kill()  # no chance to stop its ranks: they must not be left running
    proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while [pid for pid in ready if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in ready if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    assert not survivors


# ------------------------------------------------------------------ the same environment as torchrun


def _torchrun() -> str | None:
    return os.environ.get("AIODIST_TORCHRUN") or shutil.which("torchrun")


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not found (set AIODIST_TORCHRUN=/path/to/torchrun)")
def test_environment_matches_torchrun(tmp_path: Path) -> None:
    names = [n for n in RANK_ENV_NAMES if not n.startswith("AIODIST_")] + ["OMP_NUM_THREADS"]
    (tmp_path / "dump.py").write_text(
        f"import json, os\nprint(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))\n"
    )
    common = ["--nproc-per-node", "3", "--max-restarts", "2", "--master-port", "29561"]
    env = child_env()
    env.pop("OMP_NUM_THREADS", None)
    seen = {}
    for name, argv in {
        "torchrun": [_torchrun() or "", *common, "dump.py"],
        "aiodist": [sys.executable, "-m", "aiodist.launcher", "run", *common, "dump.py"],
    }.items():
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found = [json.loads(line[line.index("{"):]) for line in proc.stdout.splitlines() if "{" in line]
        seen[name] = sorted(found, key=lambda e: int(e["RANK"]))
    assert len(seen["aiodist"]) == 3
    assert seen["aiodist"] == seen["torchrun"]


async def test_stopping_a_rank_also_stops_the_processes_it_started(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, subprocess, sys, time
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            sys.exit(1)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("child", child.pid, flush=True)
        time.sleep(60)
        """,
        2,
    )
    assert run.result.failures[0].rank == 1
    (line,) = run.lines("out", 0)
    grandchild = int(line.split()[1])
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    alive = _alive(grandchild)
    if alive:
        os.kill(grandchild, signal.SIGKILL)
    assert not alive
    assert run.elapsed < 20  # its pipes did not keep the launcher waiting (they would for 60 s)


async def test_a_process_left_behind_holding_the_pipes_does_not_hang_the_launcher(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import subprocess, sys
        # a daemon in a session of its own (so no signal reaches it) that inherits stdout and stderr
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        print("daemon", child.pid, flush=True)
        """,
        1,
    )
    (line,) = run.lines("out", 0)
    os.kill(int(line.split()[1]), signal.SIGKILL)
    assert run.result.ok
    assert run.elapsed < 20, run.elapsed


STOPS_ITSELF = """
import asyncio, os, signal
import numpy as np
import aiodist

async def main():
    pg = await aiodist.init_process_group(timeout=30)
    await aiodist.barrier()
    if pg.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # hung (a debugger, a frozen process)
    await aiodist.all_reduce(np.ones(2))  # rank 0: fails in 3 s (heartbeats), and the launcher stops rank 1
"""


def test_a_stopped_rank_is_stopped_at_once_not_after_the_grace_period(tmp_path: Path) -> None:
    """Elastic probe: a SIGSTOPped rank takes the launcher's SIGTERM only once it runs again, so the launcher
    waited the whole --grace-period before its SIGKILL (and an elastic node missed the next round, whose
    last call is shorter). The launcher now sends SIGCONT after the signal."""
    from conftest import aiodist_run_source

    t0 = time.monotonic()
    proc = aiodist_run_source(tmp_path, STOPS_ITSELF, 2, options=["--grace-period", "30"], timeout=90)
    took = time.monotonic() - t0
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert took < 15, (took, proc.stdout + proc.stderr)  # (3 s of heartbeats, not 30 s of grace)
