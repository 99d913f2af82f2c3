"""A collective whose last message and deadline come due in the same stretch completes.

The race (the collective analog of tests/test_recv_deadline_race.py): the
process is not running (blocked in ``time.sleep``, a long GC, a SIGSTOP)
while its peer's message arrives and its collective's deadline passes. When
it runs again both are due: the frame is read first (it completes the
operation's last receive), then the group's deadline monitor fired and
cancelled the operation's task before that task could take its step. The
collective used to raise CollectiveTimeoutError although its result was
complete (and its peers had finished it): the monitor now lets a task whose
awaited future is done take its step first, and looks at the deadline again
after it.
"""

from __future__ import annotations

from pathlib import Path

from conftest import aiodist_run_source, sim_run_source

PROGRAM = '''
import asyncio, time
import numpy as np
import aiodist as dist

async def main():
    await dist.init_process_group(timeout=30)
    try:
        x = np.ones(4)
        await dist.all_reduce(x, timeout=20)  # (the connection is up before the race)
        if dist.get_rank() == 1:
            await asyncio.sleep(0.02)
            await dist.all_reduce(x, timeout=20)
            await dist.barrier(timeout=20)  # stay until rank 0 is done
            return float(x[0])
        work = dist.all_reduce(x, timeout=0.05)
        await asyncio.sleep(0)  # the collective waits, its deadline armed
        time.sleep(0.3)  # the process stops running: the message arrives, the deadline passes
        await work
        assert x[0] == 4.0, x
        print("reduced", x[0], flush=True)
        await dist.barrier(timeout=20)
        return float(x[0])
    finally:
        await dist.destroy_process_group()

if __name__ == "__main__":
    asyncio.run(main())
'''


def test_real_processes_blocked_past_the_deadline_complete_the_collective(tmp_path: Path) -> None:
    proc = aiodist_run_source(tmp_path, PROGRAM, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reduced 4.0" in proc.stdout


def test_simulated_rank_blocked_past_the_deadline_completes_the_collective(tmp_path: Path) -> None:
    # The same program: in the simulator, time.sleep blocks the rank's lane for 0.3 virtual seconds.
    # Fixed timing: its deadline of 0.05 s is the race; a pause of exploration before the message would
    # time the operation out for real, as it would a real process stopped there.
    assert sim_run_source(tmp_path, PROGRAM, 2, range(4), explore=False) == [[4.0, 4.0]] * 4
