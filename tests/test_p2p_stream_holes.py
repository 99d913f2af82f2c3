"""A point-to-point send that gives up does not hold up the messages sent after it.

A send takes its number in its (group, destination, tag) stream when it is
called, and the receiver delivers a stream in number order. A send that timed
out while its frame still waited behind others (the peer did not read) left
the connection's queue without being sent: its number never came, and every
later message of that stream waited for it at the receiver, for ever. A user
who catches the timeout and sends again saw the next receive time out too.
Now a skip frame for the number follows on the same link; a message that did
go out (it had started when the send gave up) comes before its skip, which
is then ignored.

The same repair found a second hole: a connection routes a frame with a
payload when its header arrives, one without a payload when it is complete.
An empty message followed by a large one, read in one go, had the large one's
header routed first: out of turn, so it was held, and nothing released it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import aiodist_run_source, sim_run_source

BEHIND_A_LARGE_ONE = '''
import asyncio, time
import numpy as np
import aiodist as dist

async def main():
    await dist.init_process_group(timeout=30)
    try:
        if dist.get_rank() == 1:
            await dist.recv(np.zeros(1), src=0, tag=9, timeout=20)
            time.sleep(2.0)  # the process stops reading: rank 0's sends back up
            big = np.zeros(16 << 20, dtype=np.float32)
            await dist.recv(big, src=0, tag=5, timeout=20)
            buf = np.zeros(1 << 20, dtype=np.float32)
            await dist.recv(buf, src=0, tag=5, timeout=10)  # the third send's message: the second gave up
            assert big[0] == 1.0 and buf[0] == 3.0 and buf[-1] == 3.0, (big[0], buf[0])
            print("second message", buf[0], flush=True)
            await dist.send(np.zeros(1), dst=0, tag=6)
            return float(buf[0])
        await dist.send(np.zeros(1), dst=1, tag=9)  # (the connection is up)
        await asyncio.sleep(0.2)
        first = dist.isend(np.ones(16 << 20, dtype=np.float32), dst=1, tag=5)  # more than the socket buffers take
        try:
            await dist.send(np.full(1 << 20, 2.0, dtype=np.float32), dst=1, tag=5, timeout=0.3)
        except dist.CollectiveTimeoutError:
            print("second send timed out", flush=True)
        else:
            raise AssertionError("the second send got through to a peer that does not read")
        await dist.send(np.full(1 << 20, 3.0, dtype=np.float32), dst=1, tag=5, timeout=20)
        await first
        await dist.recv(np.zeros(1), src=1, tag=6, timeout=20)
    finally:
        await dist.destroy_process_group()

if __name__ == "__main__":
    asyncio.run(main())
'''

WHILE_CONNECTING = '''
import asyncio, time
import numpy as np
import aiodist as dist

async def main():
    await dist.init_process_group(timeout=30)
    try:
        if dist.get_rank() == 1:
            time.sleep(2.0)  # blocked before any link to rank 0 is up: rank 0's first send cannot connect
            buf = np.zeros(1)
            await dist.recv(buf, src=0, tag=5, timeout=10)  # the second send's message: the first gave up
            print("received", buf[0], flush=True)
            await dist.send(np.zeros(1), dst=0, tag=6)
            return float(buf[0])
        await asyncio.sleep(0.2)
        try:
            await dist.send(np.full(1, 1.0), dst=1, tag=5, timeout=0.3)
        except dist.CollectiveTimeoutError:
            print("first send timed out", flush=True)
        else:
            raise AssertionError("the first send got through to a blocked peer")
        await dist.send(np.full(1, 7.0), dst=1, tag=5, timeout=20)
        await dist.recv(np.zeros(1), src=1, tag=6, timeout=20)
    finally:
        await dist.destroy_process_group()

if __name__ == "__main__":
    asyncio.run(main())
'''

EMPTY_THEN_LARGE = '''
import asyncio, time
import numpy as np
import aiodist as dist

async def main():
    await dist.init_process_group(timeout=30)
    try:
        if dist.get_rank() == 1:
            await dist.recv(np.zeros(1), src=0, tag=9, timeout=20)
            time.sleep(1.0)  # both messages wait in the socket: one read takes the first and the second's header
            await dist.recv(np.zeros(0, dtype=np.float32), src=0, tag=3, timeout=10)
            buf = np.zeros(1 << 16, dtype=np.float32)
            await dist.recv(buf, src=0, tag=3, timeout=10)
            print("after the empty message", buf[0], flush=True)
            await dist.send(np.zeros(1), dst=0, tag=6)
            return float(buf[0])
        await dist.send(np.zeros(1), dst=1, tag=9)
        await asyncio.sleep(0.2)
        await dist.send(np.zeros(0, dtype=np.float32), dst=1, tag=3)
        await dist.send(np.full(1 << 16, 5.0, dtype=np.float32), dst=1, tag=3)
        await dist.recv(np.zeros(1), src=1, tag=6, timeout=20)
    finally:
        await dist.destroy_process_group()

if __name__ == "__main__":
    asyncio.run(main())
'''

# (program, what rank 0 and rank 1 print, rank 1's result)
CASES = {
    # the second send times out waiting behind a large first one the peer does not read (its frame leaves
    # the queue unsent); the third's message is delivered
    "behind a large one": (BEHIND_A_LARGE_ONE, ["second send timed out", "second message 3.0"], 3.0),
    # the first send to a blocked peer times out before the link is up: its skip frame waits for the link
    "while connecting": (WHILE_CONNECTING, ["first send timed out", "received 7.0"], 7.0),
    # an empty message, then a large one, read in one go
    "empty then large": (EMPTY_THEN_LARGE, ["after the empty message 5.0"], 5.0),
}


@pytest.mark.parametrize("transport", ["auto", "tcp"])  # shared memory between the two processes, and TCP
@pytest.mark.parametrize("case", list(CASES))
def test_real_processes_deliver_the_messages_after_the_hole(tmp_path: Path, case: str, transport: str) -> None:
    source, printed, _ = CASES[case]
    proc = aiodist_run_source(tmp_path, source, 2, env={"AIODIST_TRANSPORT": transport})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(line in proc.stdout for line in printed), proc.stdout


@pytest.mark.parametrize("case", ["behind a large one", "while connecting"])
def test_simulated_ranks_deliver_the_messages_after_the_hole(tmp_path: Path, case: str) -> None:
    source, _, result = CASES[case]
    assert [r[1] for r in sim_run_source(tmp_path, source, 2, range(3))] == [result] * 3
