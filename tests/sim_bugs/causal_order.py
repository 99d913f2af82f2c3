"""Causal order across two senders: rank 0 sends data to 2, then tells 1; 1 tells 2; 2 assumes data came first."""

from __future__ import annotations

import numpy as np

import aiodist

TAG = 5


async def _run(explicit: bool) -> list[int]:
    pg = await aiodist.init_process_group()
    await aiodist.barrier()
    order: list[int] = []
    buf = np.zeros(1)
    if pg.rank == 0:
        await aiodist.send(np.full(1, 42.0), dst=2, tag=TAG)  # the data ...
        await aiodist.send(np.zeros(1), dst=1, tag=TAG)  # ... then rank 1 may tell rank 2 it is there
    elif pg.rank == 1:
        await aiodist.recv(buf, src=0, tag=TAG)
        await aiodist.send(np.ones(1), dst=2, tag=TAG)
    elif pg.rank == 2:
        if explicit:
            order = [await aiodist.recv(buf, src=1, tag=TAG), await aiodist.recv(buf, src=0, tag=TAG)]
            if buf[0] != 42.0:
                raise AssertionError("the data from rank 0 is wrong")
        else:
            order = [await aiodist.recv(buf, src=None, tag=TAG) for _ in range(2)]
            if order[0] != 0:  # "rank 0 sent it before rank 1 even heard from rank 0"
                raise AssertionError(f"rank 1's notice overtook rank 0's data (arrival order {order})")
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return order


async def buggy() -> list[int]:
    return await _run(explicit=False)


async def fixed() -> list[int]:
    return await _run(explicit=True)
