"""The store on a host of its own (``sim.run(..., store_host="separate")``).

By default rank 0 hosts the store (``env://``), so the store dies, pauses and
is cut off with rank 0. With a separate host ``"store"``, the simulator runs
the production :class:`aiodist.StoreServer` there before the ranks start
(MASTER_ADDR is ``store``; ranks see ``TORCHELASTIC_USE_AGENT_STORE=True``, as
under torchrun's agent store, so rank 0 connects instead of starting one),
and faults can name the host: ``Crash("store", at=...)``,
``Partition((0, 1), ("store",), ...)``, ``Pause("store", ...)``.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from typing import TYPE_CHECKING

from aiodist.context import new_rank_scope, set_network, set_rank_environ, set_token_source

from .loop import LANE

if TYPE_CHECKING:
    from .links import Host
    from .runner import Simulation

STORE_HOST = "store"


class StoreHost:
    """Boots, crashes and restarts the store's host; its lifetime does not keep the run going."""

    def __init__(self, sim: Simulation, host: Host, port: int) -> None:
        self.sim = sim
        self.host = host
        self.port = port
        self.incarnation = 0
        self.starting = False  # a restart's start is due
        self.task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<StoreHost {self.host.name}:{self.port} incarnation {self.incarnation}>"

    def start(self) -> None:
        """Boot (again): an empty store listening on ``store:MASTER_PORT``."""
        self.starting = False
        sim = self.sim
        lane = sim.new_lane()
        ctx = contextvars.copy_context()
        env = dict(sim.rank_env(0, 0))  # (the job's settings: its secret, its run id)
        for key in ("RANK", "LOCAL_RANK", "ROLE_RANK", "GROUP_RANK"):
            env.pop(key, None)
        # The store's challenge nonces: a seeded stream of this incarnation, so an authenticated run replays.
        tokens = random.Random(f"{sim.seed}:tokens:{STORE_HOST}:{self.incarnation}")

        def setup() -> None:
            set_rank_environ(env)
            set_token_source(tokens.randbytes)
            set_network(self.host.net)
            new_rank_scope()
            LANE.set(lane)

        ctx.run(setup)
        sim.fabric.boot(self.host, lane, ctx)
        sim.tracer.emit(sim.loop.time(), "start", self.host.name, detail=f"store incarnation {self.incarnation}")
        self.incarnation += 1
        self.task = sim.loop.create_task(self._serve(), name="sim-store", context=ctx)

    async def _serve(self) -> None:
        from aiodist.store.server import StoreServer

        server = await StoreServer.start(host=self.host.name, port=self.port)
        try:
            await asyncio.get_running_loop().create_future()  # serves until the host crashes or the run ends
        finally:
            await server.close()

    def crash(self, reason: str, *, silent: bool = False) -> None:
        self.sim.fabric.crash(self.host, reason, silent=silent)
