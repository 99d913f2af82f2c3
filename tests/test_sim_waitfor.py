"""A world operation that timed out while the ranks waited for each other in a ring: the report says so."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

import aiodist
import sim
from sim.waitfor import wait_cycle, waits_of


def _recv(peer: int, group: str = "world") -> dict[str, Any]:
    return {"op": "recv", "group": group, "peer": peer, "tag": 0}


def test_the_shortest_ring_back_to_the_rank_that_timed_out() -> None:
    blocked = {0: [_recv(1)], 1: [_recv(2)], 3: [_recv(0)]}
    assert wait_cycle(2, [0], blocked) == [2, 0, 1, 2]
    assert wait_cycle(2, [3], blocked) == [2, 3, 0, 1, 2]
    assert wait_cycle(2, [0, 3], blocked) == [2, 0, 1, 2]  # (the shorter one)
    assert wait_cycle(0, [1], {1: [{"op": "all_reduce", "group": "world", "peers": [0]}]}) == [0, 1, 0]


def test_no_ring_no_cycle() -> None:
    assert wait_cycle(2, [0], {0: [_recv(1)], 1: []}) == []  # rank 1 waits in no operation (asleep, say)
    assert wait_cycle(2, [0], {0: [_recv(1)], 1: [{"op": "store.get", "key": "k"}]}) == []
    assert wait_cycle(2, [0], {0: [_recv(1)], 1: [_recv(2, group="group 3 (ranks [1, 2])")]}) == []  # (numbered
    assert waits_of([_recv(1, group="group 3")]) == []  # in its group's ranks: not counted)


async def _each_receives_from_the_next() -> None:
    pg = await aiodist.init_process_group()
    await aiodist.recv(np.zeros(3), src=(pg.rank + 1) % pg.size, timeout=5)


def test_a_ring_of_receives_is_named_a_deadlock() -> None:
    res = sim.run(_each_receives_from_the_next, world_size=3, seed=0)
    first = res.failures[0]
    assert first.message.startswith("CollectiveTimeoutError")
    r = first.rank
    assert first.cycle == [r, (r + 1) % 3, (r + 2) % 3, r]
    assert "waits in a ring when it timed out: rank" in str(first)


async def _one_is_just_late() -> None:
    pg = await aiodist.init_process_group()
    x = np.zeros(3)
    if pg.rank == 0:
        await aiodist.recv(x, src=1, timeout=1)  # too tight: rank 1 sends at 2 s
    else:
        await asyncio.sleep(2)
        await aiodist.send(x, dst=0)


def test_a_timeout_too_tight_is_no_ring() -> None:
    res = sim.run(_one_is_just_late, world_size=2, seed=0)
    assert res.failures and res.failures[0].cycle == []
    assert "ring" not in str(res.failures[0])
