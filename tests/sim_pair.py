"""Two virtual ranks over the simulated network: rank 0 serves one connection, the other dials it.

Helpers for the tests of the simulated connections (tests/test_sim_network.py,
tests/test_perf2_sim_handler.py); they run inside ``sim.run``'s ranks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiodist.context import current_network, getenv
from aiodist.net.base import Connection

PORT = 7000


def rank() -> int:
    """The calling virtual rank."""
    return int(getenv("RANK") or 0)


async def serve_once(handler: Any, port: int = PORT) -> Any:
    """Rank 0: listen, run ``handler`` on the first connection, return its result (or raise its error)."""
    result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def on_conn(conn: Connection) -> None:
        try:
            result.set_result(await handler(conn))
        except Exception as e:  # noqa: BLE001 - surface it to the test
            result.set_exception(e)

    listener = await current_network().listen(("", port), on_conn)
    try:
        return await result
    finally:
        await listener.aclose()


async def dial(port: int = PORT) -> Connection:
    """Connect to rank 0's listener, once it had a moment to listen."""
    await asyncio.sleep(0.01)  # let rank 0 listen first
    return await current_network().connect(("rank0", port))
