"""A planted any-source receive race for the simulator to find.

Rank 0 tells ranks 1 and 2 to go, then receives from "any source" twice and
assumes rank 1's message comes first, because rank 2 waits a little before
sending. Usually true; with unlucky network delays it is not. A sweep finds
the seeds where the assumption breaks::

    python -m sim run -n 3 examples/sim_anysource.py --seeds 0:100

The fix: receive with ``src=1`` and ``src=2`` explicitly (or not depend on
the order). Runs for real too: ``aiodist run -n 3 examples/sim_anysource.py``.
"""

from __future__ import annotations

import asyncio

import numpy as np

from aiodist import api as dist

HEAD_START = 50e-6  # seconds rank 1 sends before rank 2: less than the spread of network latencies


async def main() -> list[int]:
    pg = await dist.init_process_group(timeout=60)
    order: list[int] = []
    await dist.barrier()  # every connection is up: what follows races on the network alone
    go = np.zeros(1, dtype=np.int64)
    if pg.rank == 0:
        await asyncio.gather(dist.send(go, dst=1, tag=6), dist.send(go, dst=2, tag=6))
        buf = np.zeros(1, dtype=np.int64)
        for _ in range(2):
            order.append(await dist.recv(buf, src=None, tag=7))
        if order != [1, 2]:
            raise AssertionError(f"messages arrived in order {order}, the program assumed [1, 2]")
    elif pg.rank in (1, 2):
        await dist.recv(go, src=0, tag=6)
        await asyncio.sleep(0 if pg.rank == 1 else HEAD_START)
        await dist.send(np.full(1, pg.rank, dtype=np.int64), dst=0, tag=7)
    await dist.barrier()
    await dist.destroy_process_group()
    return order
