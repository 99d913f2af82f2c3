"""A receive timeout too tight for the latency tail: a late message lands in the next round.

Every PERIOD rank 0 publishes an update; rank 1 waits for it with a
deadline far above the usual latency, and on a timeout goes on with the old
value. The one late update is then taken for the next round's. The fix: tag
each round's message with its round.
"""

from __future__ import annotations

import asyncio

import numpy as np

import aiodist

ROUNDS = 8
PERIOD = 0.05
TIMEOUT = 0.02  # seconds: a hundred times the usual latency, not the worst


async def _run(tagged: bool) -> list[float]:
    pg = await aiodist.init_process_group()
    await aiodist.barrier()
    loop = asyncio.get_running_loop()
    start = loop.time()
    got: list[float] = []
    for r in range(ROUNDS):
        await asyncio.sleep(max(0.0, start + r * PERIOD - loop.time()))
        if pg.rank == 0:
            await aiodist.send(np.full(1, float(r)), dst=1, tag=r if tagged else 0)
        else:
            buf = np.full(1, -1.0)
            try:
                await aiodist.recv(buf, src=0, tag=r if tagged else 0, timeout=TIMEOUT)
            except TimeoutError:
                got.append(-1.0)  # no update this round: go on with the old value
                continue
            if buf[0] != r:
                raise AssertionError(f"round {r} received round {int(buf[0])}'s value")
            got.append(float(buf[0]))
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return got


async def buggy() -> list[float]:
    return await _run(tagged=False)


async def fixed() -> list[float]:
    return await _run(tagged=True)
