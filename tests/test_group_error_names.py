"""Errors of a subgroup's operations say which numbering their ranks are in.

Before (blind probe): a group's operation that failed because a rank outside
the group failed said "rank -1 (global rank 0) failed", and a timeout said
"on rank 1" where rank 1 was this rank's group rank (global 2), unmarked.
"""

from __future__ import annotations

import types
from typing import Any

from aiodist.comm.channel import GroupComm
from aiodist.errors import PeerFailureError


def _comm(me: int, ranks: tuple[int, ...]) -> GroupComm:
    return GroupComm(types.SimpleNamespace(rank=me), "g", ranks, name="group 1 (ranks [1, 2, 3])")  # type: ignore[arg-type]


def test_a_failed_rank_outside_the_group_is_named_by_its_global_rank_only() -> None:
    e: Any = _comm(2, (1, 2, 3)).localize(PeerFailureError("x", global_rank=0, how="connection lost"), op="all_reduce", seq=4)
    assert str(e) == "all_reduce (seq 4) of group 1 (ranks [1, 2, 3]): global rank 0 (not a member of group 1 " \
                     "(ranks [1, 2, 3])) failed: connection lost", str(e)
    assert e.rank == -1 and e.global_rank == 0


def test_a_failed_member_is_named_in_both_numberings() -> None:
    e: Any = _comm(2, (1, 2, 3)).localize(PeerFailureError("x", global_rank=3, how="connection lost"), op="barrier", seq=1)
    assert "rank 2 (global rank 3) failed" in str(e) and e.rank == 2


async def _subgroup_timeout() -> Any:
    import asyncio

    import numpy as np

    import aiodist.api as dist

    pg = await dist.init_process_group()
    g = await dist.new_group([1, 2, 3], timeout=1.0)
    if pg.rank == 3:
        await asyncio.sleep(3)
    if pg.rank == 0:
        return None
    try:
        await dist.all_reduce(np.ones(4), group=g)
    except Exception as e:  # noqa: BLE001 - its message is the result
        return str(e)
    return "ok"


def test_a_timeout_names_the_rank_it_happened_on_in_both_numberings() -> None:
    import sim

    res = sim.run(_subgroup_timeout, world_size=4, seed=0, trace=False)
    assert res.ok, res.summary()
    texts = [t for t in res.rank_results[1:3] if t and "timed out" in t]
    assert texts, res.rank_results
    for t in texts:
        assert " on rank 0 (global 1);" in t or " on rank 1 (global 2);" in t, t
