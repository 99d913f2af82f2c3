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

from aiodist.launch.stopped import describe

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
