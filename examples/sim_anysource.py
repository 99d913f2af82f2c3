"""A planted any-source receive race for the simulator to find.

Rank 0 receives from "any source" twice and assumes rank 1's message comes
first because rank 2 sends a little later. Usually true; with unlucky network
delays it is not. A sweep finds the seeds where the assumption breaks::

    python -m sim run -n 3 examples/sim_anysource.py --seeds 0:100

The fix: receive with ``src=1`` and ``src=2`` explicitly (or not depend on
the order). Runs for real too: ``aiodist run -n 3 examples/sim_anysource.py``.
"""

from __future__ import annotations

import asyncio

import numpy as np

from aiodist import api as dist

HEAD_START = 120e-6  # seconds rank 1 sends before rank 2: about one network latency


async def main() -> list[int]:
    pg = await dist.init_process_group(timeout=60)
    order: list[int] = []
    await dist.barrier()
    if pg.rank == 0:
        buf = np.zeros(1, dtype=np.int64)
        for _ in range(2):
            order.append(await dist.recv(buf, src=None, tag=7))
        if order != [1, 2]:
            raise AssertionError(f"messages arrived in order {order}, the program assumed [1, 2]")
    elif pg.rank in (1, 2):
        await asyncio.sleep(0 if pg.rank == 1 else HEAD_START)
        await dist.send(np.full(1, pg.rank, dtype=np.int64), dst=0, tag=7)
    await dist.barrier()
    await dist.destroy_process_group()
    return order
