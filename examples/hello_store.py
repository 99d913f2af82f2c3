"""Hello from every rank, through the key-value store alone (no process group).

    aiodist run -n 4 examples/hello_store.py
    python -m sim run -n 4 examples/hello_store.py

Rank 0 serves the store at MASTER_ADDR:MASTER_PORT (set by the launcher, or
by the simulator for each virtual rank; not when TORCHELASTIC_USE_AGENT_STORE
is True: something else serves it then, as ``python -m sim run
--store-host separate`` does); every rank connects, writes its
greeting under ``hello/<rank>`` and waits for everyone's; rank 0 prints them in
rank order. Each rank then says ``bye/<rank>`` and rank 0 keeps the server up
until all have, so nobody loses the store mid-call.

The environment is read through ``aiodist.context.getenv`` (``os.environ``
would do as well: the simulator gives each virtual rank its own, as a process
has).
"""

from __future__ import annotations

from aiodist.context import getenv
from aiodist.store import StoreServer, TCPStore

TIMEOUT = 30.0


def _env(name: str) -> str:
    value = getenv(name)
    if value is None:
        raise RuntimeError(f"{name} is not set: start this program with `aiodist run` or `python -m sim run`")
    return value


async def main() -> list[str] | None:
    rank, world = int(_env("RANK")), int(_env("WORLD_SIZE"))
    host, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
    # Rank 0 serves the store, unless an agent does already (torchrun's convention; the simulator's
    # store_host="separate" runs it on a host of its own).
    agent_store = (getenv("TORCHELASTIC_USE_AGENT_STORE") or "").lower() in ("true", "1")
    server = await StoreServer.start(host=host, port=port) if rank == 0 and not agent_store else None
    try:
        async with await TCPStore.connect(host, port, timeout=TIMEOUT) as store:
            await store.set(f"hello/{rank}", f"hello from rank {rank} of {world}")
            keys = [f"hello/{r}" for r in range(world)]
            await store.wait(keys, timeout=TIMEOUT)
            greetings = [v.decode() for v in await store.multi_get(keys)]
            if rank == 0:
                for line in greetings:
                    print(line)
            await store.set(f"bye/{rank}", b"")
            if rank == 0:
                await store.wait([f"bye/{r}" for r in range(world)], timeout=TIMEOUT)
        return greetings if rank == 0 else None
    finally:
        if server is not None:
            await server.close()
