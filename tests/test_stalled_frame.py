"""A peer stopped in the middle of a large frame is declared failed after the heartbeat timeout.

Rank 1 sends rank 0 a 64 MiB array and SIGSTOPs itself 0.3 s later, while
rank 0's loop is blocked (1 s): only what the sockets (or the ring) hold got
out, a few MiB. Rank 0, receiving, must raise PeerFailureError naming rank 1
within a few seconds (heartbeat timeout 3 s). Before, the frame's header
bought its sender the time 64 MiB need at the detector's minimum bandwidth
(1 MB/s: 67 s), whether or not its bytes kept coming, so rank 0 waited for
its operation's timeout instead (a header announcing 1 GiB bought 18 min).
Now bytes that stopped coming are silence. Over TCP and over shared memory.

Run as a script (``--worker``) it is the worker.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest
from rank_procs import RankProcs, emit

NBYTES = 64 << 20
OP_TIMEOUT = 40.0


def worker() -> None:
    import asyncio
    import os

    import numpy as np

    import aiodist.api as dist
    from aiodist.eventloop import run

    async def main() -> None:
        pg = await dist.init_process_group(timeout=OP_TIMEOUT)
        x = np.ones(NBYTES // 8)
        await dist.all_reduce(np.ones(4))  # (the link is up: heartbeats watch it)
        emit("ready")
        if pg.rank == 1:
            work = dist.isend(x, dst=0)  # (what the sockets take leaves now: rank 0 reads nothing yet)

            def stop() -> None:
                emit("stopped")
                os.kill(os.getpid(), signal.SIGSTOP)

            asyncio.get_running_loop().call_later(0.3, stop)
            await work
            return
        time.sleep(1.0)  # rank 0's loop blocked: the sockets fill, most of the frame waits in rank 1
        try:
            await dist.recv(x, src=1)
            emit("error", type="none", rank=None, raised=time.time())
        except Exception as e:  # noqa: BLE001 - reported whatever it is
            emit("error", type=type(e).__name__, rank=getattr(e, "rank", None), raised=time.time(), msg=str(e)[:300])
        os._exit(0)

    run(main())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSTOP, shared memory")
@pytest.mark.parametrize("transport", ["tcp", "auto"])
async def test_a_peer_stopped_in_the_middle_of_a_large_frame_is_declared_failed_in_time(transport: str) -> None:
    async with await RankProcs.start([__file__, "--worker"], 2, env={"AIODIST_TRANSPORT": transport}) as ranks:
        await ranks.all_ready(60)
        done = await ranks.until(lambda: ranks.reported("error", [0]) and ranks.reported("stopped", [1]),
                                 OP_TIMEOUT + 10)
        assert done, ranks.events
        stopped = ranks.of("stopped")[1]["t"]
        ev = ranks.of("error")[0]
    assert ev["type"] == "PeerFailureError" and ev["rank"] == 1, ev
    assert ev["raised"] - stopped < 8.0, ev["raised"] - stopped  # before: the 40 s operation timeout


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker()
