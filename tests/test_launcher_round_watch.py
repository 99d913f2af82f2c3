"""The elastic agent's watch over the other nodes of its round (aiodist.launch.round_watch), on a MemoryStore."""

from __future__ import annotations

import asyncio
import json

from aiodist.launch.round_watch import FINISHED, RoundWatch, say_goodbye
from aiodist.store.memory import MemoryStore

PREFIX = "aiodist/elastic/t/"
NODES = ["a:1", "b:2", "c:3"]


async def _round(store: MemoryStore, k: int = 0) -> None:
    state = {"v": 1, "round": k, "status": "frozen", "participants": NODES, "waiting": []}
    await store.set(f"{PREFIX}state", json.dumps(state).encode())


def _watch(store: MemoryStore, rank: int = 0) -> RoundWatch:
    return RoundWatch(store, PREFIX, round=0, rank=rank, participants=NODES, nproc_per_node=2, poll=0.01,
                      heartbeat_timeout=0.3)


async def _beat(store: MemoryStore, node: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await store.add(f"{PREFIX}hb/0/{node}", 1)
        await asyncio.sleep(0.01)


async def test_a_node_that_left_without_finishing_is_lost_at_once_one_that_finished_is_not() -> None:
    store = MemoryStore()
    await _round(store)
    stop = asyncio.Event()
    beats = [asyncio.create_task(_beat(store, n, stop)) for n in NODES[1:]]
    watcher = asyncio.create_task(_watch(store).run())
    await say_goodbye(store, PREFIX, "b:2", FINISHED)  # node 1's job succeeded: it may leave
    await asyncio.sleep(0.5)
    assert not watcher.done()
    await say_goodbye(store, PREFIX, "c:3", "SIGTERM")
    loss = await asyncio.wait_for(watcher, 1.0)
    stop.set()
    await asyncio.gather(*beats)
    assert loss is not None and loss.node == 2 and loss.ranks == (4, 5) and not loss.store
    assert loss.message(" before its ranks joined the rendezvous") == (
        "node 2 (ranks 4, 5) was lost before its ranks joined the rendezvous: its launcher left (SIGTERM)")


async def test_a_silent_node_is_lost_after_the_heartbeat_timeout() -> None:
    store = MemoryStore()
    await _round(store)
    stop = asyncio.Event()
    beat = asyncio.create_task(_beat(store, "a:1", stop))  # node 0 beats; node 2 never does
    loop = asyncio.get_running_loop()
    start = loop.time()
    loss = await asyncio.wait_for(_watch(store, rank=1).run(), 2.0)
    stop.set()
    await beat
    assert loss is not None and loss.node == 2 and "stopped responding" in loss.why, loss
    assert 0.3 <= loop.time() - start < 1.5


async def test_the_round_moving_on_ends_the_watch() -> None:
    store = MemoryStore()
    await _round(store)
    stop = asyncio.Event()
    beats = [asyncio.create_task(_beat(store, n, stop)) for n in NODES[1:]]
    watcher = asyncio.create_task(_watch(store).run())
    await asyncio.sleep(0.1)
    await _round(store, 1)  # another node's job failed: it opened round 1
    loss = await asyncio.wait_for(watcher, 1.0)
    stop.set()
    await asyncio.gather(*beats)
    assert loss is not None and loss.node is None and "round 0 was given up" in loss.message()
