"""A launched rank stopped by SIGTERM says what it was waiting in (a killed hang is no longer silent).

Before: killing a hung ``aiodist run`` (``timeout``, a scheduler's limit) printed only
"received SIGTERM; stopped 2 rank(s)": nothing said where each rank was stuck.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiodist.launch.stopped import describe
from test_launcher_run import _alive

ROOT = Path(__file__).resolve().parent.parent

HANG = '''
import numpy as np
import aiodist as dist

async def main():
    await dist.init_process_group(timeout=300)
    x = np.zeros(2)
    await dist.barrier()
    print("ready", flush=True)
    if dist.get_rank() == 1:
        await dist.recv(x, src=0)  # rank 0 never sends
    else:
        await dist.all_reduce(x)  # rank 1 never joins
'''


def test_a_killed_hung_job_says_where_each_rank_waited(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(HANG)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "aiodist", "run", "-n", "2", "prog.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(2):  # both ranks are in their hang (bounded by the test's timeout below)
            assert "ready" in proc.stdout.readline()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "[rank1]: rank 1: stopped by SIGTERM while waiting in recv group=world peer=0 tag=0 (for " in err, err
    assert "[rank0]: rank 0: stopped by SIGTERM while waiting in all_reduce group=world seq=1 peers=[1] (for " in err, err
    assert "received SIGTERM; stopped 2 rank(s)" in err


def test_the_line_names_the_oldest_operations_first_and_counts_the_rest() -> None:
    entries = [{"op": "recv", "group": "world", "peer": 0, "tag": 0, "start": 1.0},
               {"op": "store.get", "key": "k", "start": 2.5}] + [{"op": "send", "peer": 1, "start": 3.0}] * 4
    assert describe("3", "SIGTERM", entries, 10.0) == (
        "rank 3: stopped by SIGTERM while waiting in recv group=world peer=0 tag=0 (for 9.0s); "
        "store.get key=k (for 7.5s); send peer=1 (for 7.0s); send peer=1 (for 7.0s); and 2 more")
    assert describe("0", "SIGTERM", entries[:1], None) == "rank 0: stopped by SIGTERM while waiting in recv group=world peer=0 tag=0"
    assert describe("0", "SIGTERM", [], 1.0) is None  # waiting in nothing: nothing said



STOPPABLE = '''
import os, signal, subprocess, sys, time
def stopped(signum, frame):
    print("got", signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
child = subprocess.Popen(["sleep", "1000"])
print("ready", child.pid, os.environ["AIODIST_STATUS_DIR"], flush=True)
time.sleep(60)
'''


@pytest.mark.parametrize("signame", ["SIGHUP", "SIGQUIT"])
def test_sighup_and_sigquit_stop_the_job_as_sigterm_does(tmp_path: Path, signame: str) -> None:
    # Before: the launcher died of the signal at once (129, 131); its ranks were SIGKILLed (parent-death signal)
    # without a word (a rank says where it waited on SIGTERM), the processes they started ran on, and its
    # status dir (/tmp/aiodist-run-*) was left behind.
    signum = getattr(signal, signame)
    (tmp_path / "prog.py").write_text(STOPPABLE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "aiodist", "run", "-n", "2", "prog.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        assert proc.stdout is not None
        status_dirs = set()
        for _ in range(2):  # (bounded by the test's timeout below)
            _, child, status_dir = proc.stdout.readline().split()[-3:]
            children.append(int(child))
            status_dirs.add(status_dir)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        alive = [pid for pid in children if _alive(pid)]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, err
    assert "[rank0]: got SIGTERM" in out and "[rank1]: got SIGTERM" in out, (out, err)
    assert f"received {signame}; stopped 2 rank(s)" in err, err
    assert not alive  # the processes the ranks started were stopped with them
    [status_dir] = status_dirs
    assert not os.path.exists(os.path.dirname(status_dir))



def test_the_run_directory_of_a_launcher_killed_by_sigkill_is_removed_by_the_next_launcher(tmp_path: Path) -> None:
    """Before (shm and launcher probes): a launcher killed with SIGKILL left /tmp/aiodist-run-*/attempt0 behind
    for good (59 of them here). The next launcher of this user removes those whose launcher is gone."""
    from aiodist.launch.rundirs import PID_FILE, sweep_stale

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "prog.py").write_text(STOPPABLE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "aiodist", "run", "-n", "1", "prog.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = 0
    try:
        assert proc.stdout is not None
        _, pid, status_dir = proc.stdout.readline().split()[-3:]
        child = int(pid)
        run_dir = os.path.dirname(status_dir)
        assert os.path.dirname(run_dir) == str(tmp) and os.path.exists(os.path.join(run_dir, PID_FILE))
        proc.kill()  # SIGKILL: nothing of the launcher runs again (its rank dies of the parent-death signal)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
    assert os.path.exists(run_dir)  # (left behind)
    alive = tmp / "aiodist-run-alive"  # a live launcher's (this process'), and one made by an older version
    alive.mkdir()
    (alive / PID_FILE).write_text(f"{os.getpid()} {os.stat('/proc/self/ns/pid').st_ino}\n")
    (tmp / "aiodist-run-old").mkdir()
    other_ns = tmp / "aiodist-run-elsewhere"  # (a pid of another pid namespace says nothing here)
    other_ns.mkdir()
    (other_ns / PID_FILE).write_text("999999 1\n")
    (tmp_path / "noop.py").write_text("print('done')\n")
    out = subprocess.run([sys.executable, "-m", "aiodist", "run", "-n", "1", "noop.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert not os.path.exists(run_dir), out.stderr
    assert alive.exists() and (tmp / "aiodist-run-old").exists() and other_ns.exists()
    assert sweep_stale(str(tmp)) == []
