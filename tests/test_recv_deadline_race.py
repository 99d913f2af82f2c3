"""A receive whose message and deadline come due in the same stretch returns the message.

The race: the message is matched and written into the buffer while the
receiving process is not running (blocked in ``time.sleep``, a long GC, a
SIGSTOP), and the receive's deadline passes meanwhile. When the process runs
again both are due: the frame is read first (it completes the receive), then
the deadline's timer cancels the waiting task. The receive used to raise
CollectiveTimeoutError then, and the message it had already taken was lost:
the next receive of that (source, tag) never saw it. (Found by a program of
tests/sim_bugs/blind_c.py: a fixed twin that failed 4 seeds in 100.)
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
        if dist.get_rank() == 1:
            await dist.send(np.zeros(1), dst=0, tag=4)  # (the connection is up before the race)
            await asyncio.sleep(0.02)
            await dist.send(np.full(1, 7.0), dst=0, tag=5)
            await dist.recv(np.zeros(1), src=0, tag=6, timeout=20)  # stay until rank 0 is done
            return
        await dist.recv(np.zeros(1), src=1, tag=4, timeout=20)
        buf = np.zeros(1)
        work = asyncio.ensure_future(dist.recv(buf, src=1, tag=5, timeout=0.05))
        await asyncio.sleep(0)  # the receive waits, its deadline armed

        time.sleep(0.3)  # the process stops running: the message arrives, the deadline passes
        sender = await work
        assert sender == 1 and buf[0] == 7.0, (sender, buf)
        print("received", buf[0], flush=True)
        await dist.send(np.zeros(1), dst=1, tag=6)
        return float(buf[0])
    finally:
        await dist.destroy_process_group()

if __name__ == "__main__":
    asyncio.run(main())
'''


def test_real_processes_blocked_past_the_deadline_keep_the_message(tmp_path: Path) -> None:
    proc = aiodist_run_source(tmp_path, PROGRAM, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "received 7.0" in proc.stdout


def test_simulated_rank_blocked_past_the_deadline_keeps_the_message(tmp_path: Path) -> None:
    # The same program: in the simulator, time.sleep blocks the rank's lane for 0.3 virtual seconds.
    # Fixed timing: its deadline of 0.05 s is the race; a pause of exploration before the message would
    # time the operation out for real, as it would a real process stopped there.
    assert [r[0] for r in sim_run_source(tmp_path, PROGRAM, 2, range(3), explore=False)] == [7.0] * 3
