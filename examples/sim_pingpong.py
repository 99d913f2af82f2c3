"""Frame ping-pong over the network seam: pairs of ranks bounce ``pings`` frames.

Even ranks listen, odd ranks connect to their left neighbour and send. It uses
only the seam (no store, no groups), so it measures the network implementation
itself: ``benchmarks/sim_bench.py kernel`` times the simulator with it, and
``tests/test_sim_kernel.py`` counts the loop steps per delivery.

    python -m sim run -n 4 examples/sim_pingpong.py
"""

from __future__ import annotations

import asyncio

from aiodist.context import current_network, getenv
from aiodist.net.base import Connection

PORT = 1000


async def main(pings: int = 2000) -> int:
    net = current_network()
    r = int(getenv("RANK") or 0)
    if r % 2 == 0:
        done = asyncio.Event()

        async def handler(conn: Connection) -> None:
            for _ in range(pings):
                f = await conn.recv()
                await conn.send(f.header)
            done.set()

        listener = await net.listen(("", PORT), handler)
        await done.wait()
        await listener.aclose()
        return 0
    await asyncio.sleep(0.001)
    conn = await net.connect((f"rank{r - 1}", PORT))
    for i in range(pings):
        await conn.send({"i": i})
        await conn.recv()
    conn.close()
    return 1
