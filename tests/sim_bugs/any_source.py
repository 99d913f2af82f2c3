"""Any-source arrival order: rank 1 records its result in the store first, rank 2 replies at once;
rank 0 takes the first reply to be rank 2's."""

from __future__ import annotations

import numpy as np

import aiodist

TAG = 9


async def _run(by_source: bool) -> int:
    pg = await aiodist.init_process_group()
    store = pg.store
    await aiodist.barrier()
    buf = np.zeros(1)
    first = -1
    if pg.rank == 0:
        if by_source:
            await aiodist.recv(buf, src=2, tag=TAG)
            fast = float(buf[0])
            await aiodist.recv(buf, src=1, tag=TAG)
        else:
            first = await aiodist.recv(buf, src=None, tag=TAG)
            fast = float(buf[0])  # "rank 2 answers at once, rank 1 talks to the store first: 2 is first"
            await aiodist.recv(buf, src=None, tag=TAG)
        if fast != 2.0:
            raise AssertionError(f"took rank {int(fast)}'s reply for rank 2's")
    elif pg.rank == 1:
        for step in range(3):
            await store.set(f"result/1/{step}", str(step))
        await aiodist.send(np.full(1, 1.0), dst=0, tag=TAG)
    else:
        await aiodist.send(np.full(1, float(pg.rank)), dst=0, tag=TAG)
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return first


async def buggy() -> int:
    return await _run(by_source=False)


async def fixed() -> int:
    return await _run(by_source=True)
