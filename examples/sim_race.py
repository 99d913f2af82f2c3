"""A planted race for the simulator to find: a lost update on the store.

Every rank increments a shared counter with get-then-set (not atomic), a
little after the previous rank. Most interleavings happen to be fine; when
network delays let two ranks' read-modify-write overlap, an increment is
lost and the final check fails. A seed sweep finds the failing seeds::

    python -m sim run -n 4 examples/sim_race.py --seeds 0:200

The fix is ``await store.add("counter", 1)``. The same file runs for real
(``aiodist run -n 4 examples/sim_race.py``).
"""

from __future__ import annotations

import asyncio

from aiodist.context import getenv
from aiodist.store import StoreServer, TCPStore

SPACING = 500e-6  # seconds between ranks' increments: a little more than one get+set


async def main() -> int:
    rank = int(getenv("RANK", "0") or 0)
    world = int(getenv("WORLD_SIZE", "1") or 1)
    host = getenv("MASTER_ADDR", "127.0.0.1") or "127.0.0.1"
    port = int(getenv("MASTER_PORT", "29500") or 29500)
    server = await StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await TCPStore.connect(host, port, timeout=30.0)
    try:
        if rank == 0:
            await store.set("counter", b"0")
        await store.wait(["counter"], timeout=30.0)
        if await store.add("ready", 1) == world:  # a barrier: the last one in opens the gate
            await store.set("go", b"1")
        await store.wait(["go"], timeout=30.0)
        await asyncio.sleep(rank * SPACING)
        value = int(await store.get("counter"))  # read ...
        await store.set("counter", str(value + 1))  # ... modify-write: the race
        await store.add("done", 1)
        while int(await store.add("done", 0)) < world:
            await asyncio.sleep(0.001)
        final = int(await store.get("counter"))
        if final != world:
            raise AssertionError(f"lost update: counter is {final}, expected {world}")
        await store.add("exit", 1)
        if rank == 0:
            for _ in range(10_000):
                if int(await store.add("exit", 0)) == world:
                    break
                await asyncio.sleep(0.001)
        return final
    finally:
        await store.close()
        if server is not None:
            await server.close()
